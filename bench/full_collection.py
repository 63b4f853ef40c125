"""The garbage collector's full pass in a server process with ResNet-18 loaded: how long it holds
the GIL (and so the event loop), in thread CPU time, with numba's compiler frozen before the
first load (`service.collector.CompilerFrozenFirst`, what the server does) and without.

Each measurement is a fresh process (freezing is process-wide), the two kinds interleaved: the
server's imports, frozen as its start freezes them, then ResNet-18 v1 at 64x64 (max batch 32)
loaded and validated as an upload is (`load_and_validate`), then `gc.collect()` five times.

    .venv/bin/python bench/full_collection.py              # 3 rounds
    .venv/bin/python bench/full_collection.py --rounds 5
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)] if str(ROOT) not in sys.path else []

PASSES = 5


def measure(frozen_first: bool, directory: Path) -> dict:
    """In this process: the full passes' thread CPU times (ms) and the objects they scan."""
    import service.rest.app  # noqa: F401 - the server's imports
    from engine.serving.config import parse_config
    from engine.serving.manifest import PARAMS_NAME, SYMBOL_NAME
    from engine.serving.validate import default_loader, load_and_validate
    from service.collector import CompilerFrozenFirst

    (directory / SYMBOL_NAME).write_bytes((directory / "resnet-symbol.json").read_bytes())
    (directory / PARAMS_NAME).write_bytes((directory / "resnet-0000.params").read_bytes())
    config = parse_config((directory / "config.json").read_bytes(), "config.json")
    gc.collect()
    gc.freeze()  # as `Runtime.start` does
    loader = CompilerFrozenFirst(default_loader) if frozen_first else default_loader
    validated = load_and_validate(directory, config, device="cpu", where="bench", loader=loader)
    times = []
    for _ in range(PASSES):
        started = time.thread_time()
        gc.collect()
        times.append((time.thread_time() - started) * 1e3)
    scanned = len(gc.get_objects())
    del validated
    return {"frozen_first": frozen_first, "pass_ms_best": round(min(times), 1),
            "pass_ms_median": round(statistics.median(times), 1), "objects_scanned": scanned}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", choices=["frozen", "unfrozen"], help=argparse.SUPPRESS)
    parser.add_argument("--directory", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child == "frozen", args.directory)))
        return
    directory = Path(tempfile.mkdtemp(prefix="full-collection-"))
    # the same export the health benchmark uploads (the sibling module, on the path as this
    # script's folder); here, not in the children, whose imports are what is measured
    from health_during_upload import export_resnet

    export_resnet(directory)
    rows: dict[str, list[dict]] = {"unfrozen": [], "frozen": []}
    for _ in range(args.rounds):
        for kind in rows:
            done = subprocess.run([sys.executable, __file__, "--child", kind, "--directory",
                                   str(directory)], check=True, cwd=ROOT, capture_output=True,
                                  text=True)
            rows[kind].append(json.loads(done.stdout.splitlines()[-1]))
            print(json.dumps(rows[kind][-1]), flush=True)
    for kind, measured in rows.items():
        best = [row["pass_ms_best"] for row in measured]
        print(f"{kind}: a full pass {statistics.median(best):.1f} ms CPU (median of the rounds' "
              f"best, range {min(best)}-{max(best)}), "
              f"{statistics.median(row['objects_scanned'] for row in measured):.0f} objects")


if __name__ == "__main__":
    main()
