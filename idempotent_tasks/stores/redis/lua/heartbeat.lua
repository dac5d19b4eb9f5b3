-- Extend our lease (and updated_at) while we own the record.
-- KEYS: record, processing index
-- ARGV: token, now, lease_expires_at, gc_ms
-- Reply: 1 when extended, 0 when we no longer own the record.
local v = redis.call('HMGET', KEYS[1], 'st', 'tk')
if v[1] ~= 'PROCESSING' or v[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'ua', ARGV[2], 'le', ARGV[3])
local ttl = math.floor(math.max(tonumber(ARGV[3]) - tonumber(ARGV[2]), 0) * 1000 + tonumber(ARGV[4]))
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('ZADD', KEYS[2], ARGV[3], string.sub(KEYS[1], -34, -3))
return 1
