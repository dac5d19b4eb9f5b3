-- Operator delete: remove the record (only if it has the given status, '' = any).
-- KEYS: record, processing index, finished index
-- ARGV: status
-- Reply: the deleted record's fields (RedisStore FIELDS order), or 0 when nothing was deleted.
local v = redis.call('HMGET', KEYS[1], 'st', 'rh', 'rs', 'tk', 'ca', 'ua', 'le', 'ea', 'sc')
if not v[1] or (ARGV[1] ~= '' and v[1] ~= ARGV[1]) then return 0 end
local member = string.sub(KEYS[1], -34, -3)
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], member)
redis.call('ZREM', KEYS[3], member)
return v
