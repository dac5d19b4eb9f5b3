-- delete_expired for one shard: every key touched shares the shard's hash tag, so this is
-- one atomic step in Redis Cluster too.  Each candidate from the index is re-checked
-- against the record itself; index entries whose key Redis already garbage-collected are
-- dropped.
-- KEYS: finished index, counter index
-- ARGV: now, counters_before, record limit, counter limit, key base ("<prefix>:{<shard>}:")
-- A counter whose scope still has a record is re-scored to ``now``: it is looked at again
-- one period later (its own ``ua`` field, not the index score, decides).
-- Reply: {records purged, counters purged}
local now, before, base = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[5]
local purged = 0
local members = {}
if tonumber(ARGV[3]) > 0 then
  members = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[3])
end
for _, m in ipairs(members) do
  local rk = base .. m .. ':r'
  local ea = redis.call('HGET', rk, 'ea')
  if not ea or ea == '' then
    redis.call('ZREM', KEYS[1], m)
  elseif tonumber(ea) <= now then
    redis.call('DEL', rk)
    redis.call('ZREM', KEYS[1], m)
    purged = purged + 1
  else
    redis.call('ZADD', KEYS[1], ea, m)
  end
end
local counters = 0
local stale = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[2], 'LIMIT', 0, ARGV[4])
for _, m in ipairs(stale) do
  local ck = base .. m .. ':c'
  local ua = redis.call('HGET', ck, 'ua')
  if not ua then
    redis.call('ZREM', KEYS[2], m)
  elseif redis.call('EXISTS', base .. m .. ':r') == 1 then
    -- its scope still has a record: look again once another full period has passed,
    -- so that long-lived records never crowd other candidates out of the LIMIT window
    redis.call('ZADD', KEYS[2], ARGV[1], m)
  elseif tonumber(ua) < before then
    redis.call('DEL', ck)
    redis.call('ZREM', KEYS[2], m)
    counters = counters + 1
  end
end
return {purged, counters}
