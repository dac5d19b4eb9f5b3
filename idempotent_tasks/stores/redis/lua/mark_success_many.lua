-- mark_success.lua for many scopes in one call (RedisStore.mark_success_many): one script
-- call per batch instead of one per write (a script call costs the server its own dispatch,
-- and the client one packed command and one reply to read).  Each write is decided exactly
-- as mark_success.lua decides it: PROCESSING + its own token -> SUCCESS with its response;
-- a stale owner changes nothing.
-- KEYS, four per write: record, counter, processing index, finished index (all four share
--   one hash tag, so one call is valid in Redis Cluster when every write it carries lives
--   in the same shard).
-- ARGV: now, gc_ms, then three per write: token, response, expires_at
-- Reply: an array with one item per write: 1 when written, 0 when its condition failed.
local now, gc = ARGV[1], tonumber(ARGV[2])
local nnow = tonumber(now)
local out = {}
for i = 0, #KEYS / 4 - 1 do
  local k, a = i * 4, 2 + i * 3
  local rk = KEYS[k + 1]
  local v = redis.call('HMGET', rk, 'st', 'tk')
  if v[1] ~= 'PROCESSING' or v[2] ~= ARGV[a + 1] then
    out[i + 1] = 0
  else
    local ea = ARGV[a + 3]
    redis.call('HSET', rk, 'st', 'SUCCESS', 'rs', ARGV[a + 2], 'ua', now, 'le', '', 'ea', ea)
    local ttl = math.floor(math.max(tonumber(ea) - nnow, 0) * 1000 + gc)
    redis.call('PEXPIRE', rk, ttl)
    redis.call('PEXPIRE', KEYS[k + 2], ttl)
    local member = string.sub(rk, -34, -3)
    redis.call('ZREM', KEYS[k + 3], member)
    redis.call('ZADD', KEYS[k + 4], ea, member)
    out[i + 1] = 1
  end
end
return out
