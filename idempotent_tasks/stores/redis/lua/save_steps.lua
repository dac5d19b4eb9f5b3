-- Record a scope's steps (ctx.step): the blob is the 's' field of the scope's retry counter,
-- so whatever deletes the counter (replacing an expired record, reopen, unpoison's reset,
-- the purge of stale counters) removes the steps with it, and counting an attempt keeps
-- them.  Written only while the record is PROCESSING with our token (checked in this same
-- atomic step: a takeover that ran first makes this write nothing); a counter made here
-- starts at 0 and joins the counter index like one made by a counted attempt.
-- KEYS: record, counter, counter index (same hash tag)
-- ARGV: token, steps, now, gc_ms
-- Reply: 1 when written, 0 when the condition failed (nothing changed).
local v = redis.call('HMGET', KEYS[1], 'st', 'tk', 'le')
if v[1] ~= 'PROCESSING' or v[2] ~= ARGV[1] then return 0 end
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('HSET', KEYS[2], 'n', 0, 'ua', ARGV[3])
  redis.call('ZADD', KEYS[3], ARGV[3], string.sub(KEYS[1], -34, -3))
end
redis.call('HSET', KEYS[2], 's', ARGV[2])
-- as take_over.lua: the counter outlives the attempt's lease by gc_ttl (never shortened here)
local lease = tonumber(v[3]) or tonumber(ARGV[3])
local ttl = math.floor(math.max(lease - tonumber(ARGV[3]), 0) * 1000 + tonumber(ARGV[4]))
if redis.call('PTTL', KEYS[2]) < ttl then redis.call('PEXPIRE', KEYS[2], ttl) end
return 1
