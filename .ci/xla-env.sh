#!/usr/bin/env bash
# Create (or update) .venv-xla: torch 2.9.0 + torch_xla 2.9.0 and exactly what tests/xla needs.
# Idempotent: reuses .venv-xla when present; constraints-xla.txt keeps pip off torch.
# Run the tests with: PJRT_DEVICE=CPU .venv-xla/bin/python -m pytest tests/xla
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv-xla/bin/python ]; then
    "$PYTHON" -m venv .venv-xla
fi
PIP=(.venv-xla/bin/python -m pip install -q --no-cache-dir -c constraints-xla.txt)
# torch 2.9.0 from PyPI is the CUDA build (with 4.3 GB of NVIDIA libraries that torch needs to
# import); torch_xla needs exactly this pairing, and PyPI has no CPU-only 2.9.0 for Linux
# (PyTorch's CPU index has one, where reachable). No pip cache: it would hold a second copy.
"${PIP[@]}" 'torch==2.9.0' 'torch-xla==2.9.0'
"${PIP[@]}" -e . pytest pytest-timeout psutil nbclient ipykernel jupyter_client ipywidgets \
    cloudpickle safetensors scikit-learn  # scikit-learn: notebook 6's data (digits)
