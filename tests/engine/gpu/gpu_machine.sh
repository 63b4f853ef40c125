#!/usr/bin/env bash
# On a GPU machine without network: run "$@" in a virtual environment that sees the machine's
# CuPy and PyTorch and adds the wheels carried in build/gpu-wheels (see docs/gpu.md).
# Usage: bash tests/engine/gpu/gpu_machine.sh python -m pytest ...
set -euo pipefail
VENV=${HYBRIDSERVE_GPU_VENV:-/tmp/hybridserve-gpu}
WHEELS=build/gpu-wheels
install() { "$VENV/bin/python" -m pip install -q --no-index --no-deps --find-links "$WHEELS" "$@"; }
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv --system-site-packages "$VENV"
    install nvidia-cudnn-frontend pytest pluggy iniconfig packaging pygments
    # Only where the image lacks it: PyTorch may pin its own.
    "$VENV/bin/python" -c "import cuda.bindings" 2>/dev/null || install cuda-bindings
fi
export PATH="$VENV/bin:$PATH"
exec "$@"
