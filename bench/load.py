"""Benchmark: `load_params` on a ~100 MB .params file against a plain read of the same file.

Usage: ``python bench/load.py [--megabytes 100] [--repeat 7]``. Prints the best time of each and
their ratio; the target is a ratio of at most 1.5 (parsing adds almost nothing to the read).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from engine.graph.params import load_params, save_params


def make_file(path: Path, megabytes: int) -> int:
    """Write several float32 arrays totalling about ``megabytes`` MB; return the file size."""
    rng = np.random.default_rng(0)
    per_array = megabytes * 1_000_000 // 8 // 4  # eight arrays of float32
    arrays = {f"arg:layer{index}_weight": rng.standard_normal(per_array, dtype=np.float32)
              .reshape(-1, 250) for index in range(8)}
    arrays["aux:bn_running_mean"] = rng.standard_normal(1000, dtype=np.float32)
    return len(save_params(path, arrays))


def best_of(repeat: int, action: Callable[[], object]) -> float:
    """The fastest of ``repeat`` timed runs, in seconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    """Write the file, time both readers (file in the page cache), print the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=7)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "bench-0000.params"
        size = make_file(path, options.megabytes)

        def plain_read() -> bytes:
            with open(path, "rb") as stream:
                return stream.read()

        loaded = load_params(path)
        assert sum(array.nbytes for array in loaded.arrays) > 0.99 * size
        plain_read()  # warm the page cache
        read_time = best_of(options.repeat, plain_read)
        load_time = best_of(options.repeat, lambda: load_params(path))
        content = plain_read()
        parse_time = best_of(options.repeat, lambda: load_params(content))
    print(f"file size:          {size / 1e6:.1f} MB ({len(loaded.arrays)} arrays)")
    print(f"open().read():      {read_time * 1e3:.1f} ms  ({size / read_time / 1e9:.2f} GB/s)")
    print(f"load_params(path):  {load_time * 1e3:.1f} ms  ({size / load_time / 1e9:.2f} GB/s)")
    print(f"load_params(bytes): {parse_time * 1e3:.2f} ms  (parsing only, file already in memory)")
    print(f"ratio:              {load_time / read_time:.2f}x  (target <= 1.5x)")


if __name__ == "__main__":
    main()
