"""Served ResNet-18 under Triton's own load tool: perf_analyzer against `python -m service`.

The server runs as `bench/serve.py` starts it (one process, its defaults: a batch on every
core), with ResNet-18 v1 (random weights, ``--image`` pixels square, ``max_batch_size`` 16,
a 2 ms batching window) uploaded. perf_analyzer 2.60 (prepared by
``tests/e2e/perf_analyzer.py``: the wheel's binary on Debian 13's C runtime) then measures
batch 1 at each concurrency over HTTP (binary tensors) and gRPC, with its default random
input bytes (NaN, infinities and denormals among them: the server flushes denormals), and
this prints its throughput and p50/p99 latency. These are the figures Triton's users read off
the same tool; issue #36 gives Triton's on this machine type (ResNet-18 through ONNX Runtime,
batch 1, concurrency 4: 48.5 inferences/s over HTTP, 52 over gRPC), measured on another day.

    .venv/bin/python bench/perf_analyzer_serve.py
    .venv/bin/python bench/perf_analyzer_serve.py --concurrency 1,4,8 --seconds 10
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from bench import serve  # noqa: E402
from tests.e2e import perf_analyzer  # noqa: E402

# perf_analyzer stops at three windows in a row within this much of each other (its default, 10,
# is seldom reached on a shared 2-vCPU machine, where it then gives up after MAX_TRIALS).
STABILITY_PERCENT = 25
MAX_TRIALS = 6


def measure(argv: list[str], protocol: str, where: str, concurrency: int, seconds: float,
            report: Path) -> dict[str, float]:
    """One perf_analyzer run; its throughput (inferences/s) and p50/p99 latency (ms)."""
    window_ms = int(seconds * 1000)
    done = subprocess.run(
        [*argv, "-m", "resnet18", "-i", protocol, "-u", where, "-b", "1",
         "--concurrency-range", str(concurrency), "--measurement-interval", str(window_ms),
         "--percentile", "99", "--stability-percentage", str(STABILITY_PERCENT),
         "--max-trials", str(MAX_TRIALS), "-f", str(report)],
        capture_output=True, text=True, timeout=60 + (MAX_TRIALS + 1) * seconds, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"perf_analyzer failed ({protocol}, c={concurrency}):\n"
                           f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    with report.open() as file:
        (row,) = list(csv.DictReader(file))
    return {"throughput": float(row["Inferences/Second"]),
            "p50_ms": float(row["p50 latency"]) / 1000,
            "p99_ms": float(row["p99 latency"]) / 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,4",
                        type=lambda text: [int(n) for n in text.split(",")])
    parser.add_argument("--seconds", type=float, default=8.0, help="each measurement window")
    parser.add_argument("--image", type=int, default=224, help="ResNet-18 input side")
    args = parser.parse_args()
    argv = perf_analyzer.command()
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        port, grpc_port = serve.free_port(), serve.free_port()
        command = [sys.executable, "-m", "service", *serve.service_args(work, port, grpc_port)]
        server = serve.start_process(command, work, "hybridserve")
        try:
            url = f"http://127.0.0.1:{port}"
            serve.wait_until_up(url, "/v2/health/live", server)
            models = serve.build_models(work, args.image)
            serve.upload(url, {"resnet18": models["resnet18"]})
            print(f"ResNet-18 v1 {args.image}x{args.image}, batch 1, perf_analyzer "
                  f"{perf_analyzer.VERSION}, {args.seconds:g} s windows")
            print("| protocol | concurrency | inferences/s | p50 ms | p99 ms |")
            print("|---|---|---|---|---|")
            for protocol, where in (("http", f"127.0.0.1:{port}"),
                                    ("grpc", f"127.0.0.1:{grpc_port}")):
                for concurrency in args.concurrency:
                    found = measure(argv, protocol, where, concurrency, args.seconds,
                                    work / f"{protocol}-{concurrency}.csv")
                    print(f"| {protocol} | {concurrency} | {found['throughput']:.1f} | "
                          f"{found['p50_ms']:.1f} | {found['p99_ms']:.1f} |", flush=True)
        finally:
            serve.stop_process(server)


if __name__ == "__main__":
    main()
