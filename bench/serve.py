"""Serving over HTTP: requests/s and p50/p99 latency of `python -m service` under load.

Three servers, each its own process, are measured in one run with the same load generator:

- ``hybridserve``: the real server (dynamic batching, orjson, binary tensors);
- ``minimal``: a minimal FastAPI app running the same model inline, one request at a time;
- ``floor``: the real server's cheapest route, ``GET /v2/health/live`` (the HTTP floor), an
  ASGI route (`service.rest.routes.AsgiRoute`) as the inference routes are.

The real server is also driven over gRPC (``grpc/...`` rows: ``ModelInfer`` with raw tensor
contents, one HTTP/2 channel, pre-serialized requests), beside its REST rows in the same run;
``grpc/floor`` is its cheapest call, ``ServerLive`` (the gRPC floor).

The load generator is a separate process speaking raw HTTP/1.1 over keep-alive connections
(asyncio + uvloop, pre-encoded requests), so it costs the server's cores little. Models: the
seed MLP (JSON, ``POST /predict``) and ResNet-18 v1 built with `engine.sym` (binary tensors,
``POST /v2/models/resnet18/infer``; the minimal app gets the same raw float32 bytes), and
ResNet-18's images/s through `Model.infer` in this process at batch 1 to 16, with the
library's defaults (every core), the reference for the served images/s at concurrency 4 (the
same batch: the server forms batches of 4) and 8. That reference is measured just before and
just after the served run at concurrency 4 and averaged: this machine's speed drifts by 10-20%
over minutes. Every process runs with its own defaults: no BLAS thread variables are set.

    .venv/bin/python bench/serve.py                 # ~4 minutes, ResNet-18 at 224x224
    .venv/bin/python bench/serve.py --image 64      # small images: weight-bound layers
    .venv/bin/python bench/serve.py --seconds 2     # quicker, noisier
    .venv/bin/python bench/serve.py --resnet-only   # ResNet-18 over REST and the executor

Two commits side by side: ``--against DIR`` serves a checkout of another commit (a ``git
worktree``) and this one in turn, ``--rounds`` times (the order alternating, so that the
machine's drift falls on both), through the same load generator, and prints each target's
median requests/s and p50/p99 over the rounds with the ratio new/old. Only our server runs
(REST and gRPC), not the minimal app:

    git worktree add ../hybridserve-old COMMIT
    .venv/bin/python bench/serve.py --against ../hybridserve-old --rounds 3 --seconds 2 --image 64

Instance counts side by side: ``--instances 1,2`` serves ResNet-18 with each count of
``instance_group`` in turn, ``--rounds`` times, at ``--concurrency`` (8) over REST, and prints
each count's median requests/s, latencies and range:

    .venv/bin/python bench/serve.py --instances 1,2 --rounds 5

Served against in process in turns: ``--turns N`` serves ResNet-18 at concurrency 4 and runs
the executor at batch 4 in this process one after the other, N times, and prints each served
turn against the mean of the executor's turns on either side, and the median ratio:

    .venv/bin/python bench/serve.py --turns 7 --resnet-seconds 6

``--no-grpc`` leaves the gRPC rows out and ``--resnet-seconds 0`` ResNet-18: the seed MLP and
the floor alone, in a third of the time.
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
from fastapi import FastAPI, Request

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)] if str(ROOT) not in sys.path else []
TOKEN = "bench-token"
MLP_DIR = ROOT / "tests" / "fixtures" / "mxnet" / "models" / "seed_mlp"
CONCURRENCY = {"floor": (1, 16, 64), "seed_mlp": (1, 16, 64), "resnet18": (1, 4, 8, 16, 64)}
GRPC_CONCURRENCY = {"floor": (1, 16, 64), "seed_mlp": (1, 16, 64), "resnet18": (8,)}
GRPC_SERVICE = "/inference.GRPCInferenceService/"
EXECUTOR_BATCHES = (1, 2, 4, 8, 16)  # the executor's own images/s, for ResNet-18's targets
REFERENCE_CONCURRENCY = 4  # the served run the executor's images/s are measured around
RESNET_ONLY_CONCURRENCY = (1, 4, 8)  # `--resnet-only`: the rows the targets read


# ----- load generator (runs in its own process) ---------------------------------------------

async def _connection(host: str, port: int, request: bytes, stop_at: float, warm_until: float,
                      latencies: list[float], failures: list[int]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while True:
            started = time.perf_counter()
            if started >= stop_at:
                return
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            await reader.readexactly(length)
            finished = time.perf_counter()
            if finished < warm_until:
                continue
            if head[9:12] != b"200":
                failures.append(int(head[9:12]))
            latencies.append(finished - started)
    finally:
        writer.close()


async def _load(url: str, request: bytes, concurrency: int, seconds: float,
                warmup: float) -> dict[str, Any]:
    host, port = url.removeprefix("http://").split(":")
    start = time.perf_counter()
    warm_until, stop_at = start + warmup, start + warmup + seconds
    latencies: list[float] = []
    failures: list[int] = []
    await asyncio.gather(*(_connection(host, int(port), request, stop_at, warm_until, latencies,
                                       failures) for _ in range(concurrency)))
    return _summary(latencies, failures, time.perf_counter() - warm_until)


async def _grpc_load(address: str, request: bytes, concurrency: int, seconds: float,
                     warmup: float, method: str = "ModelInfer") -> dict[str, Any]:
    """`concurrency` callers of `method` sharing one channel, each waiting for its answer."""
    import grpc

    start = time.perf_counter()
    warm_until, stop_at = start + warmup, start + warmup + seconds
    latencies: list[float] = []
    failures: list[int] = []
    async with grpc.aio.insecure_channel(
            address, options=[("grpc.max_receive_message_length", -1)]) as channel:
        # Bytes in, bytes out: the client parses nothing.
        call = channel.unary_unary(GRPC_SERVICE + method)

        async def caller() -> None:
            while (started := time.perf_counter()) < stop_at:
                code = 0
                try:
                    await call(request)
                except grpc.aio.AioRpcError as error:
                    code = error.code().value[0]
                finished = time.perf_counter()
                if finished >= warm_until:
                    latencies.append(finished - started)
                    if code:
                        failures.append(code)

        await asyncio.gather(*(caller() for _ in range(concurrency)))
    return _summary(latencies, failures, time.perf_counter() - warm_until)


def _summary(latencies: list[float], failures: list[int], elapsed: float) -> dict[str, Any]:
    values = np.array(latencies or [float("nan")])
    return {"requests": len(latencies), "failures": len(failures),
            "rps": len(latencies) / elapsed, "p50_ms": float(np.percentile(values, 50)) * 1e3,
            "p99_ms": float(np.percentile(values, 99)) * 1e3,
            "statuses": sorted(set(failures))}


def http_request(method: str, path: str, body: bytes = b"",
                  headers: dict[str, str] | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: bench", f"Content-Length: {len(body)}",
             *(f"{key}: {value}" for key, value in (headers or {}).items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def load_command(url: str, request_file: Path, concurrency: int, seconds: float,
                 warmup: float) -> list[str]:
    """The command running the load generator: it prints its result as JSON.

    `url` is ``http://HOST:PORT`` for HTTP, ``HOST:PORT/METHOD`` for a gRPC method.
    """
    role = "--grpc-load" if not url.startswith("http://") else "--load"
    return [sys.executable, __file__, role, url, str(request_file), str(concurrency),
            str(seconds), str(warmup)]


def run_load(url: str, request_file: Path, concurrency: int, seconds: float,
             warmup: float) -> dict[str, Any]:
    """Run the load generator in a separate process; its JSON result."""
    output = subprocess.run(load_command(url, request_file, concurrency, seconds, warmup),
                            check=True, capture_output=True, text=True, cwd=ROOT,
                            timeout=seconds + warmup + 120)
    return json.loads(output.stdout)


# ----- the minimal reference app (runs in its own process) ----------------------------------

def minimal_app(model_dir: Path) -> Any:
    """A minimal FastAPI app: the same models, inline, one request at a time."""
    models = {name: load_plain(model_dir / name) for name in ("seed_mlp", "resnet18")}
    app = FastAPI()

    @app.post("/predict")
    async def predict(body: dict[str, Any]) -> dict[str, Any]:
        model = models[body["model"]]
        inputs = {name: np.asarray(value, np.float32) for name, value in body["inputs"].items()}
        outputs = model.infer(inputs)
        return {"model": body["model"], "outputs": {name: value.tolist()
                                                    for name, value in outputs.items()}}

    @app.post("/raw/{name}")
    async def raw(name: str, request: Request) -> dict[str, Any]:
        shape = [int(dim) for dim in request.headers["x-shape"].split(",")]
        data = np.frombuffer(await request.body(), np.float32).reshape(shape)
        outputs = models[name].infer({"data": data})
        return {name: value.tolist() for name, value in outputs.items()}

    return app


# ----- orchestration -------------------------------------------------------------------------

def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until_up(url: str, path: str, process: subprocess.Popen[bytes]) -> None:
    import httpx

    for _ in range(600):
        if process.poll() is not None:
            raise RuntimeError(f"{url}: server exited with {process.returncode}")
        try:
            if httpx.get(url + path, timeout=1).status_code in (200, 404, 405):
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not start")


def build_models(work: Path, image: int, instances: int | None = None
                 ) -> dict[str, dict[str, Any]]:
    """Write the seed MLP and ResNet-18 (random weights) as uploads and as plain files;
    ``instances``: ResNet-18's ``instance_group`` count (None: the server's default)."""
    from bench import nets
    from engine.graph.params import save_params

    symbol = nets.resnet18_v1()
    params = nets.random_params(symbol, (1, 3, image, image))
    aux = set(symbol.list_auxiliary_states())
    files = {
        "seed_mlp": ((MLP_DIR / "seed_mlp-symbol.json").read_bytes(),
                     (MLP_DIR / "seed_mlp-0000.params").read_bytes(), [-1, 512]),
        "resnet18": (symbol.tojson().encode(), save_params(None, {
            f"{'aux' if name in aux else 'arg'}:{name}": value for name, value in params.items()
            if name != "data"}), [-1, 3, image, image]),
    }
    models = {}
    for name, (symbol_bytes, params_bytes, shape) in files.items():
        (work / "plain" / name).mkdir(parents=True)
        (work / "plain" / name / "model-symbol.json").write_bytes(symbol_bytes)
        (work / "plain" / name / "model-0000.params").write_bytes(params_bytes)
        config = {"inputs": [{"name": "data", "datatype": "FP32", "shape": shape}],
                  "max_batch_size": 64 if name == "seed_mlp" else 16,
                  # ResNet's callers come back 1-2 ms after their batch ends (8 responses out,
                  # 8 image bodies in): a 2 ms window lets them form one batch again, short
                  # beside its compute (35 ms at 64x64, 300 ms at 224x224, batch 8).
                  "dynamic_batching": {"max_queue_delay_us": 500 if name == "seed_mlp" else 2000}}
        if instances is not None and name == "resnet18":
            config["instance_group"] = [{"count": instances, "kind": "KIND_CPU"}]
        models[name] = {"symbol": symbol_bytes, "params": params_bytes, "config": config}
    return models


def service_args(work: Path, port: int, grpc_port: int = 0) -> list[str]:
    """Options of the served `python -m service`: a repository in `work`, filled by `upload`
    (`grpc_port` 0: no gRPC server). The directory is made here, as the server refuses a missing
    one (not with --create-model-repository: a compared older checkout lacks that option)."""
    (work / "repo").mkdir(exist_ok=True)
    return ["--model-repository", str(work / "repo"), "--port", str(port), "--grpc-port",
            str(grpc_port), "--log-level", "warning", "--admin-token", TOKEN]


def start_process(args: list[str], work: Path, name: str,
                  root: Path = ROOT) -> subprocess.Popen[bytes]:
    """Start a server process running the code of the checkout at `root`."""
    log = (work / f"{name}.log").open("wb")
    # Each server uses the cores as it does by default: hybridserve one batch at a time on
    # every core, the minimal app one request at a time through `Model.infer`'s defaults.
    path = os.pathsep.join(filter(None, (str(root), os.environ.get("PYTHONPATH"))))
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.Popen(args, cwd=root, stdout=log, stderr=subprocess.STDOUT, env=env)


def stop_process(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def seed_mlp_input() -> np.ndarray:
    """The seed MLP's conformance input, (1, 512) float32."""
    with np.load(MLP_DIR / "io.npz") as data:
        return data["data"].astype(np.float32)


