"""Served against in process at a reduced precision: a CNN in bf16 (or int8) over V2 binary.

Issue #36 holds served ResNet-50 in bf16 over V2 binary tensors at concurrency 8 to at least 80%
of the images/s the same model makes in process at batch 8. This serves one network (random
weights, ``--image`` pixels square) with the model config's ``precision`` set, through
`bench/serve.py`'s server start, upload and load generator (raw HTTP/1.1, binary tensors),
and measures ``Model.infer`` at the same batch and precision in this process just before and
just after the served run (their mean is the reference: this machine's speed drifts over
minutes). The server is the real one, with its defaults (one batch at a time on every core).

    .venv/bin/python bench/serve_precision.py                      # ResNet-50 v2, bf16, c=8
    .venv/bin/python bench/serve_precision.py --net resnet18_v1 --concurrency 4
    .venv/bin/python bench/serve_precision.py --precision int8     # calibrated on 32 samples
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from bench import nets, serve  # noqa: E402

NETWORKS = {"resnet18_v1": nets.resnet18_v1, "resnet50_v2": nets.resnet50_v2,
            "mobilenet_v2": nets.mobilenet_v2}
TARGET = 0.80  # served ÷ in process, issue #36
CALIBRATION_SAMPLES = 32


def model_files(network: str, image: int) -> tuple[Any, bytes, dict[str, np.ndarray]]:
    """The network's symbol, its params file's bytes, and its params by name."""
    from engine.graph.params import save_params

    symbol = NETWORKS[network]()
    params = nets.random_params(symbol, (1, 3, image, image))
    aux = set(symbol.list_auxiliary_states())
    saved = save_params(None, {f"{'aux' if name in aux else 'arg'}:{name}": value
                               for name, value in params.items() if name != "data"})
    return symbol, saved, params


def calibration_images(image: int) -> np.ndarray:
    return np.random.default_rng(1).random((CALIBRATION_SAMPLES, 3, image, image), np.float32)


def upload_config(precision: str, image: int, concurrency: int) -> dict[str, Any]:
    config: dict[str, Any] = {
        "inputs": [{"name": "data", "datatype": "FP32", "shape": [-1, 3, image, image]}],
        "max_batch_size": max(16, concurrency),
        # A 2 ms window lets the callers whose responses just went out join the next batch.
        "dynamic_batching": {"max_queue_delay_us": 2000},
        "precision": precision}
    if precision == "int8":
        config["calibration"] = {"samples": CALIBRATION_SAMPLES}
    return config


def upload(url: str, name: str, symbol: bytes, params: bytes, config: dict[str, Any],
           image: int) -> dict[str, Any]:
    """Upload the model (with calibration inputs for int8); the server's answer."""
    import io

    import httpx

    files = {"symbol": ("s", symbol), "params": ("p", params),
             "config": ("c", json.dumps(config).encode())}
    if config["precision"] == "int8":
        buffer = io.BytesIO()
        np.savez(buffer, data=calibration_images(image))
        files["calibration"] = ("calibration.npz", buffer.getvalue())
    response = httpx.post(f"{url}/models/{name}", files=files, timeout=600,
                          headers={"Authorization": f"Bearer {serve.TOKEN}"})
    if response.is_error:  # the server's answer says why (a failed precision check)
        raise RuntimeError(f"upload answered {response.status_code}: {response.text}")
    return response.json()


def in_process_images(model: Any, batch: int, image: int, seconds: float) -> float:
    """``Model.infer``'s images/s at ``batch``, the library's defaults (every core)."""
    feed = {"data": np.random.default_rng(batch).random((batch, 3, image, image), np.float32)}
    model.infer(feed)
    runs, started = 0, time.perf_counter()
    while runs < 3 or time.perf_counter() - started < seconds:
        model.infer(feed)
        runs += 1
    return runs * batch / (time.perf_counter() - started)


def measure(options: argparse.Namespace) -> dict[str, Any]:
    import engine

    name = options.net
    symbol, params_bytes, params = model_files(name, options.image)
    extra = ({"calibration": {"data": calibration_images(options.image)}}
             if options.precision == "int8" else {})
    model = engine.load_model(symbol, params, precision=options.precision, **extra)
    tensor = np.random.default_rng(0).random((1, 3, options.image, options.image), np.float32)
    with tempfile.TemporaryDirectory() as directory:
        work = Path(directory)
        request = work / "request.http"
        request.write_bytes(serve.v2_binary_request(name, tensor))
        port = serve.free_port()
        url = f"http://127.0.0.1:{port}"
        server = serve.start_process([sys.executable, "-m", "service",
                                      *serve.service_args(work, port)], work, "hybridserve")
        try:
            serve.wait_until_up(url, "/v2/health/ready", server)
            answer = upload(url, name, symbol.tojson().encode(), params_bytes,
                            upload_config(options.precision, options.image,
                                          options.concurrency), options.image)
            before = in_process_images(model, options.concurrency, options.image,
                                       options.seconds / 2)
            served = serve.run_load(url, request, options.concurrency, options.seconds,
                                    min(4.0, options.seconds / 2))
            after = in_process_images(model, options.concurrency, options.image,
                                      options.seconds / 2)
        finally:
            serve.stop_process(server)
    reference = (before + after) / 2
    return {"network": name, "precision": options.precision, "runs_at": model.precision,
            "image": options.image, "concurrency": options.concurrency,
            "served_images_s": served["rps"], "p50_ms": served["p50_ms"],
            "p99_ms": served["p99_ms"], "failures": served["failures"],
            "in_process_images_s": reference, "in_process_before": before,
            "in_process_after": after, "served_over_in_process": served["rps"] / reference,
            "checks": answer.get("checks", {}).get("precision")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", choices=sorted(NETWORKS), default="resnet50_v2")
    parser.add_argument("--precision", choices=("fp32", "bf16", "int8"), default="bf16")
    parser.add_argument("--concurrency", type=int, default=8,
                        help="served concurrency, and the in-process batch it is held against")
    parser.add_argument("--image", type=int, default=224)
    parser.add_argument("--seconds", type=float, default=20.0, help="the served window")
    parser.add_argument("--output", type=Path, help="also write the result as JSON here")
    options = parser.parse_args()
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    result = measure(options)
    print(f"{result['network']} in {result['runs_at']} (asked {result['precision']}), "
          f"{result['image']}×{result['image']}: served at concurrency {result['concurrency']} "
          f"{result['served_images_s']:.1f} images/s (p50 {result['p50_ms']:.0f} ms, p99 "
          f"{result['p99_ms']:.0f} ms, {result['failures']} failures); in process at batch "
          f"{result['concurrency']} {result['in_process_images_s']:.1f} (before "
          f"{result['in_process_before']:.1f}, after {result['in_process_after']:.1f})")
    ratio = result["served_over_in_process"]
    print(f"served ÷ in process: {ratio:.2f} (target ≥ {TARGET:.2f}: "
          f"{'met' if ratio >= TARGET else 'missed'}); precision check: {result['checks']}")
    print(f"load average now {os.getloadavg()[0]:.2f}")
    if options.output:
        options.output.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
