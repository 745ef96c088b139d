#!/usr/bin/env bash
# nbtrain's GPU acceptance check, one command on a machine with NVIDIA GPUs:
#
#   bash benchmarks/gpu/run.sh [OUT_DIR]        # default OUT_DIR: $OUT, else ./gpu-results
#
# Uses the machine's Python with torch (CUDA), accelerate and transformers. What the check needs
# beyond that (a Jupyter kernel, its client, widgets, nbformat) is installed from wheels in
# benchmarks/gpu/wheels when missing: fetch them with fetch_wheels.sh where there is network.
# nbtrain itself runs from this checkout. Exit code: 0 all passed, 1 a check failed, 2 no GPU
# or missing packages.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-${OUT:-$root/gpu-results}}
PYTHON=${PYTHON:-python3}
wheels=${NBTRAIN_GPU_WHEELS:-$here/wheels}

if ! "$PYTHON" -c "import ipykernel, jupyter_client, ipywidgets, nbformat" 2>/dev/null; then
    if ! ls "$wheels"/*.whl >/dev/null 2>&1; then
        echo "Missing ipykernel/jupyter_client/ipywidgets/nbformat and no wheels in $wheels:" >&2
        echo "run 'bash benchmarks/gpu/fetch_wheels.sh' on a machine with network first." >&2
        exit 2
    fi
    site=${TMPDIR:-/tmp}/nbtrain-gpu-site
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" \
        "$wheels"/*.whl
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$root:$here${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
exec "$PYTHON" "$here/accept.py" --out "$out" "${@:2}"
