"""Images in against tensors in: ResNet-18 served with JPEG photos or with pre-decoded floats.

One server process (`python -m service`), one ResNet-18 v1 (`bench/nets.py`, seeded random
weights) uploaded with ``"preprocess": "imagenet"`` on its input, so that the same model takes
both kinds of request (docs/preprocessing.md, "Tensors still work"):

- ``tensors``: a V2 binary request with a float32 ``[1, 3, 224, 224]`` tensor (588 KiB), as a
  client that decodes and preprocesses itself sends it;
- ``images``: a V2 binary request with a ``BYTES`` ``[1]`` tensor holding one 500x375 JPEG
  photo (`bench/photos.py`, ~50 KiB); connection *i* sends photo *i* mod 12. The server
  decodes, resizes, crops and normalises it on its image pool.

Both at the same concurrency (16), with `bench/serve.py`'s load generator in its own process.
The machine's speed drifts over minutes (other processes share its two cores), so the runs go
tensors, images, images, tensors (``--rounds N``: that N times), which cancels a steady drift,
and each kind's images/s is the mean of its runs. The target (issue #25): images reach at
least 85% of tensors' images/s.
Beside it, the server process's CPU time per image (all its threads, read from /proc during
the measured seconds), which other processes' load changes far less than the rate, and the
mean rows per batch (from ``/metrics``, warm-up included).

    .venv/bin/python bench/serve_images.py               # ~2.5 minutes
    .venv/bin/python bench/serve_images.py --rounds 3 --seconds 10 --warmup 3
    .venv/bin/python bench/serve_images.py --seconds 10 --image-threads 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)] if str(ROOT) not in sys.path else []
from bench import serve  # noqa: E402
from bench.photos import sample_jpegs  # noqa: E402

MODEL = "resnet18"
TARGET = 0.85


def resnet18_upload() -> dict[str, bytes]:
    """ResNet-18 v1's files and a config whose input takes images through ``imagenet``."""
    from bench import nets
    from engine.graph.params import save_params

    symbol = nets.resnet18_v1()
    params = nets.random_params(symbol, (1, 3, 224, 224))
    aux = set(symbol.list_auxiliary_states())
    params_bytes = save_params(None, {f"{'aux' if name in aux else 'arg'}:{name}": value
                                      for name, value in params.items() if name != "data"})
    config = {"inputs": [{"name": "data", "datatype": "FP32", "shape": [-1, 3, 224, 224],
                          "preprocess": "imagenet"}],
              "max_batch_size": 16,
              # As bench/serve.py's ResNet-18: callers come back 1-2 ms after their batch.
              "dynamic_batching": {"max_queue_delay_us": 2000}}
    return {"symbol": symbol.tojson().encode(), "params": params_bytes,
            "config": json.dumps(config).encode()}


def image_request(photo: bytes) -> bytes:
    """A V2 binary request sending `photo` as one BYTES element (4-byte length, then bytes)."""
    element = len(photo).to_bytes(4, "little") + photo
    header = json.dumps({"inputs": [{"name": "data", "datatype": "BYTES", "shape": [1],
                                     "parameters": {"binary_data_size": len(element)}}],
                         "parameters": {"binary_data_output": True}}).encode()
    return serve.http_request("POST", f"/v2/models/{MODEL}/infer", header + element,
                              {"Inference-Header-Content-Length": str(len(header)),
                               "Content-Type": "application/octet-stream"})


def tensor_request() -> bytes:
    """A V2 binary request with one float32 row: what `imagenet` makes of a photo."""
    row = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    return serve.v2_binary_request(MODEL, row)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far, all threads (Linux; else NaN)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _load(url: str, requests: list[bytes], concurrency: int, seconds: float,
                warmup: float, server_pid: int) -> dict[str, Any]:
    """`serve._load`, with connection *i* sending ``requests[i % len(requests)]``, and the
    server's CPU time per answered request over the measured seconds."""
    host, port = url.removeprefix("http://").split(":")
    start = time.perf_counter()
    warm_until, stop_at = start + warmup, start + warmup + seconds
    latencies: list[float] = []
    failures: list[int] = []

    async def cpu_when_warm() -> float:
        await asyncio.sleep(warmup)
        return cpu_seconds(server_pid)

    cpu_start = asyncio.create_task(cpu_when_warm())
    await asyncio.gather(*(serve._connection(host, int(port), requests[index % len(requests)],
                                             stop_at, warm_until, latencies, failures)
                           for index in range(concurrency)))
    cpu = cpu_seconds(server_pid) - await cpu_start
    summary = serve._summary(latencies, failures, time.perf_counter() - warm_until)
    return {**summary, "server_cpu_ms": 1e3 * cpu / max(1, len(latencies))}


def run_load(url: str, files: list[Path], concurrency: int, seconds: float,
             warmup: float, server_pid: int) -> dict[str, Any]:
    """This script's load role in its own process; its JSON result."""
    command = [sys.executable, __file__, "--load", url, str(concurrency), str(seconds),
               str(warmup), str(server_pid), *map(str, files)]
    output = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT,
                            timeout=seconds + warmup + 120)
    return json.loads(output.stdout)


