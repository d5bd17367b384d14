#!/usr/bin/env bash
# Install everything the test suite needs on a fresh Debian machine, then run it.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
need=""
for pkg in bubblewrap socat fuse2fs fuse3 chromium libcairo2; do dpkg -s "$pkg" >/dev/null 2>&1 || need="$need $pkg"; done
# Node.js (20.19 or newer) builds the JupyterLab extension during pip install; keep a newer one if present
command -v node >/dev/null 2>&1 || need="$need nodejs npm"
if [ -n "$need" ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $need >/dev/null
fi
node -e 'const [a,b]=process.versions.node.split(".").map(Number); process.exit(a>20||(a==20&&b>=19)?0:1)' || {
  echo "scripts/test.sh: Node.js $(node --version) is too old to build the JupyterLab extension; install 20.19 or newer" >&2; exit 1; }
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# uv resolves and installs in a fraction of pip's time (pip took about 4 minutes here, mostly resolving); pip
# remains the way when uv cannot be had or cannot reach the index (it reads no pip configuration)
if ! { .venv/bin/pip install -q --disable-pip-version-check uv &&
       .venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python -e '.[test]'; }; then
  echo "scripts/test.sh: installing with uv failed (above); installing with pip instead" >&2
  .venv/bin/pip install -q --disable-pip-version-check -e '.[test]'
fi
# every module compiled once, now: uv leaves that to the first import unless asked (pip does it), an editable install
# never does, and where PYTHONDONTWRITEBYTECODE is set no import writes it: each of the suite's hundreds of CLI,
# server and worker processes then compiled what it imports from source again (a `workbench sessions`: 3 s of CPU
# instead of 1)
.venv/bin/python -m compileall -q -j 0 workbench
# jsonschema builds an Earley grammar for its IRI formats at import when rfc3987-syntax is installed (jupyter-events
# asks for it): 2 to 5 s of CPU in every Jupyter server, pytest worker and nbformat process the suite starts, and
# nothing here checks an IRI; without it jsonschema leaves those two formats unchecked
.venv/bin/python -m pip uninstall -y -q rfc3987-syntax >/dev/null 2>&1 || true
# lint first (seconds); both it and mypy read pyproject.toml, and mypy runs from .venv so it checks against the
# dependencies installed above
.venv/bin/python -m ruff check workbench || {
  echo "scripts/test.sh: ruff check workbench failed (above); many are fixed by .venv/bin/ruff check --fix workbench" >&2; exit 1; }
# the tests, benchmarks and scripts by pyflakes' rules only (a name used but never defined, an unused import): their
# style is not the product's, but a typo in a test is a test that cannot fail
.venv/bin/python -m ruff check --select F,E9 tests bench scripts || {
  echo "scripts/test.sh: ruff check of tests, bench and scripts failed (above)" >&2; exit 1; }
# mypy's first run takes about a minute of one core: it runs beside the tests (which mostly wait on kernels and
# servers), and its verdict is read after them
mypy_log=$(mktemp)
.venv/bin/python -m mypy workbench > "$mypy_log" 2>&1 &
mypy_pid=$!
trap 'kill "$mypy_pid" 2>/dev/null || true; rm -f "$mypy_log"' EXIT
# several worker processes, each test file whole in one of them (its module fixtures, servers and browser shared
# as written), in the order the suite's conftest gives (the longest first; xdist would start the files with the
# most tests first): most tests wait on kernels, servers and subprocesses (the largest files use a fifth or less
# of their wall time as CPU, their children's included), so twice as many workers as cores finish sooner
# (WORKBENCH_TEST_WORKERS=N for another number, 0 for one process)
workers=(-n "${WORKBENCH_TEST_WORKERS:-4}" --dist loadfile --no-loadscope-reorder)
status=0
.venv/bin/python -m pytest "${workers[@]}" "$@" || status=$?
mypy_status=0
wait "$mypy_pid" || mypy_status=$?
cat "$mypy_log"
if [ "$mypy_status" != 0 ]; then
  echo "scripts/test.sh: mypy workbench failed: the type errors are listed above" >&2
  [ "$status" != 0 ] || status=1
fi
[ "$status" = 0 ] || exit "$status"
# CI runs as root; a researcher's server does not. The whole suite's sandbox, quota, identity and escape tests
# run again as an ordinary user (scripts/unprivileged.sh), where the sandbox has no uid of its own to give. They
# mostly wait (idle timers, kernel deaths), so in four workers, each test file whole in one: 44 s, against 60 s in
# two, on a quiet 2-core machine (conftest collects only their files under `-m isolation`). Run beside the main
# run instead of after it, they made the whole slower: the main run is CPU-bound
if [ "$(id -u)" = 0 ] && [ $# -eq 0 ]; then
  bash scripts/unprivileged.sh -m isolation -n 4 --dist loadfile --no-loadscope-reorder
fi
