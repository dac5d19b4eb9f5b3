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

# PgBouncer in transaction mode in front of the PostgreSQL on 5432 (the SQL stores' prepare=False
# tests): an instance of our own, on a fixed loopback port, configured and run as postgres.
PGBOUNCER_PORT=6432
PGBOUNCER_DIR=/var/lib/idempotent-tasks-pgbouncer
start_pgbouncer() {
  if [ ! -x /usr/sbin/pgbouncer ]; then
    echo "services: installing pgbouncer"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y pgbouncer >/dev/null \
      || { apt-get update >/dev/null && apt-get install -y pgbouncer >/dev/null; } || return 1
  fi
  mkdir -p "$PGBOUNCER_DIR"
  cat >"$PGBOUNCER_DIR/pgbouncer.ini" <<EOF
[databases]
test = host=127.0.0.1 port=5432 dbname=test user=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PGBOUNCER_PORT
unix_socket_dir =
auth_type = trust
auth_file = $PGBOUNCER_DIR/userlist.txt
admin_users = postgres
pool_mode = transaction
ignore_startup_parameters = extra_float_digits,options
max_client_conn = 500
default_pool_size = 20
logfile = $PGBOUNCER_DIR/pgbouncer.log
pidfile = $PGBOUNCER_DIR/pgbouncer.pid
EOF
  echo '"postgres" ""' >"$PGBOUNCER_DIR/userlist.txt"
  chown -R postgres:postgres "$PGBOUNCER_DIR"
  su postgres -s /bin/sh -c "/usr/sbin/pgbouncer -d $PGBOUNCER_DIR/pgbouncer.ini"
}

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
if ! up "$PGBOUNCER_PORT"; then
  echo "services: starting PgBouncer"
  start_pgbouncer || true
fi

# A real browser for the dashboard's tests (Debian's Chromium, driven by Playwright).
if ! command -v chromium >/dev/null; then
  echo "services: installing Chromium"
  DEBIAN_FRONTEND=noninteractive apt-get install -y chromium >/dev/null 2>&1 \
    || { apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium >/dev/null; } \
    || echo "services: could NOT install Chromium (the dashboard's browser tests will fail)" >&2
fi

status=0
wait_port PostgreSQL 5432 || status=1
wait_port Redis 6379 || status=1
wait_port RabbitMQ 5672 || status=1
wait_port MariaDB 3306 || status=1
wait_port NATS 4222 || status=1
wait_port PgBouncer "$PGBOUNCER_PORT" || status=1
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
