"""Soak: steady concurrent load on several models while another model is uploaded, replaced and
deleted, against a real `python -m service` process on 127.0.0.1.

Afterwards: zero unexpected errors, every 200 answer equal to MXNet's reference outputs, and the
server's resident memory (VmRSS from /proc/PID/status) grown by no more than a stated bound
between the end of the warm-up and the end of the run.

    .venv/bin/python bench/soak.py                  # 180 s, 6 client threads
    .venv/bin/python bench/soak.py --seconds 20     # the short form the test suite runs
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)] if str(ROOT) not in sys.path else []

from tests.e2e.server import TOKEN, running_server  # noqa: E402
from tests.service.helpers import config_for, files_for, first_io  # noqa: E402

STEADY = ("seed_mlp", "lenet", "multi_io", "concurrent_cnn")
CHURN = "churn"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
# Answers a request to the churning model may get while it is being deleted or swapped.
CHURN_EXPECTED = {404, 503}


@dataclass
class Result:
    """What a soak run did and found."""

    seconds: float
    workers: int
    requests: int = 0
    churn_requests: int = 0
    expected_churn_errors: int = 0
    management_ops: int = 0
    unexpected: list[str] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    rss_baseline_mib: float = 0.0
    rss_final_mib: float = 0.0
    rss_max_mib: float = 0.0
    rss_bound_mib: float = 0.0

    @property
    def rss_growth_mib(self) -> float:
        """Resident memory growth from the end of the warm-up to the end of the run."""
        return self.rss_final_mib - self.rss_baseline_mib

    @property
    def ok(self) -> bool:
        """No unexpected error and memory growth within the bound."""
        return not self.unexpected and self.rss_growth_mib <= self.rss_bound_mib


def rss_mib(pid: int) -> float:
    """VmRSS of a process in MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", status)
    assert match is not None, "no VmRSS in /proc/PID/status"
    return int(match.group(1)) / 1024


def _upload(url: str, name: str, **form: str) -> httpx.Response:
    symbol, params = files_for("seed_mlp" if name == CHURN else name)
    config = json.dumps(config_for("seed_mlp" if name == CHURN else name)).encode()
    files = {"symbol": ("s.json", symbol), "params": ("p.params", params),
             "config": ("config.json", config)}
    return httpx.post(f"{url}/models/{name}", files=files, data=form, headers=AUTH, timeout=120)


