-- Drop a processing-index entry whose record is no longer PROCESSING (garbage-collected by
-- Redis), or re-score it from the record's own lease; the decision is taken on the record,
-- in the same atomic step.
-- KEYS: record, processing index
-- Reply: 0 when dropped, 1 when re-scored.
local member = string.sub(KEYS[1], -34, -3)
local v = redis.call('HMGET', KEYS[1], 'st', 'le')
if v[1] ~= 'PROCESSING' then
  redis.call('ZREM', KEYS[2], member)
  return 0
end
redis.call('ZADD', KEYS[2], v[2], member)
return 1
