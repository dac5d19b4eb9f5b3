-- delete_expired for one shard: every key touched shares the shard's hash tag, so this is
-- one atomic step in Redis Cluster too.  Each candidate from the index is re-checked
-- against the record itself; index entries whose key Redis already garbage-collected are
-- dropped.
-- KEYS: finished index, counter index
-- ARGV: now, counters_before, record limit, counter limit, key base ("<prefix>:{<shard>}:")
-- A counter whose scope still has a record is re-scored to the earliest cutoff at which it
-- can go (its own ``ua`` field, not the index score, decides the purge itself).
-- Reply: {records purged, counters purged}
local now, before, base = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[5]
local purged, counters = 0, 0
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
    -- Its counter is judged now, against this call's cutoff: its index score may have been
    -- set under another cutoff (see below) and would then keep it past the one it is due at.
    local ck = base .. m .. ':c'
    local ua = redis.call('HGET', ck, 'ua')
    if ua and tonumber(ua) < before then
      redis.call('DEL', ck)
      redis.call('ZREM', KEYS[2], m)
      counters = counters + 1
    elseif ua then
      redis.call('ZADD', KEYS[2], ua, m)
    end
  else
    redis.call('ZADD', KEYS[1], ea, m)
  end
end
-- Candidates scored up to counters_before inclusive: a counter re-scored (below) to the first
-- cutoff at which it can go has exactly that score when the cutoff comes, and its record may
-- be the one purged just above; the counter's own ``ua`` decides.
local stale = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[2], 'LIMIT', 0, ARGV[4])
for _, m in ipairs(stale) do
  local ck = base .. m .. ':c'
  local ua = redis.call('HGET', ck, 'ua')
  if not ua then
    redis.call('ZREM', KEYS[2], m)
  elseif redis.call('EXISTS', base .. m .. ':r') == 1 then
    -- Its scope still has a record.  A finished record only goes away through this
    -- script (or an unpoison/replacement, which reset the counter), so re-score the
    -- counter to the first cutoff at which it can be purged: once the record expired and
    -- its last change is older than ttl (ttl = now - counters_before).  Never later, or a
    -- scope re-created after its record expired could inherit it.  A PROCESSING record
    -- can be released at any time: its counter keeps its score and is looked at again.
    local ea = redis.call('HGET', base .. m .. ':r', 'ea')
    if ea and ea ~= '' then
      redis.call('ZADD', KEYS[2], math.max(tonumber(ua), tonumber(ea) - (now - before)), m)
    end
  elseif tonumber(ua) < before then
    redis.call('DEL', ck)
    redis.call('ZREM', KEYS[2], m)
    counters = counters + 1
  end
end
return {purged, counters}
