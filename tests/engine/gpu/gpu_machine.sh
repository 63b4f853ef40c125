#!/usr/bin/env bash
# On a GPU machine without network: run "$@" with the machine's Python (the one that holds its
# CuPy and PyTorch) plus the wheels carried in build/gpu-wheels (see docs/gpu.md).
# The image's Python is itself a virtual environment, so a `--system-site-packages` venv would not
# see its packages: the wheels go into a target folder on PYTHONPATH instead.
# Usage: bash tests/engine/gpu/gpu_machine.sh python -m pytest ...
set -euo pipefail
SITE=${HYBRIDSERVE_GPU_SITE:-/tmp/hybridserve-gpu-site}
WHEELS=build/gpu-wheels
PYTHON=$(command -v python3)
install() {
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" --find-links "$WHEELS" "$@"
}
if [ ! -d "$SITE" ]; then
    install nvidia-cudnn-frontend pytest pluggy iniconfig packaging pygments
    # Only where the image lacks it: PyTorch may pin its own.
    "$PYTHON" -c "import cuda.bindings" 2>/dev/null || install cuda-bindings
    # The server's own dependencies, for bench/gpu_serve.py (see docs/gpu.md), when carried.
    if [ -d build/gpu-serve-wheels ]; then
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" \
            build/gpu-serve-wheels/*.whl
    fi
fi
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
# The image's own pytest plugins were built for its pytest, not the carried one.
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
# `python` in "$@" means that Python; a script, not a link, since a link would leave its venv.
shim=$(mktemp -d)
printf '#!/bin/sh\nexec "%s" "$@"\n' "$PYTHON" >"$shim/python"
chmod +x "$shim/python"
export PATH="$shim:$PATH"
exec "$@"
