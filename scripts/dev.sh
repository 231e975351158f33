#!/usr/bin/env bash
# Run the whole stack on this machine: embedded Redis, gateway, one worker, and the built-in
# scripted model when no provider API key is set. Extra arguments go to `fermix dev`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
exec .venv/bin/fermix dev "$@"