class Soak:
    """One run: client threads, a churn thread and an RSS sampler around one server."""

    def __init__(self, url: str, pid: int, result: Result, warmup_s: float) -> None:
        self.url = url
        self.pid = pid
        self.result = result
        self.warmup_s = warmup_s
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.statuses: Counter[str] = Counter()
        self.cases = {name: first_io(name) for name in STEADY}

    def record(self, key: str, problem: str | None = None) -> None:
        with self.lock:
            self.statuses[key] += 1
            if problem is not None and len(self.result.unexpected) < 50:
                self.result.unexpected.append(problem)

    def check(self, name: str, response: httpx.Response, route: str) -> None:
        """Count an answer; anything but a correct 200 (or an expected churn error) is a fault."""
        model = "seed_mlp" if name == CHURN else name
        if response.status_code != 200:
            expected = name == CHURN and response.status_code in CHURN_EXPECTED
            self.record(f"{route} {response.status_code}", None if expected else
                        f"{route} {name}: {response.status_code} {response.text[:200]}")
            with self.lock:
                self.result.expected_churn_errors += expected
            return
        body = response.json()
        outputs = (list(body["outputs"].values()) if route == "predict"
                   else [np.reshape(out["data"], out["shape"]) for out in body["outputs"]])
        for got, want in zip(outputs, self.cases[model][1] if model in self.cases
                             else first_io(model)[1]):
            if not np.allclose(np.asarray(got, np.float32), want, **TOLERANCE):
                self.record(f"{route} wrong", f"{route} {name}: outputs differ from MXNet's")
                return
        self.record(f"{route} 200")

    def client(self, worker: int) -> None:
        models = [*STEADY, CHURN]
        churn_case = first_io("seed_mlp")
        with httpx.Client(base_url=self.url, timeout=60) as http:
            turn = worker
            while not self.stop.is_set():
                name = models[turn % len(models)]
                inputs = (churn_case if name == CHURN else self.cases[name])[0]
                try:
                    if turn % 2:
                        route, response = "predict", http.post("/predict", json={
                            "model": name, "inputs": {k: v.tolist() for k, v in inputs.items()}})
                    else:
                        route, response = "v2", http.post(f"/v2/models/{name}/infer", json={
                            "inputs": [{"name": k, "datatype": "FP32", "shape": list(v.shape),
                                        "data": v.ravel().tolist()} for k, v in inputs.items()]})
                    self.check(name, response, route)
                except httpx.TransportError as error:
                    self.record("transport", f"{name}: {error!r}")
                with self.lock:
                    self.result.requests += 1
                    self.result.churn_requests += name == CHURN
                turn += 1

    def churn(self) -> None:
        """Upload, replace, add, delete versions and the whole model, over and over."""
        steps = [("upload", {}), ("replace", {"version": "1", "replace": "true"}),
                 ("upload", {}), ("delete_version", {}), ("delete_model", {})]
        while not self.stop.is_set():
            for step, form in steps:
                if self.stop.is_set():
                    return
                if step in ("upload", "replace"):
                    response = _upload(self.url, CHURN, **form)
                    ok = response.status_code == 201
                elif step == "delete_version":
                    versions = httpx.get(f"{self.url}/models/{CHURN}", timeout=30).json()
                    lowest = min(v["version"] for v in versions["versions"])
                    response = httpx.delete(f"{self.url}/models/{CHURN}/versions/{lowest}",
                                            headers=AUTH, timeout=30)
                    ok = response.status_code == 200
                else:
                    response = httpx.delete(f"{self.url}/models/{CHURN}", headers=AUTH,
                                            timeout=30)
                    ok = response.status_code == 200
                self.record(f"manage {step} {response.status_code}", None if ok else
                            f"{step}: {response.status_code} {response.text[:200]}")
                with self.lock:
                    self.result.management_ops += 1
                time.sleep(0.2)

    def sample_memory(self, started: float) -> None:
        while not self.stop.wait(0.5):
            value = rss_mib(self.pid)
            self.result.rss_max_mib = max(self.result.rss_max_mib, value)
            if not self.result.rss_baseline_mib and time.monotonic() - started >= self.warmup_s:
                self.result.rss_baseline_mib = value


def run_soak(seconds: float = 180.0, workers: int = 6, rss_bound_mib: float = 64.0,
             root: Path | None = None) -> Result:
    """Run one soak for `seconds` and return what it found (see `Result.ok`)."""
    result = Result(seconds, workers, rss_bound_mib=rss_bound_mib)
    with tempfile.TemporaryDirectory() as scratch:
        repository = (root or Path(scratch)) / "repository"
        with running_server(repository) as server:
            for name in STEADY:
                response = _upload(server.url, name)
                assert response.status_code == 201, response.text
            soak = Soak(server.url, server.process.pid, result, warmup_s=max(2.0, seconds / 5))
            started = time.monotonic()
            threads = [threading.Thread(target=soak.client, args=(index,))
                       for index in range(workers)]
            threads += [threading.Thread(target=soak.churn),
                        threading.Thread(target=soak.sample_memory, args=(started,))]
            for thread in threads:
                thread.start()
            soak.stop.wait(seconds)
            soak.stop.set()
            for thread in threads:
                thread.join(120)
            result.rss_final_mib = rss_mib(server.process.pid)
            result.statuses = dict(sorted(soak.statuses.items()))
            leftovers = [p.name for p in repository.iterdir() if p.name.startswith(".")]
            if leftovers:
                result.unexpected.append(f"staging leftovers after the run: {leftovers}")
    return result


def machine() -> str:
    """nproc and CPU model of this machine."""
    model = platform.processor()
    try:
        text = Path("/proc/cpuinfo").read_text()
        found = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
        model = found.group(1) if found else model
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs, {model}"


def main(argv: list[str] | None = None) -> int:
    """Run a soak, print its result as JSON, exit 1 if it found a fault."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--rss-bound-mib", type=float, default=64.0)
    args = parser.parse_args(argv)
    result = run_soak(args.seconds, args.workers, args.rss_bound_mib)
    report: dict[str, Any] = {**asdict(result), "rss_growth_mib": round(result.rss_growth_mib, 1),
                              "ok": result.ok, "machine": machine(),
                              "requests_per_s": round(result.requests / result.seconds, 1)}
    print(json.dumps(report, indent=2))
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
