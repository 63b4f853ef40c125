"""Warm-up's promise, on a real ResNet-18: with ``model_warmup`` for batch sizes 1 to 8, the
first request of each size after READY takes at most 1.5 times that size's steady median;
without it, the first request of some size takes longer than that (checked with a margin:
see the test).

The load compiles the plans of batch sizes 1, 2, 4 and 8 either way, and runs 1 row (the test
inference), so what is left to a first request without warm-up is a plan's first run (its
kernels' jobs bound, numba's kernels loaded) and the plans of other sizes: 1.0 to 2.6 times a
steady request at 112x112 on two cores. On a busy machine one request's time varies as much,
so each side runs TRIALS times, each with a fresh repository and model (a plan's first run is
per model), the two sides in turn so that both meet the same load, and each batch size's
ratio is the median over the trials. A request's time is taken around
``ModelRepository.infer``, the batcher included.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from engine import nd
from engine.gluon.model_zoo.vision import get_model
from engine.serving.manifest import PARAMS_NAME, SYMBOL_NAME
from engine.serving.repository import ModelRepository
from tests.engine.serving.helpers import run

SIDE = 112  # pixels: a run big enough to time (tens of ms), small enough for a busy CI
BATCH_SIZES = range(1, 9)
STEADY_RUNS = 5  # the median of these is the steady time a first request is held against
TRIALS = 5  # fresh repositories (and models) per side
LIMIT = 1.5
WITHOUT_AT_LEAST = 1.3  # see the last check


@pytest.fixture(scope="module")
def resnet_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes]:
    """ResNet-18 v1 (random weights) exported at SIDE x SIDE: symbol and parameter bytes."""
    folder = tmp_path_factory.mktemp("resnet18")
    net = get_model("resnet18_v1", classes=1000)
    net.initialize()
    net.hybridize()
    net(nd.zeros((1, 3, SIDE, SIDE)))
    net.export(str(folder / "resnet"))
    return ((folder / "resnet-symbol.json").read_bytes(),
            (folder / "resnet-0000.params").read_bytes())


def repository(root: Path, files: tuple[bytes, bytes], warmup: list[dict]) -> Path:
    version = root / "resnet" / "1"
    version.mkdir(parents=True)
    (version / SYMBOL_NAME).write_bytes(files[0])
    (version / PARAMS_NAME).write_bytes(files[1])
    config = {"max_batch_size": 8,
              "inputs": [{"name": "data", "datatype": "FP32", "shape": [-1, 3, SIDE, SIDE]}],
              # A lone request runs at once: the time measured is the request's own.
              "dynamic_batching": {"max_queue_delay_us": 0},
              "model_warmup": warmup}
    (root / "resnet" / "config.json").write_text(json.dumps(config))
    return root


def first_and_steady(root: Path, sizes: range) -> dict[int, tuple[float, float]]:
    """For each batch size in turn: the first request's seconds after READY, and the median
    of the next STEADY_RUNS requests of that size."""
    rng = np.random.default_rng(0)

    async def main() -> dict[int, tuple[float, float]]:
        repo = ModelRepository(root, require_manifest=False)
        await repo.start()  # returns once the version is READY
        try:
            assert [status.state for status in repo.index()] == ["READY"]
            times = {}
            for rows in sizes:
                data = rng.random((rows, 3, SIDE, SIDE), dtype=np.float32)
                seconds = []
                for _ in range(1 + STEADY_RUNS):
                    start = time.perf_counter()
                    outputs = await repo.infer("resnet", {"data": data})
                    seconds.append(time.perf_counter() - start)
                    assert next(iter(outputs.values())).shape == (rows, 1000)
                times[rows] = (seconds[0], float(np.median(seconds[1:])))
            return times
        finally:
            await repo.close()

    return run(main(), timeout=900)


def test_the_first_request_after_ready_is_as_fast_as_steady_only_with_warmup(
        tmp_path: Path, resnet_files: tuple[bytes, bytes]) -> None:
    samples = [{"name": f"batch {rows}", "batch_size": rows,
                "inputs": {"data": {"random_data": True}}} for rows in BATCH_SIZES]
    ratios: dict[str, list[dict[int, float]]] = {"without": [], "with": []}
    for trial in range(TRIALS):  # the two sides in turn, so that both meet the same load
        for side, warmup in (("without", []), ("with", samples)):
            root = repository(tmp_path / f"{side}{trial}", resnet_files, warmup)
            ratios[side].append({rows: first / steady for rows, (first, steady)
                                 in first_and_steady(root, BATCH_SIZES).items()})
    # Per batch size, the median over the trials: one request stalled by a busy machine
    # decides nothing.
    typical = {side: {rows: float(np.median([trial[rows] for trial in trials]))
                      for rows in BATCH_SIZES} for side, trials in ratios.items()}
    shown = {side: {rows: round(ratio, 2) for rows, ratio in by_size.items()}
             for side, by_size in typical.items()}
    assert max(typical["with"].values()) <= LIMIT, (
        f"with warm-up, a first request after READY took more than {LIMIT}x its batch "
        f"size's steady median (first / steady, by batch size): {shown}")
    # Without, a plan's first run still binds its kernels' jobs and loads them (the load
    # compiled it): some batch size's first request is slower than the limit. Measured on two
    # busy cores the slowest size's median was 1.6 to 2.6 times steady, so the check leaves a
    # margin (WITHOUT_AT_LEAST) below the limit, and asks for more than warm-up's slowest.
    slowest = max(typical["without"].values())
    assert slowest > WITHOUT_AT_LEAST and slowest > max(typical["with"].values()), (
        f"without warm-up every first request was within {WITHOUT_AT_LEAST}x steady, or no "
        f"slower than with it: {shown}")
