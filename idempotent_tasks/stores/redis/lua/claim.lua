-- Claim-or-get for one scope: the hot path of RedisStore.create.
-- KEYS: record, processing index, token counter (same hash tag).  The index member is the
--   32 hex digits before the record key's ':r' suffix; its first two are the shard.
-- ARGV: now, lease_expires_at, gc_ms, encoded scope (Scope.encoded()), request_hash
-- Reply: {token} = CREATED (the new attempt's fencing token, as a string: the shard's
--   counter, INCRed here, followed by the shard number in three digits, so tokens grow per
--   scope and are unique across shards); 0 = the digest belongs to another scope; 2 = the
--   record has expired and nothing was changed (replacing it also resets the counter, which
--   this script does not declare: the caller runs claim_many.lua, which re-checks and
--   replaces atomically); otherwise the live record packed in one string (DUPLICATE),
--   cheaper to read than an array: status \n token \n created_at \n updated_at \n
--   lease_expires_at \n expires_at \n len(request_hash) \n request_hash .. response
-- Expiry is decided by the caller's clock (ARGV now); PEXPIRE is only garbage collection.
local rk = KEYS[1]
local v = redis.call('HMGET', rk, 'st', 'tk', 'ca', 'ua', 'le', 'ea', 'rh', 'rs', 'sc')
if v[1] then
  if v[9] ~= ARGV[4] then return 0 end
  if v[6] ~= '' and tonumber(v[6]) <= tonumber(ARGV[1]) then return 2 end
  return table.concat(v, '\n', 1, 6) .. '\n' .. #v[7] .. '\n' .. v[7] .. v[8]
end
local now, lease = ARGV[1], ARGV[2]
local member = string.sub(rk, -34, -3)
local token = string.format('%d%03d', redis.call('INCR', KEYS[3]),
  tonumber(string.sub(member, 1, 2), 16))
redis.call('HSET', rk, 'st', 'PROCESSING', 'rh', ARGV[5], 'rs', '', 'tk', token,
  'ca', now, 'ua', now, 'le', lease, 'ea', '', 'sc', ARGV[4])
redis.call('PEXPIRE', rk, math.floor(math.max(tonumber(lease) - tonumber(now), 0) * 1000 + tonumber(ARGV[3])))
redis.call('ZADD', KEYS[2], lease, member)
return {token}
