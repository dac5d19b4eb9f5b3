-- PROCESSING + our token -> SUCCESS with the response; a stale owner changes nothing.
-- KEYS: record, counter, processing index, finished index
-- ARGV: token, response, now, expires_at, gc_ms
-- Reply: 1 when written, 0 when the condition failed.
local v = redis.call('HMGET', KEYS[1], 'st', 'tk')
if v[1] ~= 'PROCESSING' or v[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'st', 'SUCCESS', 'rs', ARGV[2], 'ua', ARGV[3], 'le', '', 'ea', ARGV[4])
local ttl = math.floor(math.max(tonumber(ARGV[4]) - tonumber(ARGV[3]), 0) * 1000 + tonumber(ARGV[5]))
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
local member = string.sub(KEYS[1], -34, -3)
redis.call('ZREM', KEYS[3], member)
redis.call('ZADD', KEYS[4], ARGV[4], member)
return 1
