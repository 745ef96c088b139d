#!/usr/bin/env bash
# The README's test command: install everything the suite needs on a fresh machine, then run it.
# Idempotent: reuses .venv (and the browser) when already present.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# constraints.txt pins the CPU build of torch so no multi-GB CUDA build is pulled.
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -c constraints.txt -e '.[dev]'

# A real browser for the live-view test (Debian's chromium; playwright cannot download one here).
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi

.venv/bin/python -m ruff check nbtrain tests benchmarks
.venv/bin/python -m mypy
exec .venv/bin/python -m pytest "$@"
