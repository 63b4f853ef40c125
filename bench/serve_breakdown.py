"""Where ``POST /predict`` spends the server's event loop: one JSON request, stage by stage.

`bench/serve.py` compares `/predict` with the HTTP floor (``GET /v2/health/live``); this splits
the gap. The real server (`python -m service`) runs with diagnostic routes in front of its app.
Each does one more stage of `/predict`'s work on the same request, then answers as the health
probe does:

- ``floor``: ``GET /v2/health/live``;
- ``body``: ``POST /breakdown/body`` reads the JSON body (the seed MLP's: 10.6 KB);
- ``parse``: ... and parses it (`service.tensors.json.parse`, simdjson);
- ``inputs``: ... and decodes and checks it into arrays (`InferenceService.predict_inputs`);
- ``predict``: ``POST /predict`` itself: the above, then batching, inference and the reply;
- ``lists``, for comparison: the body read and decoded as before simdjson
  (`service.tensors.json`): orjson makes Python lists, NumPy reads them (then the same checks);
- ``v2_json`` and ``v2_binary``, for comparison: the same tensor through the V2 infer route, as
  JSON ``data`` and as binary tensor data (a 155-byte JSON header for the seed MLP).

Every stage runs at concurrency 64 with `bench/serve.py`'s load generator, which keeps the
event loop (the server's main thread) busy all along: its CPU time per request is the stage's
cost, and the difference to the stage before is what that step adds. Compute threads are
reported apart (they run beside the loop, sharing its GIL), and so is the load generator's own
CPU: on two cores, what all three spend per request bounds the requests/s any route can reach.

    .venv/bin/python bench/serve_breakdown.py                  # ~1 minute
    .venv/bin/python bench/serve_breakdown.py --rounds 3       # stages interleaved 3 times
    .venv/bin/python bench/serve_breakdown.py --image 64       # a 250 KB JSON image instead
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)] if str(ROOT) not in sys.path else []

from bench import serve  # noqa: E402 - after the path set-up above

STAGES = ("floor", "body", "parse", "inputs", "predict")
REFERENCE = "lists"  # decoded the way `inputs` was before simdjson; compared with ``body``
DIAGNOSTIC = ("body", "parse", "inputs", REFERENCE)  # answered by `Stages`
V2_ROUTES = ("v2_json", "v2_binary")  # the same tensor through V2 infer; compared with ``floor``
CONCURRENCY = 64
LIVE = b'{"live":true}'


# ----- the server side (runs in the server's process) ----------------------------------------

class Stages:
    """ASGI app answering ``POST /breakdown/{stage}`` after `/predict`'s work up to that stage;
    everything else goes on to ``app``."""

    def __init__(self, app: Any, runtime: Any) -> None:
        self.app = app
        self.runtime = runtime

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        stage = scope.get("path", "").removeprefix("/breakdown/")
        if scope["type"] != "http" or stage not in DIAGNOSTIC:
            await self.app(scope, receive, send)
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        from service.dataplane.checks import check_inputs
        from service.tensors import json as json_tensors

        if stage == "parse":
            json_tensors.parse(body)
        elif stage == "inputs":
            self.runtime.inference.predict_inputs(body)
        elif stage == REFERENCE:
            request = json_tensors.load_json(body)
            handle = self.runtime.repository.get(request["model"], request.get("version"))
            check_inputs(handle, {
                name: json_tensors.array_from_json(value, handle.input_dtypes[name], name)
                for name, value in request["inputs"].items()})
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(LIVE)).encode())]})
        await send({"type": "http.response.body", "body": LIVE})


def run_server(argv: list[str]) -> int:
    """`python -m service` with `argv`, its apps wrapped in `Stages`."""
    from service.__main__ import main
    from service.rest import app as app_module

    create_app = app_module.create_app

    def with_stages(runtime: Any, **options: Any) -> Stages:
        return Stages(create_app(runtime, **options), runtime)

    app_module.create_app = with_stages  # `service.__main__.serve` imports it when it starts
    return main(argv)


# ----- the measurement -----------------------------------------------------------------------

def cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU seconds used so far by the process's main thread, and by all its other threads."""
    tick = os.sysconf("SC_CLK_TCK")
    main = others = 0.0
    for thread in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{thread}/stat").read_text()
        except OSError:
            continue  # the thread ended
        fields = stat[stat.rindex(")") + 2:].split()
        used = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
        if int(thread) == pid:
            main += used
        else:
            others += used
    return main, others


def stage_requests(image: int | None) -> dict[str, bytes]:
    """The HTTP request of each stage: a `/predict` request, re-addressed. The seed MLP's, or
    with `image`, ResNet-18's with an ``image`` x ``image`` RGB image as nested lists."""
    requests = serve.requests_for(64)
    model, tensor = "seed_mlp", serve.seed_mlp_input()
    if image is not None:
        model = "resnet18"
        tensor = np.random.default_rng(0).random((1, 3, image, image), np.float32)
    body = json.dumps({"model": model, "inputs": {"data": tensor.tolist()}}).encode()
    predict = serve.http_request("POST", "/predict", body, {"Content-Type": "application/json"})
    staged = {stage: predict.replace(b"POST /predict ", f"POST /breakdown/{stage} ".encode(), 1)
              for stage in DIAGNOSTIC}
    v2_json = json.dumps({"inputs": [{"name": "data", "datatype": "FP32",
                                      "shape": list(tensor.shape), "data": tensor.tolist()}]})
    return {"floor": requests["floor"], **staged, "predict": predict,
            "v2_json": serve.http_request("POST", f"/v2/models/{model}/infer", v2_json.encode(),
                                          {"Content-Type": "application/json"}),
            "v2_binary": serve.v2_binary_request(model, tensor)}


