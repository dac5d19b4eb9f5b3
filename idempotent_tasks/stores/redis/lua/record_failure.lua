-- A transient failure (or a crashed attempt found by recovery), in one atomic step:
-- if PROCESSING + our token (+ lease expired when asked), count it; poison at max_retries,
-- else delete the record so the redelivery runs again.  The counter survives the delete.
-- KEYS: record, counter, processing index, finished index, counter index
-- ARGV: token, now, max_retries, expires_at, only_if_lease_expired ('1'/'0'), gc_ms
-- Reply: {counter, poisoned 1/0}, or -1 when the condition failed (nothing counted).
local v = redis.call('HMGET', KEYS[1], 'st', 'tk', 'le')
if v[1] ~= 'PROCESSING' or v[2] ~= ARGV[1] then return -1 end
if ARGV[5] == '1' and v[3] ~= '' and tonumber(v[3]) > tonumber(ARGV[2]) then return -1 end
local gc = tonumber(ARGV[6])
local member = string.sub(KEYS[1], -34, -3)
local n = redis.call('HINCRBY', KEYS[2], 'n', 1)
redis.call('HSET', KEYS[2], 'ua', ARGV[2])
redis.call('ZADD', KEYS[5], ARGV[2], member)
redis.call('ZREM', KEYS[3], member)
if n >= tonumber(ARGV[3]) then
  redis.call('HSET', KEYS[1], 'st', 'FAILED', 'ua', ARGV[2], 'le', '', 'ea', ARGV[4])
  local ttl = math.floor(math.max(tonumber(ARGV[4]) - tonumber(ARGV[2]), 0) * 1000 + gc)
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[2], ttl)
  redis.call('ZADD', KEYS[4], ARGV[4], member)
  return {n, 1}
end
redis.call('DEL', KEYS[1])
redis.call('PEXPIRE', KEYS[2], math.floor(gc))
return {n, 0}
