-- Claim-or-get for one or many scopes, replacing expired records (RedisStore.create_many,
-- and RedisStore.create when claim.lua found the record expired).
-- KEYS, five per claim: record, counter, processing index, finished index, counter index
--   (all five share one hash tag, so one call is valid in Redis Cluster when every claim
--   it carries lives in the same shard).  The index member is the 32 hex digits before
--   the record key's ':r' suffix.
-- ARGV: now, lease_expires_at, gc_ms, then three per claim:
--   encoded scope (Scope.encoded(), collision-free), request_hash, token
-- Reply: one item per claim (a bare item for a single claim, else an array of them):
--   1 = CREATED; 0 = the digest belongs to another scope;
--   otherwise the existing record packed in one string (DUPLICATE), cheaper to read than
--   an array: status \n token \n created_at \n updated_at \n lease_expires_at \n
--   expires_at \n len(request_hash) \n request_hash .. response
-- Expiry is decided by the caller's clock (ARGV now); PEXPIRE is only garbage collection.
local now, lease = ARGV[1], ARGV[2]
local nnow = tonumber(now)
local gc_ttl

local function claim(k, a)
  local rk = KEYS[k + 1]
  local member = string.sub(rk, -34, -3)
  local v = redis.call('HMGET', rk, 'st', 'tk', 'ca', 'ua', 'le', 'ea', 'rh', 'rs', 'sc')
  if v[1] then
    if v[9] ~= ARGV[a + 1] then
      return 0
    end
    if v[6] == '' or tonumber(v[6]) > nnow then
      return table.concat(v, '\n', 1, 6) .. '\n' .. #v[7] .. '\n' .. v[7] .. v[8]
    end
    -- expired: counts as absent; the re-created scope starts with a fresh counter
    redis.call('DEL', KEYS[k + 2])
    redis.call('ZREM', KEYS[k + 4], member)
    redis.call('ZREM', KEYS[k + 5], member)
  end
  redis.call('HSET', rk, 'st', 'PROCESSING', 'rh', ARGV[a + 2], 'rs', '', 'tk', ARGV[a + 3],
    'ca', now, 'ua', now, 'le', lease, 'ea', '', 'sc', ARGV[a + 1])
  gc_ttl = gc_ttl or math.floor(math.max(tonumber(lease) - nnow, 0) * 1000 + tonumber(ARGV[3]))
  redis.call('PEXPIRE', rk, gc_ttl)
  redis.call('ZADD', KEYS[k + 3], lease, member)
  return 1
end

if #KEYS == 5 then
  return claim(0, 3)
end
local out = {}
for i = 0, #KEYS / 5 - 1 do
  out[i + 1] = claim(i * 5, 3 + i * 3)
end
return out
