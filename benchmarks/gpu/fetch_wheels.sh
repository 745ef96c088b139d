#!/usr/bin/env bash
# Download the wheels of requirements.txt for the GPU machine's Python, on a machine that has
# network access, into benchmarks/gpu/wheels (git-ignored), which travels beside run.sh.
#
#   bash benchmarks/gpu/fetch_wheels.sh [PYTHON_VERSION]     # default 3.12
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=${1:-3.12}
dest=${NBTRAIN_GPU_WHEELS:-$here/wheels}
mkdir -p "$dest"
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_26_x86_64 \
           manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$tag")
done
PYTHON=${PYTHON:-python3}
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$version" \
    --implementation cp "${platforms[@]}" -d "$dest" -r "$here/requirements.txt"
echo "$(ls "$dest" | wc -l) wheels in $dest ($(du -sh "$dest" | cut -f1))"
