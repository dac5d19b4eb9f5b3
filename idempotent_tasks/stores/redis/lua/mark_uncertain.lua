-- PROCESSING + our token -> UNCERTAIN (reconcile could not tell whether the effect
-- happened), keeping the detail as the response ('' keeps none), with no lease and no
-- expiry: the record and its counter (with the recorded steps) wait for an operator, so
-- neither is garbage-collected.  The record leaves the processing index (recovery never
-- sees it) and joins the finished index at +inf (listed, never due for the purge).
-- KEYS: record, counter, processing index, finished index
-- ARGV: token, now, detail
-- Reply: 1 when written, 0 when the condition failed (nothing changed).
local v = redis.call('HMGET', KEYS[1], 'st', 'tk')
if v[1] ~= 'PROCESSING' or v[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'st', 'UNCERTAIN', 'rs', ARGV[3], 'ua', ARGV[2], 'le', '', 'ea', '')
redis.call('PERSIST', KEYS[1])
redis.call('PERSIST', KEYS[2])
local member = string.sub(KEYS[1], -34, -3)
redis.call('ZREM', KEYS[3], member)
redis.call('ZADD', KEYS[4], '+inf', member)
return 1
