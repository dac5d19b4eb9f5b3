#!/usr/bin/env bash
# The test suites on a busy machine: CPU-burning processes beside pytest, deadlines scaled.
#   bash .ci/loaded.sh [BURNERS] [pytest args...]      (default: 2 burners, the chaos
#   directory and the integration suites)
# Each burner is a bounded busy loop that ends with this script.
set -uo pipefail
cd "$(dirname "$0")/.."
burners="${1:-2}"
shift || true
targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
  targets=(tests/chaos tests/celery tests/dramatiq tests/consumers tests/faststream tests/taskiq
           tests/outbox tests/http/test_real_servers.py)
fi
pids=()
for _ in $(seq 1 "$burners"); do
  timeout 7200 .venv/bin/python -c "while True: pass" &
  pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
export IDEMPOTENT_TASKS_TEST_TIMEOUT_SCALE="${IDEMPOTENT_TASKS_TEST_TIMEOUT_SCALE:-5}"
.venv/bin/pytest -q "${targets[@]}"
