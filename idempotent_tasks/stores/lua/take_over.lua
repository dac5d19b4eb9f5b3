-- Take over a PROCESSING record whose lease expired, counting the crashed attempt.
-- KEYS: record, counter, processing index, counter index
-- ARGV: expected_token, new_token, now, lease_expires_at, gc_ms
-- Reply: the counter after the increment, or -1 when the condition failed (nothing changed).
local member = string.sub(KEYS[1], -34, -3)
local v = redis.call('HMGET', KEYS[1], 'st', 'tk', 'le')
if v[1] ~= 'PROCESSING' or v[2] ~= ARGV[1] then return -1 end
if v[3] ~= '' and tonumber(v[3]) > tonumber(ARGV[3]) then return -1 end
redis.call('HSET', KEYS[1], 'tk', ARGV[2], 'ua', ARGV[3], 'le', ARGV[4])
local ttl = math.floor(math.max(tonumber(ARGV[4]) - tonumber(ARGV[3]), 0) * 1000 + tonumber(ARGV[5]))
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('ZADD', KEYS[3], ARGV[4], member)
local n = redis.call('HINCRBY', KEYS[2], 'n', 1)
redis.call('HSET', KEYS[2], 'ua', ARGV[3])
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('ZADD', KEYS[4], ARGV[3], member)
return n
