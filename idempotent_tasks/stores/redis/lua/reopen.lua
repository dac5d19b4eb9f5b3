-- A settled record (SUCCESS or FAILED) of the attempt expected_token becomes a new attempt:
-- PROCESSING with the shard's next token (drawn as take_over.lua draws it), a fresh lease,
-- no response and no expiry, created now, its request hash kept; the retry counter is reset.
-- KEYS: record, counter, processing index, finished index, counter index, token counter
-- ARGV: expected_token, now, lease_expires_at, gc_ms
-- Reply: {the new token}, or 0 when the condition failed (nothing changed).
local member = string.sub(KEYS[1], -34, -3)
local v = redis.call('HMGET', KEYS[1], 'st', 'tk')
if (v[1] ~= 'SUCCESS' and v[1] ~= 'FAILED') or v[2] ~= ARGV[1] then return 0 end
local old, shard = v[2], tonumber(string.sub(member, 1, 2), 16)
local token = string.format('%d%03d', redis.call('INCR', KEYS[6]), shard)
if string.sub(old, 1, 1) ~= '-' and (#old > #token or (#old == #token and old >= token)) then
  redis.call('SET', KEYS[6], #old > 3 and string.sub(old, 1, -4) or '0')
  token = string.format('%d%03d', redis.call('INCR', KEYS[6]), shard)
end
redis.call('HSET', KEYS[1], 'st', 'PROCESSING', 'rs', '', 'tk', token, 'ca', ARGV[2],
  'ua', ARGV[2], 'le', ARGV[3], 'ea', '')
local ttl = math.floor(math.max(tonumber(ARGV[3]) - tonumber(ARGV[2]), 0) * 1000 + tonumber(ARGV[4]))
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('ZREM', KEYS[4], member)
redis.call('ZADD', KEYS[3], ARGV[3], member)
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[5], member)
return {token}
