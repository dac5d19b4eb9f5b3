-- Release a maintenance lease only if we still hold it.
-- KEYS: lock
-- ARGV: owner
if redis.call('HGET', KEYS[1], 'o') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
