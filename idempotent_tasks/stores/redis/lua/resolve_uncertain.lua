-- An operator resolves an UNCERTAIN record: 'done' -> SUCCESS with the response, 'fail' ->
-- FAILED keeping the detail as its response, both expiring at expires_at ('' = never) and
-- garbage-collected gc_ms after it, counter too (as mark_success.lua); 'retry' -> the
-- record is deleted and the counter, steps included, kept (garbage-collected gc_ms from
-- now, as record_failure.lua), so the next delivery replays the recorded steps.  The
-- fencing token is left as it was.
-- KEYS: record, counter, finished index
-- ARGV: resolution ('done', 'fail' or 'retry'), now, response, expires_at, gc_ms
-- Reply: 1 when resolved, 0 when the record is not UNCERTAIN (nothing changed).
if redis.call('HGET', KEYS[1], 'st') ~= 'UNCERTAIN' then return 0 end
local member = string.sub(KEYS[1], -34, -3)
local gc = tonumber(ARGV[5])
if ARGV[1] == 'retry' then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[3], member)
  redis.call('PEXPIRE', KEYS[2], math.floor(gc))
  return 1
end
if ARGV[1] == 'done' then
  redis.call('HSET', KEYS[1], 'st', 'SUCCESS', 'rs', ARGV[3], 'ua', ARGV[2], 'ea', ARGV[4])
else
  redis.call('HSET', KEYS[1], 'st', 'FAILED', 'ua', ARGV[2], 'ea', ARGV[4])
end
if ARGV[4] == '' then return 1 end -- stays in the finished index at +inf, never expires
local ttl = math.floor(math.max(tonumber(ARGV[4]) - tonumber(ARGV[2]), 0) * 1000 + gc)
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('ZADD', KEYS[3], ARGV[4], member)
return 1
