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
# What is installed is the lock (requirements/dev.txt: every package pinned with its hashes,
# for every platform; scripts/lock.sh writes it from pyproject.toml), then Fermix itself on top
# with no dependencies of its own: CI, images and checkouts install the same releases whatever
# was published upstream since. uv installs it (from PATH, or fetched into the venv by pip in
# a few seconds); plain pip does where uv cannot be had, or with FERMIX_INSTALLER=pip.
lock=requirements/dev.txt
stamp=.venv/.fermix-installed
if [ ! -x .venv/bin/python ] || [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] \
    || [ "$lock" -nt "$stamp" ]; then
  echo "[setup] creating .venv and installing Fermix from $lock (one time)..." >&2
  echo "[setup] 1/3 the virtual environment .venv (made with $PY if missing)" >&2
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  uv="$(command -v uv || true)"
  if [ "${FERMIX_INSTALLER:-}" = pip ]; then
    uv=""
  elif [ -z "$uv" ] && .venv/bin/python -m pip install -q uv >/dev/null 2>&1; then
    uv=.venv/bin/uv
  fi
  # Not -q for the dependencies: the minute they take shows what is being installed.
  echo "[setup] 2/3 installing the pinned dependencies from $lock" >&2
  if [ -n "$uv" ]; then
    # --compile-bytecode: as pip does; else the first start of every process compiles it.
    "$uv" pip install --compile-bytecode --python .venv/bin/python -r "$lock" >&2
    echo "[setup] 3/3 installing Fermix itself (editable)" >&2
    "$uv" pip install -q --python .venv/bin/python --no-deps -e . >&2
  else
    echo "[setup] uv is not available: installing with pip (slower)" >&2
    .venv/bin/python -m pip install -q --upgrade pip >&2
    .venv/bin/python -m pip install -r "$lock" >&2
    echo "[setup] 3/3 installing Fermix itself (editable)" >&2
    .venv/bin/python -m pip install -q --no-deps -e . >&2
  fi
  touch "$stamp"
  echo "[setup] done: .venv is ready" >&2
fi