def v2_binary_request(model: str, tensor: np.ndarray) -> bytes:
    """A V2 infer request sending `tensor` as binary data and asking for binary outputs."""
    header = json.dumps({"inputs": [{"name": "data", "datatype": "FP32",
                                     "shape": list(tensor.shape),
                                     "parameters": {"binary_data_size": tensor.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    return http_request("POST", f"/v2/models/{model}/infer", header + tensor.tobytes(),
                        {"Inference-Header-Content-Length": str(len(header)),
                         "Content-Type": "application/octet-stream"})


def grpc_request(model: str, tensor: np.ndarray) -> bytes:
    """A serialized ModelInferRequest sending `tensor` as raw contents."""
    from service.grpc import inference_pb2 as pb

    request = pb.ModelInferRequest(model_name=model, raw_input_contents=[tensor.tobytes()])
    request.inputs.add(name="data", datatype="FP32", shape=tensor.shape)
    return request.SerializeToString()


def requests_for(image: int) -> dict[str, bytes]:
    """Pre-encoded HTTP requests for each (server, model) pair."""
    body = json.dumps({"model": "seed_mlp", "inputs": {"data": seed_mlp_input().tolist()}})
    json_headers = {"Content-Type": "application/json"}
    image_data = np.random.default_rng(0).random((1, 3, image, image), np.float32)
    return {
        "floor": http_request("GET", "/v2/health/live"),
        "hybridserve/seed_mlp": http_request("POST", "/predict", body.encode(), json_headers),
        "minimal/seed_mlp": http_request("POST", "/predict", body.encode(), json_headers),
        "hybridserve/resnet18": v2_binary_request("resnet18", image_data),
        "minimal/resnet18": http_request(
            "POST", "/raw/resnet18", image_data.tobytes(),
            {"x-shape": ",".join(str(dim) for dim in image_data.shape)}),
        "grpc/floor": b"",  # an empty ServerLiveRequest
        "grpc/seed_mlp": grpc_request("seed_mlp", seed_mlp_input()),
        "grpc/resnet18": grpc_request("resnet18", image_data),
    }


def upload(url: str, models: dict[str, dict[str, Any]]) -> None:
    import httpx

    for name, model in models.items():
        response = httpx.post(f"{url}/models/{name}", headers={"Authorization": f"Bearer {TOKEN}"},
                              files={"symbol": ("s", model["symbol"]),
                                     "params": ("p", model["params"]),
                                     "config": ("c", json.dumps(model["config"]).encode())},
                              timeout=300)
        response.raise_for_status()


def measure(seconds: float, resnet_seconds: float, image: int, root: Path = ROOT,
            compared: bool = False, grpc: bool = True, resnet_only: bool = False,
            instances: int | None = None,
            levels: tuple[int, ...] = RESNET_ONLY_CONCURRENCY) -> list[dict[str, Any]]:
    """Start the servers, run every (target, concurrency), stop the servers.

    `root`: the checkout whose server is measured; `compared`: our server only (no minimal
    app, no executor reference, no gRPC floor), for `compare`; `grpc`: the gRPC rows too;
    `resnet_only`: ResNet-18 served over REST (at `levels`) and the executor's reference,
    nothing else; `instances`: ResNet-18's instance count.
    """
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        work = Path(directory)
        models = build_models(work, image, instances)
        requests = {}
        for key, request in requests_for(image).items():
            requests[key] = work / (key.replace("/", "_") + ".http")
            requests[key].write_bytes(request)
        ports = {"hybridserve": free_port(), "minimal": free_port()}
        urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
        grpc_port = free_port()
        urls["grpc"] = f"127.0.0.1:{grpc_port}"
        servers = [start_process([sys.executable, "-m", "service",
                                  *service_args(work, ports["hybridserve"], grpc_port)],
                                 work, "hybridserve", root)]
        if not compared and not resnet_only:
            servers.append(start_process([sys.executable, __file__, "--minimal-app",
                                          str(work / "plain"), str(ports["minimal"])],
                                         work, "minimal"))
        try:
            wait_until_up(urls["hybridserve"], "/v2/health/ready", servers[0])
            if len(servers) > 1:
                wait_until_up(urls["minimal"], "/docs", servers[1])
            upload(urls["hybridserve"], models)
            plan = [("floor", "hybridserve", "floor", seconds)]
            if not compared and grpc:
                plan.append(("grpc/floor", "grpc", "grpc/floor", seconds))
            ours = ("hybridserve", "grpc") if compared else ("hybridserve", "grpc", "minimal")
            ours = ours if grpc else tuple(server for server in ours if server != "grpc")
            for model, duration in (("seed_mlp", seconds), ("resnet18", resnet_seconds))[
                    :1 if resnet_seconds <= 0 else 2]:
                plan += [(f"{server}/{model}", server, f"{server}/{model}", duration)
                         for server in ours]
            if resnet_only:
                plan = [("hybridserve/resnet18", "hybridserve", "hybridserve/resnet18",
                         resnet_seconds)]
            for label, server, key, duration in plan:
                table = GRPC_CONCURRENCY if server == "grpc" else CONCURRENCY
                for concurrency in levels if resnet_only else table[label.rpartition("/")[2]]:
                    reference = not compared and (label, concurrency) == (
                        "hybridserve/resnet18", REFERENCE_CONCURRENCY)
                    if reference:
                        model = load_plain(work / "plain" / "resnet18")
                        before = executor_images(model, image)
                    url = urls[server]
                    if server == "grpc":
                        url += "/ServerLive" if label == "grpc/floor" else "/ModelInfer"
                    result = run_load(url, requests[key], concurrency, duration,
                                      min(2.0, duration / 2))
                    rows.append({"target": label, "concurrency": concurrency, **result})
                    print(_row(rows[-1]), flush=True)
                    if reference:
                        after = executor_images(model, image)
                        rows += executor_rows(before, after)
        finally:
            for process in servers:
                stop_process(process)
    return rows


def compare(against: Path, rounds: int, seconds: float, resnet_seconds: float,
            image: int, grpc: bool = True, resnet_only: bool = False) -> None:
    """Serve the checkout `against` ("old") and this one ("new") in turn, `rounds` times;
    print each run's rows, then each target's medians over the rounds and new/old."""
    runs: dict[str, list[list[dict[str, Any]]]] = {"old": [], "new": []}
    trees = [("old", against.resolve()), ("new", ROOT)]
    for round_index in range(rounds):
        for label, root in trees if round_index % 2 == 0 else trees[::-1]:
            print(f"round {round_index + 1}, {label} ({root}), load average "
                  f"{os.getloadavg()[0]:.2f}", flush=True)
            runs[label].append(measure(seconds, resnet_seconds, image, root, compared=True,
                                       grpc=grpc, resnet_only=resnet_only))
    print("\nmedians over the rounds (old = --against, new = this checkout):")
    print("| target                 |   c | old req/s | new req/s | new/old | old p50 | new p50 "
          "| old p99 | new p99 | old range | new range |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in runs["new"][0]:
        key = (row["target"], row["concurrency"])
        old, new = (_medians(runs[label], key) for label in ("old", "new"))
        print(f"| {key[0]:<22} | {key[1]:>3} | {old['rps']:>9.1f} | {new['rps']:>9.1f} | "
              f"{new['rps'] / old['rps']:>7.3f} | {old['p50_ms']:>7.2f} | {new['p50_ms']:>7.2f} "
              f"| {old['p99_ms']:>7.2f} | {new['p99_ms']:>7.2f} "
              f"| {old['low']:.1f}-{old['high']:.1f} | {new['low']:.1f}-{new['high']:.1f} |")


def compare_instances(counts: list[int], rounds: int, resnet_seconds: float, image: int,
                      concurrency: int) -> None:
    """Serve ResNet-18 with each of `counts` instances in turn (the order alternating, so that
    the machine's drift falls on every count), `rounds` times, at `concurrency` over REST;
    print each run, then each count's median requests/s, p50/p99 and range, against the
    first count's."""
    runs: dict[int, list[list[dict[str, Any]]]] = {count: [] for count in counts}
    for round_index in range(rounds):
        for count in counts if round_index % 2 == 0 else counts[::-1]:
            print(f"round {round_index + 1}, {count} instance(s), load average "
                  f"{os.getloadavg()[0]:.2f}", flush=True)
            runs[count].append(measure(0, resnet_seconds, image, compared=True, grpc=False,
                                       resnet_only=True, instances=count,
                                       levels=(concurrency,)))
    print(f"\nmedians over the rounds, ResNet-18 at concurrency {concurrency}:")
    print(f"| instances | req/s | vs {counts[0]} | p50 ms | p99 ms | range req/s |")
    print("|---|---|---|---|---|---|")
    key = ("hybridserve/resnet18", concurrency)
    first = _medians(runs[counts[0]], key)
    for count in counts:
        figures = _medians(runs[count], key)
        print(f"| {count} | {figures['rps']:.1f} | {figures['rps'] / first['rps']:.3f} | "
              f"{figures['p50_ms']:.1f} | {figures['p99_ms']:.1f} | "
              f"{figures['low']:.1f}-{figures['high']:.1f} |")


def _medians(runs: list[list[dict[str, Any]]], key: tuple[str, int]) -> dict[str, float]:
    """Median requests/s, p50 and p99 of one (target, concurrency) over several runs, and the
    lowest and highest requests/s (the spread)."""
    rows = [row for run in runs for row in run if (row["target"], row["concurrency"]) == key]
    medians = {figure: float(np.median([row[figure] for row in rows]))
               for figure in ("rps", "p50_ms", "p99_ms")}
    return {**medians, "low": min(row["rps"] for row in rows),
            "high": max(row["rps"] for row in rows)}


def load_plain(model_dir: Path) -> Any:
    """The model `build_models` wrote as plain files in ``model_dir``."""
    import engine

    return engine.load_model(model_dir / "model-symbol.json", model_dir / "model-0000.params")


def executor_images(model: Any, image: int,
                    batches: tuple[int, ...] = EXECUTOR_BATCHES) -> dict[int, float]:
    """ResNet-18's images/s through `Model.infer` in this process, per batch size, each over
    2 s at least.

    The library's defaults (every core), as the server's one compute thread runs a batch: the
    same batch size is the reference for the served images/s at concurrency 4, the best one
    for concurrency 8.
    """
    images = {}
    for batch in batches:
        feed = {"data": np.random.default_rng(batch).random((batch, 3, image, image),
                                                            np.float32)}
        model.infer(feed)
        runs, started = 0, time.perf_counter()
        while runs < 2 or time.perf_counter() - started < 2.0:
            model.infer(feed)
            runs += 1
        images[batch] = runs * batch / (time.perf_counter() - started)
    return images


def turn_ratios(served: list[float], alone: list[float]) -> list[float]:
    """Each served turn's rate against the mean of the in-process rates measured just before
    and just after it (``alone`` has one more, the first before the first turn)."""
    if len(alone) != len(served) + 1:
        raise ValueError(f"{len(served)} served turns need {len(served) + 1} in-process ones")
    return [rate / ((before + after) / 2) for rate, before, after in zip(served, alone, alone[1:])]


def served_in_turns(turns: int, seconds: float, image: int) -> None:
    """ResNet-18 served at concurrency `REFERENCE_CONCURRENCY` and the executor at that batch
    in this process, in turns, `turns` times (the executor before the first and after each):
    each turn's served images/s against the mean of the executor's on either side, so that
    the machine's drift over minutes falls on both. Prints each turn and the median ratio."""
    batch = REFERENCE_CONCURRENCY
    with tempfile.TemporaryDirectory() as directory:
        work = Path(directory)
        models = build_models(work, image)
        request = work / "resnet18.http"
        request.write_bytes(requests_for(image)["hybridserve/resnet18"])
        port = free_port()
        server = start_process([sys.executable, "-m", "service", *service_args(work, port)],
                               work, "hybridserve")
        try:
            url = f"http://127.0.0.1:{port}"
            wait_until_up(url, "/v2/health/ready", server)
            upload(url, {"resnet18": models["resnet18"]})
            model = load_plain(work / "plain" / "resnet18")
            alone = [executor_images(model, image, (batch,))[batch]]
            served = []
            for turn in range(turns):
                served.append(run_load(url, request, batch, seconds, min(2.0, seconds / 2)))
                alone.append(executor_images(model, image, (batch,))[batch])
                ratio = turn_ratios([served[-1]["rps"]], alone[-2:])[0]
                print(f"turn {turn + 1}: served {served[-1]['rps']:.1f} images/s (p99 "
                      f"{served[-1]['p99_ms']:.1f} ms), executor b{batch} {alone[-2]:.1f} and "
                      f"{alone[-1]:.1f}: {100 * ratio:.0f}%", flush=True)
        finally:
            stop_process(server)
    ratios = turn_ratios([row["rps"] for row in served], alone)
    print(f"ResNet-18 at concurrency {batch} against the executor at b{batch}, {turns} turns: "
          f"median {100 * float(np.median(ratios)):.0f}% (range {100 * min(ratios):.0f}-"
          f"{100 * max(ratios):.0f}%; target >= 90%): {_met(float(np.median(ratios)) >= 0.9)}")


def executor_rows(before: dict[int, float], after: dict[int, float]) -> list[dict[str, Any]]:
    """Table rows of the executor's images/s, the mean of the runs before and after."""
    rows = []
    for batch in EXECUTOR_BATCHES:
        images = (before[batch] + after[batch]) / 2
        rows.append({"target": f"executor/resnet18 b{batch}", "concurrency": 0,
                     "rps": images, "p50_ms": 1e3 * batch / images, "p99_ms": float("nan"),
                     "failures": 0, "before": before[batch], "after": after[batch]})
        print(_row(rows[-1]) + f" before {before[batch]:.1f}, after {after[batch]:.1f}",
              flush=True)
    return rows


def _row(row: dict[str, Any]) -> str:
    return (f"| {row['target']:<22} | {row['concurrency']:>3} | {row['rps']:>9.1f} | "
            f"{row['p50_ms']:>8.2f} | {row['p99_ms']:>8.2f} | {row['failures']:>4} |")


def grpc_ratios(rows: list[dict[str, Any]]) -> list[str]:
    """gRPC's requests/s over REST's at each concurrency both were run at, and the seed MLP's
    share of the gRPC floor."""
    rest = {(row["target"].rpartition("/")[2], row["concurrency"]): row for row in rows
            if row["target"].startswith("hybridserve/") or row["target"] == "floor"}
    floor = {row["concurrency"]: row for row in rows if row["target"] == "grpc/floor"}
    lines = []
    for row in rows:
        if row["target"].startswith("grpc/"):
            model, concurrency = row["target"].split("/")[1], row["concurrency"]
            other = rest.get((model, concurrency))
            if other is not None:
                lines.append(f"{model} c={concurrency}: gRPC {row['rps']:.1f} req/s, "
                             f"REST {other['rps']:.1f} req/s ({row['rps'] / other['rps']:.2f}x); "
                             f"p99 {row['p99_ms']:.2f} vs {other['p99_ms']:.2f} ms")
            if model == "seed_mlp" and concurrency in floor:
                share = row["rps"] / floor[concurrency]["rps"]
                lines.append(f"  seed_mlp over gRPC: {100 * share:.0f}% of the gRPC floor "
                             f"(ServerLive) at c={concurrency}")
    return lines


def verdict(rows: list[dict[str, Any]]) -> list[str]:
    """The targets: the seed MLP at concurrency 64, ResNet-18 at concurrency 4 and 8."""
    at64 = {row["target"]: row for row in rows if row["concurrency"] == 64}
    lines = []
    if "minimal/seed_mlp" in at64:
        ours, minimal, floor = (at64["hybridserve/seed_mlp"], at64["minimal/seed_mlp"],
                                at64["floor"])
        speedup = ours["rps"] / minimal["rps"]
        share = ours["rps"] / floor["rps"]
        lines += [f"seed MLP at concurrency 64: {speedup:.2f}x the minimal app's requests/s "
                  f"(target >= 1.5x): {_met(speedup >= 1.5)}",
                  f"p99 {ours['p99_ms']:.2f} ms vs minimal {minimal['p99_ms']:.2f} ms (target "
                  f"lower): {_met(ours['p99_ms'] < minimal['p99_ms'])}",
                  f"{100 * share:.0f}% of the HTTP floor's requests/s (target >= 70%): "
                  f"{_met(share >= 0.7)}"]
    executor = [row for row in rows if row["target"].startswith("executor/")]
    same_batch = [row for row in executor
                  if row["target"].endswith(f" b{REFERENCE_CONCURRENCY}")]
    at_reference = [row for row in rows if row["target"] == "hybridserve/resnet18"
                    and row["concurrency"] == REFERENCE_CONCURRENCY]
    if same_batch and at_reference:
        ratio = at_reference[0]["rps"] / same_batch[0]["rps"]
        lines.append(f"ResNet-18 at concurrency {REFERENCE_CONCURRENCY}: "
                     f"{at_reference[0]['rps']:.1f} images/s served, {100 * ratio:.0f}% of the "
                     f"executor's {same_batch[0]['rps']:.1f} at b{REFERENCE_CONCURRENCY} "
                     f"(target >= 90%): {_met(ratio >= 0.9)}")
    served = [row for row in rows if row["target"] == "hybridserve/resnet18"
              and row["concurrency"] == 8]
    if executor and served:
        best = max(executor, key=lambda row: row["rps"])
        ratio = served[0]["rps"] / best["rps"]
        lines.append(f"ResNet-18 at concurrency 8: {served[0]['rps']:.1f} images/s served, "
                     f"{100 * ratio:.0f}% of the executor's {best['rps']:.1f} at "
                     f"{best['target'].rpartition(' ')[2]} (target >= 80%): {_met(ratio >= 0.8)}")
    return lines


def _met(condition: bool) -> str:
    return "met" if condition else "NOT met"


def main() -> None:
    """Parse options; run a role (load generator, minimal app) or the whole benchmark."""
    if len(sys.argv) > 1 and sys.argv[1] in ("--load", "--grpc-load"):
        url, request_file, concurrency, seconds, warmup = sys.argv[2:7]
        import uvloop

        request = Path(request_file).read_bytes()
        if sys.argv[1] == "--load":
            load = _load(url, request, int(concurrency), float(seconds), float(warmup))
        else:
            address, method = url.split("/", 1)
            load = _grpc_load(address, request, int(concurrency), float(seconds),
                              float(warmup), method)
        result = uvloop.run(load)
        print(json.dumps(result))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--minimal-app":
        import uvicorn

        uvicorn.run(minimal_app(Path(sys.argv[2])), host="127.0.0.1", port=int(sys.argv[3]),
                    log_level="warning", access_log=False)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds (MLP, floor)")
    parser.add_argument("--resnet-seconds", type=float, default=8.0,
                        help="measured seconds (0: skip ResNet-18)")
    parser.add_argument("--image", type=int, default=224, help="ResNet-18 input height/width")
    parser.add_argument("--against", type=Path, help="a checkout of another commit to serve "
                        "side by side with this one")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of --against")
    parser.add_argument("--no-grpc", action="store_true", help="REST rows only")
    parser.add_argument("--resnet-only", action="store_true",
                        help="ResNet-18 over REST at concurrency 1, 4 and 8, and the executor's "
                        "reference, only")
    parser.add_argument("--instances", type=lambda text: [int(n) for n in text.split(",")],
                        help="ResNet-18's instance counts to compare, e.g. 1,2: --rounds "
                        "interleaved rounds at --concurrency, REST only")
    parser.add_argument("--concurrency", type=int, default=8,
                        help="ResNet-18's concurrency for --instances")
    parser.add_argument("--turns", type=int, default=0,
                        help="ResNet-18 served at concurrency 4 and the executor at batch 4 "
                        "in turns, this many times (--resnet-seconds each served turn)")
    args = parser.parse_args()
    print(f"machine: nproc {os.cpu_count()}, {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}, NumPy {np.__version__}")
    if args.turns:
        served_in_turns(args.turns, args.resnet_seconds, args.image)
        return
    print("| target                 |   c |     req/s |  p50 ms  |  p99 ms  | fail |")
    print("|------------------------|-----|-----------|----------|----------|------|")
    if args.instances:
        compare_instances(args.instances, args.rounds, args.resnet_seconds, args.image,
                          args.concurrency)
        return
    if args.against is not None:
        compare(args.against, args.rounds, args.seconds, args.resnet_seconds, args.image,
                not args.no_grpc, args.resnet_only)
        return
    rows = measure(args.seconds, args.resnet_seconds, args.image, grpc=not args.no_grpc,
                   resnet_only=args.resnet_only)
    print("\n".join(verdict(rows) + grpc_ratios(rows)))


if __name__ == "__main__":
    main()
