"""Served on the GPU: ResNet-50 v1 images/s over V2 binary tensors, against `Model.infer`.

Starts ``python -m service --device gpu`` with ResNet-50 v1 (GluonCV's layout from
``engine.gluon.model_zoo``, random weights) uploaded with ``max_batch_size`` 32 and dynamic
batching (batches padded to the GPU's default buckets, powers of two), and drives it with
`bench/serve.py`'s load generator (separate processes, raw HTTP/1.1 keep-alive connections,
pre-encoded V2 requests carrying one image as a binary tensor) at concurrency 32. The
reference is the same model in this process through `Model.infer` at batch 32, measured
before the server starts and after it stops (the two never share the GPU).
Target (issue #20): served images/s at least 80% of in-process.

    python bench/gpu_serve.py --output bench/results/gpu-serve.json   # about 2 minutes
    python bench/gpu_serve.py --device cpu --image 32 --seconds 3      # a smoke test anywhere
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import serve as serve_bench  # noqa: E402  (bench/serve.py: load generator and process helpers)

import engine  # noqa: E402

MODEL = "resnet50"


def export_resnet50(folder: Path, image: int) -> tuple[Path, Path]:
    """ResNet-50 v1 from the model zoo, initialised at random and exported into ``folder``."""
    from engine import nd
    from engine.gluon.model_zoo import vision

    net = vision.get_model("resnet50_v1")
    net.initialize()
    net.hybridize()
    net(nd.array(np.zeros((1, 3, image, image), np.float32)))
    net.export(str(folder / MODEL))
    return folder / f"{MODEL}-symbol.json", folder / f"{MODEL}-0000.params"


def in_process_images_per_s(files: tuple[Path, Path], device: str, batch: int, image: int,
                            seconds: float) -> float:
    """Images/s of `Model.infer` at ``batch`` on ``device`` (CUDA graphs on, after warm-up)."""
    model = engine.load_model(*files, device=device)
    data = np.random.default_rng(0).random((batch, 3, image, image), np.float32)
    for _ in range(5):
        model.infer({"data": data})
    runs, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        model.infer({"data": data})
        runs += 1
    return runs * batch / (time.perf_counter() - started)


def upload(url: str, files: tuple[Path, Path], max_batch: int, image: int) -> None:
    serve_bench.upload(url, {MODEL: {
        "symbol": files[0].read_bytes(), "params": files[1].read_bytes(),
        "config": {"inputs": [{"name": "data", "datatype": "FP32",
                               "shape": [-1, 3, image, image]}],
                   "max_batch_size": max_batch,
                   "dynamic_batching": {"max_queue_delay_us": 2000}}}})


def run_loads(url: str, request: Path, concurrency: int, seconds: float,
              processes: int) -> dict[str, Any]:
    """`concurrency` connections split over `processes` load generators (one process sending
    1 GB/s of image bodies could be the bottleneck itself); their summed summary."""
    shares = [concurrency // processes + (k < concurrency % processes) for k in range(processes)]
    running = [subprocess.Popen(serve_bench.load_command(url, request, share, seconds, 3.0),
                                stdout=subprocess.PIPE, text=True, cwd=ROOT)
               for share in shares if share]
    results = [json.loads(process.communicate(timeout=seconds + 120)[0]) for process in running]
    return {"requests": sum(r["requests"] for r in results),
            "failures": sum(r["failures"] for r in results),
            "rps": sum(r["rps"] for r in results), "load_processes": len(results),
            "p50_ms": max(r["p50_ms"] for r in results),
            "p99_ms": max(r["p99_ms"] for r in results),
            "statuses": sorted({s for r in results for s in r["statuses"]})}


def served_images_per_s(work: Path, files: tuple[Path, Path], device: str, image: int,
                        max_batch: int, concurrency: int, seconds: float,
                        load_processes: int) -> dict[str, Any]:
    """Start the server on ``device``, upload the model, run the load; the load's summary."""
    port = serve_bench.free_port()
    url = f"http://127.0.0.1:{port}"
    args = [sys.executable, "-m", "service", *serve_bench.service_args(work, port),
            "--device", device]
    process = serve_bench.start_process(args, work, "server")
    try:
        serve_bench.wait_until_up(url, "/v2/health/live", process)
        upload(url, files, max_batch, image)
        tensor = np.random.default_rng(1).random((1, 3, image, image), np.float32)
        request = work / "request.http"
        request.write_bytes(serve_bench.v2_binary_request(MODEL, tensor))
        return run_loads(url, request, concurrency, seconds, load_processes)
    finally:
        serve_bench.stop_process(process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="gpu")
    parser.add_argument("--image", type=int, default=224)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--load-processes", type=int, default=2)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        work = Path(directory)
        (work / "export").mkdir()
        files = export_resnet50(work / "export", args.image)
        reference = [in_process_images_per_s(files, args.device, args.max_batch, args.image,
                                             args.seconds / 3)]
        served = served_images_per_s(work, files, args.device, args.image, args.max_batch,
                                     args.concurrency, args.seconds, args.load_processes)
        reference.append(in_process_images_per_s(files, args.device, args.max_batch,
                                                 args.image, args.seconds / 3))
    in_process = sum(reference) / len(reference)
    result = {
        "machine": {"python": platform.python_version(), "numpy": np.__version__,
                    "device": args.device},
        "model": f"resnet50_v1 fp32 {args.image}x{args.image}, one image per request",
        "concurrency": args.concurrency, "max_batch_size": args.max_batch,
        "served": served, "served_images_per_s": served["rps"],
        "in_process_images_per_s": {"before": reference[0], "after": reference[1],
                                    "mean": in_process},
        "served_over_in_process": served["rps"] / in_process,
        "target": "served_over_in_process >= 0.8",
    }
    if args.device != "cpu":
        import cupy

        result["machine"]["gpu"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    text = json.dumps(result, indent=2)
    print(text)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text + "\n")


if __name__ == "__main__":
    main()
