"""The event loop's CPU per request, in process: the app driven with raw ASGI messages.

No sockets and no server: each request is one ``await app(scope, receive, send)`` with a
pre-built scope and body, and the figure is the main thread's CPU time (`time.thread_time`)
per request, the median of ``--repeats`` repetitions. Compute threads are not counted, so
``full`` measures what a request costs the event loop, the part that bounds requests/s once
the loop is saturated (the seed MLP at concurrency 64).

- ``front``: `InferenceService` replaced by a stub answering at once, so only the front end
  counts (layers, routing, body reading, the reply): the health probe, ``/predict`` and V2
  infer.
- ``full``: ``/predict`` of the seed MLP, ``--concurrency`` requests at a time (dynamic
  batching as served).

Another commit's app is measured by pointing ``--root`` at its checkout (a ``git worktree``);
the script itself only needs `create_app(runtime)` and ``InferenceService.predict/infer_v2``:

    .venv/bin/python bench/asgi_overhead.py                        # this checkout
    .venv/bin/python bench/asgi_overhead.py --root ../hybridserve-old  # another commit's worktree
    .venv/bin/python bench/asgi_overhead.py --profile front-predict # cProfile, top 25
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MLP = "seed_mlp"
Driver = Callable[[int], Awaitable[None]]


class StubInference:
    """Answers `/predict` and V2 infer at once with a small fixed reply."""

    async def predict(self, *args: Any) -> dict[str, Any]:
        return {"model": MLP, "version": 1, "outputs": {"out": [[0.5, 0.25]]}}

    async def infer_v2(self, *args: Any) -> tuple[bytes, None]:
        return b'{"model_name":"seed_mlp","outputs":[]}', None

    def close(self) -> None:
        """Nothing to release."""


def scope_of(method: str, path: str, body: bytes) -> dict[str, Any]:
    """A scope as uvicorn's httptools protocol builds it."""
    headers = [(b"host", b"127.0.0.1:8000"), (b"user-agent", b"bench"),
               (b"content-type", b"application/json")]
    if method == "POST":
        headers.append((b"content-length", str(len(body)).encode()))
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5000),
            "scheme": "http", "method": method, "root_path": "", "path": path,
            "raw_path": path.encode(), "query_string": b"", "headers": headers, "state": {}}


def driver(app: Any, method: str, path: str, body: bytes, concurrency: int) -> Driver:
    """A coroutine function running `count` requests, `concurrency` at a time."""
    message = {"type": "http.request", "body": body, "more_body": False}

    async def receive() -> dict[str, Any]:
        return message

    async def one() -> None:
        statuses: list[int] = []

        async def send(sent: dict[str, Any]) -> None:
            if sent["type"] == "http.response.start":
                statuses.append(sent["status"])

        await app(scope_of(method, path, body), receive, send)
        if statuses != [200]:
            raise RuntimeError(f"{method} {path} answered {statuses}")

    async def run(count: int) -> None:
        if concurrency == 1:
            for _ in range(count):
                await one()
            return
        for _ in range(count // concurrency):
            await asyncio.gather(*(one() for _ in range(concurrency)))

    return run


async def cpu_per_request(run: Driver, count: int, repeats: int) -> tuple[float, float]:
    """Median CPU µs per request over `repeats` runs of `count` requests: the main thread's
    (the event loop) and the whole process's (compute threads too)."""
    await run(count // 4)  # warm: plans compiled, caches filled
    loop, process = [], []
    for _ in range(repeats):
        started = time.thread_time(), time.process_time()
        await run(count)
        loop.append((time.thread_time() - started[0]) / count * 1e6)
        process.append((time.process_time() - started[1]) / count * 1e6)
    return statistics.median(loop), statistics.median(process)


def cases(app: Any, mlp_body: bytes, concurrency: int) -> dict[str, tuple[Driver, int]]:
    """Each case's driver and number of requests per repetition."""
    v2 = b'{"inputs":[{"name":"data","datatype":"FP32","shape":[1,1],"data":[0.5]}]}'
    return {
        "front-live": (driver(app, "GET", "/v2/health/live", b"", 1), 20000),
        "front-predict": (driver(app, "POST", "/predict", mlp_body, 1), 10000),
        "front-v2-infer": (driver(app, "POST", f"/v2/models/{MLP}/infer", v2, 1), 10000),
        "full-predict": (driver(app, "POST", "/predict", mlp_body, concurrency), 4000),
    }


async def measure(args: argparse.Namespace, directory: Path
                  ) -> dict[str, tuple[float, float]]:
    """Start the app over a repository holding the seed MLP and measure each case."""
    import numpy as np
    import orjson

    try:
        from service.rest.app import create_app
    except ImportError:  # a checkout from before service/rest (#35)
        from service.app import create_app  # type: ignore[no-redef]
    from service.runtime import Runtime
    from service.settings import Settings
    from tests.conformance.fixtures import model_files
    from tests.service.helpers import config_for

    runtime = Runtime.create(Settings(model_repository=directory, admin_token="bench"))
    real = runtime.inference
    app = create_app(runtime)
    data = np.random.default_rng(0).random((1, 512), dtype=np.float32)
    mlp_body = orjson.dumps({"model": MLP, "inputs": {"data": data.tolist()}})
    figures = {}
    async with app.router.lifespan_context(app):
        symbol, params = model_files(MLP)
        await runtime.repository.add_version(MLP, symbol.read_bytes(), params.read_bytes(),
                                             config=config_for(MLP))
        for name, (run, count) in cases(app, mlp_body, args.concurrency).items():
            if args.only and name not in args.only:
                continue
            stub = name.startswith("front")
            runtime.inference = StubInference() if stub else real
            _rebind_lane(app, runtime)
            count = max(args.concurrency, int(count * args.scale))
            if args.profile == name:
                await profile(run, count)
                continue
            figures[name] = await cpu_per_request(run, count, args.repeats)
        runtime.inference = real
    return figures


def _rebind_lane(app: Any, runtime: Any) -> None:
    """Commits whose app answered inference on a fast lane in front of FastAPI kept the
    inference service there too: swap it there as well."""
    lane = getattr(app, "lane", None)
    if lane is not None:
        lane.inference = runtime.inference


async def profile(run: Driver, count: int) -> None:
    """cProfile of `count` requests after a warm-up: the 25 costliest functions by own time."""
    await run(count // 4)
    profiler = cProfile.Profile()
    profiler.enable()
    await run(count)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def main() -> None:
    """Parse options, measure, print one line per case."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to measure")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--scale", type=float, default=1.0, help="requests per repetition, "
                        "relative to the defaults")
    parser.add_argument("--concurrency", type=int, default=16, help="for full-predict")
    parser.add_argument("--only", nargs="*", help="cases to run (default: all)")
    parser.add_argument("--profile", help="profile this case instead of timing it")
    args = parser.parse_args()
    sys.path.insert(0, str(args.root.resolve()))
    import uvloop

    with tempfile.TemporaryDirectory() as directory:
        figures = uvloop.run(measure(args, Path(directory)))
    import service

    print(f"checkout: {Path(service.__file__).resolve().parents[1]}")
    print(f"{'case':<16} {'loop µs':>8} {'process µs':>11}  (CPU per request)")
    for name, (loop, process) in figures.items():
        print(f"{name:<16} {loop:8.2f} {process:11.2f}")


if __name__ == "__main__":
    main()