def batch_totals(url: str) -> tuple[float, float]:
    """ResNet-18's batches run and rows batched so far, from ``GET /metrics``."""
    import httpx

    totals = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        name, _, value = line.rpartition(" ")
        if f'model="{MODEL}"' in name and name.startswith(("hybridserve_batch_size_sum",
                                                            "hybridserve_batch_size_count")):
            totals[name.split("{")[0]] = float(value)
    return totals["hybridserve_batch_size_count"], totals["hybridserve_batch_size_sum"]


def upload(url: str, files: dict[str, bytes]) -> None:
    import httpx

    response = httpx.post(f"{url}/models/{MODEL}",
                          headers={"Authorization": f"Bearer {serve.TOKEN}"},
                          files={name: (name, data) for name, data in files.items()},
                          timeout=300)
    response.raise_for_status()


def request_files(work: Path) -> dict[str, list[Path]]:
    """The pre-encoded requests of each kind, written to files for the load process."""
    kinds = {"tensors": [tensor_request()],
             "images": [image_request(photo) for photo in sample_jpegs()]}
    files: dict[str, list[Path]] = {}
    for kind, requests in kinds.items():
        files[kind] = []
        for index, request in enumerate(requests):
            files[kind].append(work / f"{kind}{index}.http")
            files[kind][-1].write_bytes(request)
    return files


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Start the server, upload ResNet-18, run tensors and images alternately, stop it."""
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        work = Path(directory)
        files = request_files(work)
        port = serve.free_port()
        url = f"http://127.0.0.1:{port}"
        env_args = ["--image-threads", str(args.image_threads)]
        server = serve.start_process([sys.executable, "-m", "service",
                                      *serve.service_args(work, port), *env_args],
                                     work, "hybridserve")
        try:
            serve.wait_until_up(url, "/v2/health/ready", server)
            upload(url, resnet18_upload())
            for kind in ("tensors", "images", "images", "tensors") * args.rounds:
                batches, batched = batch_totals(url)
                result = run_load(url, files[kind], args.concurrency, args.seconds,
                                  args.warmup, server.pid)
                after = batch_totals(url)
                mean_batch = (after[1] - batched) / max(1.0, after[0] - batches)
                rows.append({"kind": kind, **result, "mean_batch": mean_batch})
                print(_row(rows[-1]), flush=True)
        finally:
            serve.stop_process(server)
    return rows


def _row(row: dict[str, Any]) -> str:
    return (f"| {row['kind']:<7} | {row['requests']:>5} | {row['rps']:>7.1f} | "
            f"{row['p50_ms']:>8.1f} | {row['p99_ms']:>8.1f} | {row['server_cpu_ms']:>10.1f} | "
            f"{row['mean_batch']:>5.1f} | {row['failures']:>4} |")


def verdict(rows: list[dict[str, Any]]) -> str:
    """Images' mean images/s over tensors' mean, against the 85% target; CPU per image."""
    def mean(kind: str, key: str) -> float:
        return float(np.mean([row[key] for row in rows if row["kind"] == kind]))

    ratio = mean("images", "rps") / mean("tensors", "rps")
    met = "met" if ratio >= TARGET and not any(row["failures"] for row in rows) else "NOT met"
    return (f"images {mean('images', 'rps'):.1f}/s, tensors {mean('tensors', 'rps'):.1f}/s: "
            f"{100 * ratio:.0f}% (target >= {100 * TARGET:.0f}%): {met}; server CPU per image "
            f"{mean('images', 'server_cpu_ms'):.1f} ms with images, "
            f"{mean('tensors', 'server_cpu_ms'):.1f} ms with tensors")


def main() -> None:
    """Parse options; run the load role or the whole benchmark."""
    if len(sys.argv) > 1 and sys.argv[1] == "--load":
        import uvloop

        url, concurrency, seconds, warmup, pid, *files = sys.argv[2:]
        requests = [Path(file).read_bytes() for file in files]
        print(json.dumps(uvloop.run(_load(url, requests, int(concurrency), float(seconds),
                                          float(warmup), int(pid)))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=25.0, help="measured seconds a run")
    parser.add_argument("--warmup", type=float, default=5.0, help="unmeasured seconds first")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=1,
                        help="times the tensors, images, images, tensors sequence runs")
    parser.add_argument("--image-threads", type=int, default=2,
                        help="the server's --image-threads (HYBRIDSERVE_IMAGE_THREADS)")
    args = parser.parse_args()
    print(f"machine: nproc {os.cpu_count()}, {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}, NumPy {np.__version__}; concurrency "
          f"{args.concurrency}, image threads {args.image_threads}")
    print("| kind    | reqs  | img/s   | p50 ms   | p99 ms   | CPU ms/img | batch | fail |")
    print("|---------|-------|---------|----------|----------|------------|-------|------|")
    print(verdict(measure(args)))


if __name__ == "__main__":
    main()
