-- Operator reset of a retry counter (unpoison): the counter and its index entry go together.
-- KEYS: counter, counter index
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], string.sub(KEYS[1], -34, -3))
return 1
