-- PROCESSING + our token (+ lease expired when asked) -> FAILED (poisoned), keeping the
-- response given with it ('' keeps none).
-- KEYS: record, counter, processing index, finished index
-- ARGV: token, now, expires_at, only_if_lease_expired ('1' or '0'), gc_ms, response
-- Reply: 1 when written, 0 when the condition failed.
local v = redis.call('HMGET', KEYS[1], 'st', 'tk', 'le')
if v[1] ~= 'PROCESSING' or v[2] ~= ARGV[1] then return 0 end
if ARGV[4] == '1' and v[3] ~= '' and tonumber(v[3]) > tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], 'st', 'FAILED', 'rs', ARGV[6] or '', 'ua', ARGV[2], 'le', '', 'ea', ARGV[3])
local ttl = math.floor(math.max(tonumber(ARGV[3]) - tonumber(ARGV[2]), 0) * 1000 + tonumber(ARGV[5]))
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
local member = string.sub(KEYS[1], -34, -3)
redis.call('ZREM', KEYS[3], member)
redis.call('ZADD', KEYS[4], ARGV[3], member)
return 1
