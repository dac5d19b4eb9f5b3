-- Delete the record if PROCESSING + our token; the retry counter is untouched.
-- KEYS: record, processing index
-- ARGV: token
-- Reply: 1 when deleted, 0 when the condition failed.
local v = redis.call('HMGET', KEYS[1], 'st', 'tk')
if v[1] ~= 'PROCESSING' or v[2] ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], string.sub(KEYS[1], -34, -3))
return 1
