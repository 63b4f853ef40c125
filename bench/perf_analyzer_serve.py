"""Served ResNet-18 under Triton's own load tool: perf_analyzer against `python -m service`.

The server runs as `bench/serve.py` starts it (one process, its defaults: a batch on every
core), with ResNet-18 v1 (random weights, ``--image`` pixels square, ``max_batch_size`` 16,
a 2 ms batching window) uploaded. perf_analyzer 2.60 (prepared by
``tests/e2e/perf_analyzer.py``: the wheel's binary on Debian 13's C runtime) then measures
batch 1 at each concurrency over HTTP (binary tensors) and gRPC, with its default random
input bytes (NaN, infinities and denormals among them: the server flushes denormals), and
this prints its throughput and p50/p99 latency. These are the figures Triton's users read off
the same tool. Where Triton's environment is at hand (`bench/requirements-triton.txt`,
``--triton``), Triton serves the same weights in the same run (`triton_peer.py`: our ONNX
export through ONNX Runtime behind its dynamic batcher), each row measured on both servers
in turn, with ours ÷ Triton.

    .venv/bin/python bench/perf_analyzer_serve.py
    .venv/bin/python bench/perf_analyzer_serve.py --concurrency 1,4,8 --seconds 10 --triton none
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from bench import serve  # noqa: E402
from tests.e2e import perf_analyzer  # noqa: E402

# perf_analyzer stops at three windows in a row within this much of each other (its default, 10,
# is seldom reached on a shared 2-vCPU machine, where it then gives up after MAX_TRIALS).
STABILITY_PERCENT = 25
MAX_TRIALS = 6
UNSTABLE = "Failed to obtain stable measurement"  # what perf_analyzer says when it gives up
# Triton loads ResNet-18 in seconds: a peer not ready past this is stuck (once, a fresh
# environment's server answered nothing for 16 minutes), and its log is the report.
STARTUP_SECONDS = 300
STARTUP_POLL_SECONDS = 0.2  # how often its log is read for "ready" meanwhile
# Triton's own environment (bench/requirements-triton.txt), never the project's.
TRITON_PYTHON_VARIABLE = "HYBRIDSERVE_BENCH_TRITON_PYTHON"
DEFAULT_TRITON_PYTHON = Path.home() / ".cache" / "hybridserve" / "triton-peer" / "bin" / "python"


def measure(argv: list[str], protocol: str, where: str, concurrency: int, seconds: float,
            report: Path) -> dict[str, float]:
    """One perf_analyzer run; its throughput (inferences/s) and p50/p99 latency (ms). A run
    whose windows never agree within `STABILITY_PERCENT` (a burst of the host's load) is run
    once more before it counts as a failure."""
    window_ms = int(seconds * 1000)
    for attempt in range(2):
        done = subprocess.run(
            [*argv, "-m", "resnet18", "-i", protocol, "-u", where, "-b", "1",
             "--concurrency-range", str(concurrency), "--measurement-interval", str(window_ms),
             "--percentile", "99", "--stability-percentage", str(STABILITY_PERCENT),
             "--max-trials", str(MAX_TRIALS), "-f", str(report)],
            capture_output=True, text=True, timeout=60 + (MAX_TRIALS + 1) * seconds,
            check=False)
        if done.returncode == 0 or attempt or UNSTABLE not in done.stdout + done.stderr:
            break
    if done.returncode != 0:
        raise RuntimeError(f"perf_analyzer failed ({protocol}, c={concurrency}):\n"
                           f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    with report.open() as file:
        (row,) = list(csv.DictReader(file))
    return {"throughput": float(row["Inferences/Second"]),
            "p50_ms": float(row["p50 latency"]) / 1000,
            "p99_ms": float(row["p99 latency"]) / 1000}


def start_triton(python: str, work: Path, image: int
                 ) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """Triton (`triton_peer.py` in its own environment) serving the uploaded ResNet-18's own
    weights, exported by our ONNX exporter; its HTTP and gRPC addresses once it is ready.

    Its output goes to ``work``'s ``triton.log``, never to a pipe nobody reads once it is
    up: Triton's log lines during the measurements would fill the pipe and stall the server
    that writes them. A peer that says neither ``ready`` nor goodbye within
    `STARTUP_SECONDS` is stopped and reported with its log."""
    from engine.onnx import export

    plain = work / "plain" / "resnet18"
    onnx_file = export((plain / "model-symbol.json", plain / "model-0000.params"),
                       work / "resnet18.onnx", input_shapes={"data": (1, 3, image, image)})
    ports = [serve.free_port() for _ in range(3)]
    log_path = work / "triton.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [python, str(Path(__file__).with_name("triton_peer.py")), str(onnx_file),
             "--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port",
             str(ports[2])], stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
            text=True)
    # Triton's log comes first, then the peer's "ready" (or the end, where it failed).
    deadline = time.monotonic() + STARTUP_SECONDS
    while True:
        lines = log_path.read_text(errors="replace").splitlines()
        if "ready" in (line.strip() for line in lines):
            return process, {"http": f"127.0.0.1:{ports[0]}", "grpc": f"127.0.0.1:{ports[1]}"}
        status = process.poll()
        if status is None and time.monotonic() < deadline:
            time.sleep(STARTUP_POLL_SECONDS)
            continue
        if status is None:
            stop_triton(process, wait=0)
            reason = f"said nothing of being ready within {STARTUP_SECONDS} s"
        else:
            reason = f"did not start (exit status {status})"
            stop_triton(process)
        raise RuntimeError(f"Triton {reason}:\n" + "\n".join(lines[-40:]))


def stop_triton(process: subprocess.Popen[str], wait: float = 60) -> None:
    """Closes the peer's standard input, its signal to stop; kills it past ``wait`` s."""
    assert process.stdin is not None
    process.stdin.close()
    try:
        process.wait(wait)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


def triton_python(option: str | None) -> str | None:
    """The Triton environment's Python: the option, the environment variable, or the default
    folder where it exists (None: no Triton columns)."""
    if option:
        return option
    found = os.environ.get(TRITON_PYTHON_VARIABLE)
    if found:
        return found
    return str(DEFAULT_TRITON_PYTHON) if DEFAULT_TRITON_PYTHON.exists() else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,4",
                        type=lambda text: [int(n) for n in text.split(",")])
    parser.add_argument("--seconds", type=float, default=8.0, help="each measurement window")
    parser.add_argument("--image", type=int, default=224, help="ResNet-18 input side")
    parser.add_argument("--triton", metavar="PYTHON", default=None,
                        help="the Triton environment's Python (default: "
                             f"${TRITON_PYTHON_VARIABLE}, else {DEFAULT_TRITON_PYTHON} where it "
                             "exists); 'none' leaves Triton out")
    args = parser.parse_args()
    python = None if args.triton == "none" else triton_python(args.triton)
    argv = perf_analyzer.command()
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        port, grpc_port = serve.free_port(), serve.free_port()
        command = [sys.executable, "-m", "service", *serve.service_args(work, port, grpc_port)]
        server = serve.start_process(command, work, "hybridserve")
        triton = None
        try:
            url = f"http://127.0.0.1:{port}"
            serve.wait_until_up(url, "/v2/health/live", server)
            models = serve.build_models(work, args.image)
            serve.upload(url, {"resnet18": models["resnet18"]})
            servers = {"ours": {"http": f"127.0.0.1:{port}", "grpc": f"127.0.0.1:{grpc_port}"}}
            if python:
                triton, servers["triton"] = start_triton(python, work, args.image)
            print(f"ResNet-18 v1 {args.image}x{args.image}, batch 1, perf_analyzer "
                  f"{perf_analyzer.VERSION}, {args.seconds:g} s windows"
                  + ("; Triton: ONNX Runtime behind its dynamic batcher (PyTriton), the same "
                     "weights through our exporter" if python else "; Triton left out"))
            print("| protocol | concurrency | server | inferences/s | p50 ms | p99 ms | "
                  "ours ÷ Triton |")
            print("|---|---|---|---|---|---|---|")
            for protocol in ("http", "grpc"):
                for turn, concurrency in enumerate(args.concurrency):
                    # Side by side, in turn: each row's servers measured one after the other,
                    # the first of them alternating, so that a change in the machine's load
                    # falls on both.
                    names = list(servers) if turn % 2 == 0 else list(servers)[::-1]
                    found = {name: measure(argv, protocol, servers[name][protocol], concurrency,
                                           args.seconds,
                                           work / f"{name}-{protocol}-{concurrency}.csv")
                             for name in names}
                    rates = {name: found[name]["throughput"] for name in found}
                    for name in servers:
                        ratio = (f"{rates['ours'] / rates['triton']:.2f}"
                                 if name == "ours" and "triton" in rates else "")
                        print(f"| {protocol} | {concurrency} | {name} | "
                              f"{found[name]['throughput']:.1f} | {found[name]['p50_ms']:.1f} | "
                              f"{found[name]['p99_ms']:.1f} | {ratio} |", flush=True)
        finally:
            if triton is not None:
                stop_triton(triton)
            serve.stop_process(server)


if __name__ == "__main__":
    main()
