# Sourced by the scripts: make .venv with Fermix and its dev tools installed, once, and again
# whenever pyproject.toml changes. Needs only Python 3.11+ (set PYTHON to choose one).
set -euo pipefail
PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "Fermix needs Python 3.11 or newer; '$PY' is $("$PY" --version 2>&1 || echo missing). Set PYTHON=/path/to/python3.11." >&2
  exit 2
fi
# Debian and Ubuntu ship venv without ensurepip (python3-venv): `python3 -m venv` would fail
# half-way, after the message scrolled by.
if [ ! -x .venv/bin/python ] && ! "$PY" -c 'import ensurepip, venv' 2>/dev/null; then
  echo "'$PY' cannot create a virtual environment (its venv or ensurepip module is missing): on Debian or Ubuntu install python3-venv (apt-get install python3-venv), or set PYTHON to a Python 3.11+ that has it." >&2
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
