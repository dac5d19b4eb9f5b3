-- Claim-or-get for one or many scopes, replacing expired records (RedisStore.create_many,
-- and RedisStore.create when claim.lua found the record expired).
-- KEYS, six per claim: record, counter, processing index, finished index, counter index,
--   token counter (all six share one hash tag, so one call is valid in Redis Cluster when
--   every claim it carries lives in the same shard).  The index member is the 32 hex
--   digits before the record key's ':r' suffix; its first two are the shard.
-- ARGV: now, lease_expires_at, gc_ms, then two per claim:
--   encoded scope (Scope.encoded(), collision-free), request_hash
-- Reply: one item per claim (a bare item for a single claim, else an array of them):
--   {token} = CREATED (see claim.lua); 0 = the digest belongs to another scope;
--   otherwise the existing record packed in one string (DUPLICATE), cheaper to read than
--   an array: status \n token \n created_at \n updated_at \n lease_expires_at \n
--   expires_at \n len(request_hash) \n request_hash .. response
-- Expiry is decided by the caller's clock (ARGV now); PEXPIRE is only garbage collection.
local now, lease = ARGV[1], ARGV[2]
local nnow = tonumber(now)
local gc_ttl

-- The next token of the shard: counter .. shard number.  ``old`` is the token of the record
-- being replaced; one written by an earlier version (a random 62-bit number) may exceed
-- the counter, which then moves past it, so tokens still grow per scope.
local function next_token(tkey, member, old)
  local shard = tonumber(string.sub(member, 1, 2), 16)
  local t = string.format('%d%03d', redis.call('INCR', tkey), shard)
  if old and string.sub(old, 1, 1) ~= '-' and (#old > #t or (#old == #t and old >= t)) then
    redis.call('SET', tkey, #old > 3 and string.sub(old, 1, -4) or '0')
    t = string.format('%d%03d', redis.call('INCR', tkey), shard)
  end
  return t
end

local function claim(k, a)
  local rk = KEYS[k + 1]
  local member = string.sub(rk, -34, -3)
  local old
  -- EXISTS first: a batch's scopes are mostly new, and HMGET of a missing key still builds
  -- a reply of nine nils (for speed: ~12% of a new scope's server instructions)
  if redis.call('EXISTS', rk) == 1 then
    local v = redis.call('HMGET', rk, 'st', 'tk', 'ca', 'ua', 'le', 'ea', 'rh', 'rs', 'sc')
    if v[9] ~= ARGV[a + 1] then
      return 0
    end
    if v[6] == '' or tonumber(v[6]) > nnow then
      return table.concat(v, '\n', 1, 6) .. '\n' .. #v[7] .. '\n' .. v[7] .. v[8]
    end
    -- expired: counts as absent; the re-created scope starts with a fresh counter
    old = v[2]
    redis.call('DEL', KEYS[k + 2])
    redis.call('ZREM', KEYS[k + 4], member)
    redis.call('ZREM', KEYS[k + 5], member)
  end
  local token = next_token(KEYS[k + 6], member, old)
  redis.call('HSET', rk, 'st', 'PROCESSING', 'rh', ARGV[a + 2], 'rs', '', 'tk', token,
    'ca', now, 'ua', now, 'le', lease, 'ea', '', 'sc', ARGV[a + 1])
  gc_ttl = gc_ttl or math.floor(math.max(tonumber(lease) - nnow, 0) * 1000 + tonumber(ARGV[3]))
  redis.call('PEXPIRE', rk, gc_ttl)
  redis.call('ZADD', KEYS[k + 3], lease, member)
  return {token}
end

if #KEYS == 6 then
  return claim(0, 3)
end
local out = {}
for i = 0, #KEYS / 6 - 1 do
  out[i + 1] = claim(i * 6, 3 + i * 2)
end
return out
