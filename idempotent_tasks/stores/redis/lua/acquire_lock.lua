-- A named maintenance lease: take it if free, expired (by the caller's clock) or ours.
-- KEYS: lock
-- ARGV: owner, now, until, gc_ms
local v = redis.call('HMGET', KEYS[1], 'o', 'x')
if v[1] and v[1] ~= ARGV[1] and tonumber(v[2]) > tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], 'o', ARGV[1], 'x', ARGV[3])
local ttl = math.floor(math.max(tonumber(ARGV[3]) - tonumber(ARGV[2]), 0) * 1000 + tonumber(ARGV[4]))
redis.call('PEXPIRE', KEYS[1], ttl)
return 1
