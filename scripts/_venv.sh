# Sourced by the scripts: make .venv with Fermix and its dev tools installed, once, and again
# whenever pyproject.toml changes. Needs only Python 3.11+ (set PYTHON to choose one).
set -euo pipefail
PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "Fermix needs Python 3.11 or newer; '$PY' is $("$PY" --version 2>&1 || echo missing). Set PYTHON=/path/to/python3.11." >&2
  exit 2
fi
stamp=.venv/.fermix-installed
if [ ! -x .venv/bin/python ] || [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "[setup] creating .venv and installing Fermix (one time)..." >&2
  "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip >&2
  .venv/bin/python -m pip install -q -e ".[dev]" >&2
  touch "$stamp"
fi
