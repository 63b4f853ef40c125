"""Health probes while a model uploads: how long `/v2/health/live` takes while another model is
received, validated, compiled and warmed up, against a real `python -m service` process.

One server; a small model is uploaded first (what the first load sets up once is not counted),
then ResNet-18 v1 at 64x64 (46 MB of parameters, max batch 32) is uploaded `--uploads` times
with curl, each a new version replacing the last. A probe is due every 20 ms and timed from
when it was due, for two seconds before each upload (the idle baseline) and while it runs.
This process's garbage collector is off while it probes, so that its own pauses do not read as
the server's. `--hogs N` runs N busy Python loops beside it, as on a loaded CI machine.

    .venv/bin/python bench/health_during_upload.py
    .venv/bin/python bench/health_during_upload.py --uploads 5 --hogs 2
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)] if str(ROOT) not in sys.path else []

from engine import nd  # noqa: E402
from engine.gluon.model_zoo.vision import get_model  # noqa: E402
from tests.e2e.server import TOKEN, Server, running_server  # noqa: E402
from tests.service.helpers import config_for, files_for  # noqa: E402

AUTH = {"Authorization": f"Bearer {TOKEN}"}
PROBE_INTERVAL_S = 0.02
IDLE_S = 2.0


def export_resnet(directory: Path) -> tuple[Path, Path, Path]:
    """ResNet-18 v1 exported at 64x64: (symbol, params, config.json)."""
    net = get_model("resnet18_v1", classes=1000)
    net.initialize()
    net.hybridize()
    net(nd.zeros((1, 3, 64, 64)))
    net.export(str(directory / "resnet"))
    config = directory / "config.json"
    config.write_text(json.dumps({"max_batch_size": 32, "inputs": [
        {"name": "data", "datatype": "FP32", "shape": [-1, 3, 64, 64]}]}))
    return directory / "resnet-symbol.json", directory / "resnet-0000.params", config


def probe(server: Server, until: Callable[[], bool]) -> np.ndarray:
    """Seconds each probe took from when it was due, until `until()` is true."""
    latencies = []
    gc.collect()
    gc.disable()
    try:
        with httpx.Client(base_url=server.url, timeout=10) as client:
            due = time.perf_counter()
            while not until():
                time.sleep(max(0.0, due - time.perf_counter()))
                if client.get("/v2/health/live").status_code != 200:
                    raise RuntimeError("a health probe failed")
                latencies.append(time.perf_counter() - due)
                due += PROBE_INTERVAL_S
    finally:
        gc.enable()
    return np.array(latencies)


def upload(server: Server, symbol: Path, params: Path, config: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["curl", "-sS", "-X", "POST", server.url + "/models/resnet", "-H",
         f"Authorization: Bearer {TOKEN}", "-F", f"symbol=@{symbol}", "-F", f"params=@{params}",
         "-F", f"config=@{config}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def warm_up(server: Server) -> None:
    symbol, params = files_for("hybridnet")
    response = httpx.post(server.url + "/models/warm", headers=AUTH, timeout=120, files={
        "symbol": ("s.json", symbol), "params": ("p.params", params),
        "config": ("config.json", json.dumps(config_for("hybridnet")).encode())})
    response.raise_for_status()


def hog() -> None:
    while True:
        pass


def milliseconds(values: np.ndarray, q: float) -> float:
    return round(float(np.percentile(values, q)) * 1e3, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--uploads", type=int, default=3)
    parser.add_argument("--hogs", type=int, default=0, help="busy loops beside the server")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="health-during-upload-"))
    files = export_resnet(work)
    hogs = [multiprocessing.Process(target=hog, daemon=True) for _ in range(args.hogs)]
    rows = []
    with running_server(work / "repository") as server:
        warm_up(server)
        for process in hogs:
            process.start()
        try:
            for _ in range(args.uploads):
                end = time.perf_counter() + IDLE_S
                idle = probe(server, lambda end=end: time.perf_counter() > end)
                running = upload(server, *files)
                busy = probe(server, lambda running=running: running.poll() is not None)
                out, err = running.communicate()
                answer = json.loads(out or err)
                if answer.get("state") != "READY":
                    raise RuntimeError(f"the upload failed: {answer}")
                rows.append({"version": answer["version"], "probes": len(busy),
                             "p50_ms": milliseconds(busy, 50), "p99_ms": milliseconds(busy, 99),
                             "max_ms": milliseconds(busy, 100),
                             "idle_p99_ms": milliseconds(idle, 99)})
                print(json.dumps(rows[-1]), flush=True)
        finally:
            for process in hogs:
                process.terminate()
    p99 = [row["p99_ms"] for row in rows]
    print(json.dumps({"uploads": len(rows), "hogs": args.hogs, "p99_ms_median": float(
        np.median(p99)), "p99_ms_range": [min(p99), max(p99)]}))


if __name__ == "__main__":
    main()
