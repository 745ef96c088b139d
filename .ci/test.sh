#!/usr/bin/env bash
# The README's test command: install everything the suite needs on a fresh machine, then run it.
# Idempotent: reuses .venv (and the browser) when already present.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# constraints.txt pins torch 2.13.0 (pip prefers a CPU build 2.13.0+cpu where one is offered).
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q --no-cache-dir -c constraints.txt -e '.[dev,trackers,ray]'

# A real browser for the live-view test (Debian's chromium; playwright cannot download one here):
# about 110 Debian packages, 420-460 MB. NBTRAIN_SKIP_BROWSER=1 leaves it and the browser tests out.
if [ "${NBTRAIN_SKIP_BROWSER:-0}" != 1 ] && [ ! -x /usr/bin/chromium ] \
    && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi

# torch_xla pairs with its own torch release, so the TPU tests (torch_xla's CPU backend) run
# in a second venv. NBTRAIN_SKIP_XLA=1 leaves them out (they are then reported as skipped).
if [ "${NBTRAIN_SKIP_XLA:-0}" != 1 ]; then
    bash .ci/xla-env.sh
fi

.venv/bin/python -m ruff check nbtrain tests benchmarks .ci
.venv/bin/python -m mypy

status=0
.venv/bin/python -m pytest "$@" || status=$?
if [ "${NBTRAIN_SKIP_XLA:-0}" != 1 ]; then
    PJRT_DEVICE=CPU .venv-xla/bin/python -m pytest -q tests/xla || status=$?
fi
exit "$status"
