#!/usr/bin/env bash
# Profile the server of bench/gpu_serve.py under load with py-spy, on a GPU machine (docs/gpu.md):
#   bash bench/profile_serve.sh [gpu_serve.py options]     # writes $OUT/spy.txt and a summary
# py-spy travels as a wheel in build/gpu-serve-wheels; RUN replaces the gpu_machine.sh wrapper
# (RUN=env on a machine with the project's environment on PATH). PROFILE_DELAY: seconds from the
# server's start to the profile, which then samples 8 seconds of the load.
set -u
OUT=${OUT:-/tmp/profile-serve}
mkdir -p "$OUT"
RUN=${RUN:-bash tests/engine/gpu/gpu_machine.sh}
$RUN python -c "pass"  # installs the carried wheels first
SPY=$(command -v py-spy || true)
if [ -z "$SPY" ]; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/pyspy \
        build/gpu-serve-wheels/py_spy*.whl && SPY=/tmp/pyspy/bin/py-spy
fi
$RUN python bench/gpu_serve.py "$@" >"$OUT/serve.log" 2>&1 &
bench=$!
pid=""
for _ in $(seq 1 400); do
    pid=$(pgrep -f -- "-m service --model-repository" | head -1)
    [ -n "$pid" ] && break
    sleep 0.5
done
sleep "${PROFILE_DELAY:-30}"
"$SPY" record -p "$pid" -d 8 -r 200 -f raw -o "$OUT/spy.txt" --nonblocking --threads --idle \
    >"$OUT/spy.log" 2>&1
wait "$bench"
grep -E '"rps"|p99|served_over|"mean"' "$OUT/serve.log"
python3 bench/spy_summary.py "$OUT/spy.txt" | tee "$OUT/spy-summary.txt" | head -60
