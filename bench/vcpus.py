"""How far apart this machine's first two vCPUs sit now: reading data the other one wrote,
against reading one's own.

On the 2-vCPU VMs this project is measured on, that ratio is about 1.0 for seconds or
minutes, then 1.3-1.9 for as long (the vCPUs then share no cache, docs/threads.md), and in
those stretches every step whose threads read what the other wrote runs slower (ResNet-18 at
batch 1 on both: 16-17 ms, then 24-28). `bench/executor.py` prints it around each every-core
case, so that a reader can tell which kind of minute a row was measured in.

Usage: ``python bench/vcpus.py [seconds]`` prints the ratio once a second.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.cpu import spin_pool  # noqa: E402 - this checkout's engine, found just above

REGION_FLOATS = 1 << 18  # 1 MB per thread: each one's own L2 holds about as much
_jobs: dict[str, Any] = {}


def _tasks() -> tuple[Any, Any]:
    """Numba tasks ``(context, part, parts)``: fill part ``part``'s region of the first array
    (with numbers of its own), and copy region (part + shift) % parts of it, doubled, to
    part's region of the second (context: the arrays' addresses, floats per region, shift)."""
    import numba
    from numba import carray, types
    from numba.extending import intrinsic

    @intrinsic
    def floats_at(typingctx: Any, address: Any) -> Any:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return builder.inttoptr(args[0], context.get_value_type(
                types.CPointer(types.float32)))

        return types.CPointer(types.float32)(types.int64), codegen

    signature = types.void(types.CPointer(types.int64), types.int64, types.int64)

    @numba.cfunc(signature)
    def fill(context: Any, part: int, parts: int) -> None:  # pragma: no cover - compiled
        fields = carray(context, 4)
        count = fields[2]
        region = carray(floats_at(fields[0] + part * count * 4), count)
        for index in range(count):
            region[index] = part * count + index

    @numba.cfunc(signature)
    def copy(context: Any, part: int, parts: int) -> None:  # pragma: no cover - compiled
        fields = carray(context, 4)
        count = fields[2]
        source = carray(floats_at(fields[0] + (part + fields[3]) % parts * count * 4), count)
        target = carray(floats_at(fields[1] + part * count * 4), count)
        for index in range(count):
            target[index] = source[index] * 2.0

    return fill, copy


def cross_read_ratio(rounds: int = 20) -> float | None:
    """Median time to read 1 MB the other thread wrote over one's own, two threads of the
    spin pool; None where there is no pool or a single core."""
    if not spin_pool.available() or spin_pool.cores() < 2:
        return None
    if not _jobs:
        fill, copy = _tasks()
        first, second = (np.zeros(2 * REGION_FLOATS, np.float32) for _ in range(2))
        for name, task, shift in (("fill", fill, 1), ("own", copy, 0), ("cross", copy, 1)):
            context = np.array([first.ctypes.data, second.ctypes.data, REGION_FLOATS, shift],
                               np.int64)
            _jobs[name] = spin_pool.job(task.address, context, 2, keep=(first, second, task))
    times: dict[str, list[float]] = {"own": [], "cross": []}
    with spin_pool.armed(2):
        for _ in range(rounds):
            for name in ("own", "cross"):
                _jobs["fill"]()  # each thread writes its own region
                start = time.perf_counter()
                _jobs[name]()
                times[name].append(time.perf_counter() - start)
    return statistics.median(times["cross"]) / statistics.median(times["own"])


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        ratio = cross_read_ratio()
        print(f"{time.strftime('%H:%M:%S')} other vCPU's data read "
              + ("n/a" if ratio is None else f"×{ratio:.2f}"), flush=True)
        time.sleep(1.0)


if __name__ == "__main__":
    main()
