#!/usr/bin/env bash
# The lower bounds in pyproject.toml, proved: a venv of their own (.venv-min) with every direct
# dependency at the lowest release its range admits (requirements/minimum.txt, written by
# scripts/lock.sh; the dev tools stay at the dev lock's releases), then the tests that start no
# process and the end-to-end turn tests. Extra arguments go to pytest instead.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh   # uv, and the dev lock the minimum lock was written beside
uv="$(command -v uv || echo .venv/bin/uv)"
stamp=.venv-min/.fermix-installed
if [ ! -x .venv-min/bin/python ] || [ ! -f "$stamp" ] || [ requirements/minimum.txt -nt "$stamp" ]; then
  echo "[setup] creating .venv-min with the lowest releases pyproject.toml admits..." >&2
  rm -rf .venv-min
  "$uv" venv -q --python "$(.venv/bin/python -c 'import sys; print(sys.executable)')" .venv-min
  "$uv" pip install -q --compile-bytecode --python .venv-min/bin/python -r requirements/minimum.txt >&2
  "$uv" pip install -q --python .venv-min/bin/python --no-deps -e . >&2
  touch "$stamp"
fi
if [ $# -eq 0 ]; then
  set -- -m "not fleet" -n 2 --dist loadfile
fi
FERMIX_LOCK=minimum.txt exec .venv-min/bin/python -m pytest -q -p no:cacheprovider "$@"
