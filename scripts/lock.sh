#!/usr/bin/env bash
# Write the lock from pyproject.toml: requirements/dev.txt (Fermix with its dev tools: what
# scripts/_venv.sh and CI install) and requirements/runtime.txt (what the image installs, the
# same releases), and requirements/minimum.txt (every direct dependency at the lowest release
# its range admits, for scripts/test-minimum.sh; the dev tools at the dev lock's). One resolution for every platform and Python 3.11+, each file's hashes
# checked at install. Extra arguments go to `uv pip compile`:
#   bash scripts/lock.sh                          # after editing pyproject.toml: add what is new
#   bash scripts/lock.sh --upgrade-package celery # move one package to its newest release
#   bash scripts/lock.sh --upgrade                # move everything (then run the tests)
#   bash scripts/lock.sh --check                  # exit 1 if the lock is out of date
# docs/development.md has the dependency policy.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
uv="$(command -v uv || echo .venv/bin/uv)"
[ -x "$uv" ] || .venv/bin/python -m pip install -q uv >&2
# The dev tools' pins from the dev lock, as constraints for the minimum lock.
dev_tools() {
  .venv/bin/python - "$1" <<'PY'
import re, sys, tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as name
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
runtime = {name(Requirement(r).name) for r in p["dependencies"]}
pins = {name(m[1]): m[2] for m in re.finditer(r"^([A-Za-z0-9._-]+)==([^\s;\\]+)", open(sys.argv[1]).read(), re.M)}
for r in p["optional-dependencies"]["dev"]:
    if name(Requirement(r).name) not in runtime:
        print(f"{name(Requirement(r).name)}=={pins[name(Requirement(r).name)]}")
PY
}
minimum() {
  local tools=requirements/.dev-tools.txt  # one name: the lock's comments cite it
  dev_tools "$1" > "$tools"
  # Written afresh: an existing file's pins would be taken as preferences, above the lowest.
  rm -f "$2"
  "$uv" pip compile -q pyproject.toml --extra dev --resolution lowest-direct --python-version 3.11 \
    --custom-compile-command "bash scripts/lock.sh" -c "$tools" -o "$2"
  rm -f "$tools"
}
compile() {
  "$uv" pip compile -q pyproject.toml --universal --generate-hashes --python-version 3.11 \
    --custom-compile-command "bash scripts/lock.sh" "$@"
}
if [ "${1:-}" = "--check" ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  cp requirements/dev.txt requirements/runtime.txt "$tmp/"  # its pins are the preferences
  compile --extra dev -o "$tmp/dev.txt"
  compile -c requirements/dev.txt -o "$tmp/runtime.txt"
  minimum requirements/dev.txt "$tmp/minimum.txt"
  if ! diff -q requirements/dev.txt "$tmp/dev.txt" >/dev/null \
      || ! diff -q requirements/runtime.txt "$tmp/runtime.txt" >/dev/null \
      || ! diff -q requirements/minimum.txt "$tmp/minimum.txt" >/dev/null; then
    echo "The lock is out of date with pyproject.toml: run bash scripts/lock.sh and commit requirements/." >&2
    exit 1
  fi
  exit 0
fi
compile --extra dev -o requirements/dev.txt "$@"
compile -c requirements/dev.txt -o requirements/runtime.txt
minimum requirements/dev.txt requirements/minimum.txt
echo "requirements/dev.txt, runtime.txt and minimum.txt written; run the tests, then commit them." >&2