def measure_stage(url: str, pid: int, request_file: Path, seconds: float) -> dict[str, float]:
    """Requests/s and the server's CPU per request, sampled inside the load's steady state."""
    warmup = 1.0
    command = serve.load_command(url, request_file, CONCURRENCY, seconds, warmup)
    generator = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    time.sleep(warmup + 0.3)
    main_before, others_before = cpu_seconds(pid)
    load_before = sum(cpu_seconds(generator.pid))
    started = time.perf_counter()
    time.sleep(seconds - 0.6)
    main_after, others_after = cpu_seconds(pid)
    load_after = sum(cpu_seconds(generator.pid))
    elapsed = time.perf_counter() - started
    result = json.loads(generator.communicate(timeout=seconds + 120)[0])
    if result["failures"]:
        raise RuntimeError(f"{request_file.name}: failed requests, statuses {result['statuses']}")
    loop_share = (main_after - main_before) / elapsed
    per_request = 1e6 / elapsed / result["rps"]
    return {"rps": result["rps"], "loop_share": loop_share,
            "loop_us": loop_share / result["rps"] * 1e6,
            "others_us": (others_after - others_before) * per_request,
            "load_us": (load_after - load_before) * per_request}


def measure(seconds: float, rounds: int, image: int | None) -> dict[str, list[dict[str, float]]]:
    """Start the server, upload the model, measure every stage `rounds` times."""
    results: dict[str, list[dict[str, float]]] = {
        stage: [] for stage in (*STAGES, REFERENCE, *V2_ROUTES)}
    with tempfile.TemporaryDirectory() as directory:
        work = Path(directory)
        name = "seed_mlp" if image is None else "resnet18"
        models = {name: serve.build_models(work, image or 64)[name]}
        files = {}
        for stage, request in stage_requests(image).items():
            files[stage] = work / f"{stage}.http"
            files[stage].write_bytes(request)
        port = serve.free_port()
        url = f"http://127.0.0.1:{port}"
        server = serve.start_process([sys.executable, __file__, "--server",
                                      *serve.service_args(work, port)], work, "server")
        try:
            serve.wait_until_up(url, "/v2/health/ready", server)
            serve.upload(url, models)
            for _ in range(rounds):
                for stage in results:
                    results[stage].append(measure_stage(url, server.pid, files[stage], seconds))
        finally:
            serve.stop_process(server)
    return results


def report(results: dict[str, list[dict[str, float]]]) -> list[str]:
    """A table: per stage, the median over rounds; its share of the floor's requests/s; what
    it adds to the stage before (`REFERENCE`: to ``body``; the V2 routes: to ``floor``)."""
    def median(stage: str, key: str) -> float:
        values = sorted(row[key] for row in results[stage])
        return values[len(values) // 2]

    floor = median("floor", "rps")
    lines = ["| stage     |     req/s | % of floor | loop busy | loop µs/req | added µs "
             "| other threads µs/req | load generator µs/req |",
             "|-----------|-----------|------------|-----------|-------------|----------"
             "|----------------------|-----------------------|"]
    previous = dict(zip(STAGES[1:], STAGES), **{REFERENCE: "body"},
                    **dict.fromkeys(V2_ROUTES, "floor"))
    for stage in results:
        cost = median(stage, "loop_us")
        added = cost - (median(previous[stage], "loop_us") if stage in previous else 0.0)
        lines.append(f"| {stage:<9} | {median(stage, 'rps'):>9.0f} | "
                     f"{100 * median(stage, 'rps') / floor:>9.0f}% | "
                     f"{100 * median(stage, 'loop_share'):>8.0f}% | {cost:>11.1f} | "
                     f"{added:>8.1f} | {median(stage, 'others_us'):>20.1f} | "
                     f"{median(stage, 'load_us'):>21.1f} |")
    return lines


def main() -> None:
    """Run the server role, or the whole breakdown."""
    if len(sys.argv) > 1 and sys.argv[1] == "--server":
        sys.exit(run_server(sys.argv[2:]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per stage")
    parser.add_argument("--image", type=int, default=None,
                        help="ResNet-18 with a JSON image of this height/width instead of the "
                        "seed MLP's 512 numbers")
    parser.add_argument("--rounds", type=int, default=1,
                        help="times every stage is measured, interleaved (median reported)")
    args = parser.parse_args()
    model = "seed MLP" if args.image is None else f"ResNet-18, {args.image}x{args.image} JSON"
    print(f"machine: nproc {os.cpu_count()}; {model}, concurrency {CONCURRENCY}, "
          f"{args.rounds} round(s) of {args.seconds:g} s per stage")
    print("\n".join(report(measure(args.seconds, args.rounds, args.image))))


if __name__ == "__main__":
    main()
