#!/usr/bin/env bash
# Install everything the test suite needs on a fresh Debian machine, then run it.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
need=""  # nodejs (20.19 or newer) builds the JupyterLab extension during pip install
for pkg in bubblewrap socat chromium nodejs; do dpkg -s "$pkg" >/dev/null 2>&1 || need="$need $pkg"; done
if [ -n "$need" ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $need >/dev/null
fi
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -e '.[test]'
exec .venv/bin/python -m pytest "$@"
