#!/usr/bin/env bash
# Run the test suite. It starts its own private redis-server, scripted LLM, gateways and
# workers on free ports: no Docker, no system Redis, no API key. Extra arguments go to pytest.
# Two test processes by default (FERMIX_TEST_PROCESSES; 0 = one, in this process): the fleet
# tests mostly wait on the processes they start, and each test process has its own
# redis-server and scripted LLM. --dist loadfile keeps a module (and its stack) in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
procs="${FERMIX_TEST_PROCESSES:-2}"
if [ "$procs" = "0" ]; then
  exec .venv/bin/python -m pytest -q "$@"
fi
exec .venv/bin/python -m pytest -q -n "$procs" --dist loadfile "$@"
