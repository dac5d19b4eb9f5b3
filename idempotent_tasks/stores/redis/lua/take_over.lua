-- Take over a PROCESSING record whose lease expired, counting the crashed attempt; the new
-- attempt gets the shard's next token (see claim.lua).
-- KEYS: record, counter, processing index, counter index, token counter
-- ARGV: expected_token, now, lease_expires_at, gc_ms
-- Reply: {the counter after the increment, the new token}, or -1 when the condition failed
--   (nothing changed).
local member = string.sub(KEYS[1], -34, -3)
local v = redis.call('HMGET', KEYS[1], 'st', 'tk', 'le')
if v[1] ~= 'PROCESSING' or v[2] ~= ARGV[1] then return -1 end
if v[3] ~= '' and tonumber(v[3]) > tonumber(ARGV[2]) then return -1 end
-- A token written by an earlier version (a random 62-bit number) may exceed the counter,
-- which then moves past it, so tokens still grow per scope.
local old, shard = v[2], tonumber(string.sub(member, 1, 2), 16)
local token = string.format('%d%03d', redis.call('INCR', KEYS[5]), shard)
if string.sub(old, 1, 1) ~= '-' and (#old > #token or (#old == #token and old >= token)) then
  redis.call('SET', KEYS[5], #old > 3 and string.sub(old, 1, -4) or '0')
  token = string.format('%d%03d', redis.call('INCR', KEYS[5]), shard)
end
redis.call('HSET', KEYS[1], 'tk', token, 'ua', ARGV[2], 'le', ARGV[3])
local ttl = math.floor(math.max(tonumber(ARGV[3]) - tonumber(ARGV[2]), 0) * 1000 + tonumber(ARGV[4]))
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('ZADD', KEYS[3], ARGV[3], member)
local n = redis.call('HINCRBY', KEYS[2], 'n', 1)
redis.call('HSET', KEYS[2], 'ua', ARGV[2])
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('ZADD', KEYS[4], ARGV[2], member)
return {n, token}
