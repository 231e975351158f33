#!/usr/bin/env bash
# Run the test suite. It starts its own private redis-server, scripted LLM, gateways and
# workers on free ports: no Docker, no system Redis, no API key. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
exec .venv/bin/python -m pytest -q "$@"
