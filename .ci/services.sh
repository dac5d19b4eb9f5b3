#!/usr/bin/env bash
# Make sure every service the tests need is up; start it with the documented command if not.
set -uo pipefail

wait_port() {  # name port
  for _ in $(seq 1 60); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$2") 2>/dev/null; then
      echo "services: $1 is up on 127.0.0.1:$2"
      return 0
    fi
    sleep 1
  done
  echo "services: $1 did NOT come up on 127.0.0.1:$2" >&2
  return 1
}

up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

if ! up 5432; then
  echo "services: starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start || true
fi
if ! up 6379; then
  echo "services: starting Redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log || true
fi
if ! up 5672; then
  echo "services: starting RabbitMQ"
  rabbitmq-server -detached || true
fi
if ! up 3306; then
  echo "services: starting MariaDB"
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd || true
fi
if ! up 4222; then
  echo "services: starting NATS (JetStream)"
  mkdir -p /var/lib/nats-server
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
    -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log || true
fi

status=0
wait_port PostgreSQL 5432 || status=1
wait_port Redis 6379 || status=1
wait_port RabbitMQ 5672 || status=1
wait_port MariaDB 3306 || status=1
wait_port NATS 4222 || status=1
if [ "$status" -eq 0 ]; then
  # RabbitMQ accepts TCP before the AMQP app is ready; wait for it properly.
  for _ in $(seq 1 60); do
    rabbitmqctl -q await_startup >/dev/null 2>&1 && break
    sleep 1
  done
  for _ in $(seq 1 30); do
    pg_isready -q -h 127.0.0.1 -p 5432 && break
    sleep 1
  done
fi
exit $status
