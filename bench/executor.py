"""Benchmark: the compiled CPU executor against hand-written NumPy, ONNX Runtime and the floor.

Usage: ``python bench/executor.py [--quick] [--threads N]``. Prints, in one run:

* the seed MLP (512 → 256 → 128 → 2) at batch 1 and 64: ``Model.infer``, the plan's own
  ``run`` and a hand-written NumPy sequence of the same matmuls into preallocated outputs,
  written with ``np.matmul`` and again with ``np.dot`` (the call the plan makes);
* the peer table, at every core (each runtime's default) and again at one thread each: the
  seed MLP (batch 1, 64), ResNet-18 v1 (batch 1, 4, 8), MobileNet v2 1.0 (batch 1) and
  ResNet-50 v2 (batch 1) at 224×224 through ``Model.infer`` in fp32 and in bf16
  (``precision="bf16"``), and through ONNX Runtime on the same weights (exported by
  `engine.onnx.export`; graph optimisations at their default, all). Each runtime runs in its own
  process and they take turns round by round; the columns give ours ÷ ORT against the issue's
  target, bf16 ÷ fp32, and at every core bf16 against OpenVINO's bf16 times on this machine
  from issue #36 (OpenVINO is not installed here), then each runtime's distance from the GEMM
  floor (conv/FC FLOPs over the float32 2048³ matmul rate measured at the same thread count),
  plus our steps grouped by kind, and at every core how much slower the vCPUs read each
  other's data than their own just before and after the case (`bench/vcpus.py`: on a VM whose
  vCPUs at times share no cache);
* bf16 against fp32 on ResNet-18 (random weights): top-1 agreement over 256 random 224×224
  images, and the largest difference relative to the largest logit.

ONNX Runtime and onnx are dev dependencies (``pip install -e .[dev]``), not runtime ones.
Times are medians over interleaved rounds (best in brackets), after a warm-up run; a round
is 200 calls of the MLP, or calls of a CNN for about `ROUND_SECONDS`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

# This checkout's engine, not the one the environment has installed (an editable install
# points at whichever checkout made it), and the sibling modules.
sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

import nets  # noqa: E402 - the sibling modules, found through the path set just above
import vcpus  # noqa: E402

import engine  # noqa: E402
from engine.cpu import parallel  # noqa: E402
from engine.graph.infer import infer_shapes  # noqa: E402
from engine.runtime import Model  # noqa: E402

MLP_CALLS = 200  # calls per timed round of the MLP (one call is microseconds)
MLP_ROUNDS = 31  # at least: a round takes milliseconds, so one burst of load can skew a few
# A pause before each runtime's turn. After a run, ONNX Runtime's pool threads spin about 40 ms
# (measured: 40 ms of process CPU in the 50 ms after `session.run`) and OpenBLAS's for a while
# too: without it the other runtime's turn starts on a core the last one still burns, which
# halved ORT's all-core rate against ours (ResNet-18, batch 1: 58 vs 17.7 ms median).
SETTLE_SECONDS = 0.1
# A round of a CNN case runs calls enough for about this long (each runtime the same count):
# single calls of a ResNet-18 (30 ms) gave medians of 7 rounds 25% above the best on a busy
# machine, where rounds of several calls average over its bursts.
ROUND_SECONDS = 0.15
GEMM_SIZE = 2048


def blas_threads() -> int:
    """Most threads any loaded BLAS uses (threadpoolctl when present, else the CPU count)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return os.cpu_count() or 1
    counts = [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]
    return max(counts) if counts else os.cpu_count() or 1


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it (lscpu's "Model name"), where it does."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            return next((line.split(":", 1)[1].strip() for line in info
                         if line.startswith("model name")), "unknown CPU")
    except OSError:
        return "unknown CPU"


def timings(action: Callable[[], object], repeat: int, calls: int = 1) -> tuple[float, float]:
    """(median, best) seconds per call over ``repeat`` rounds of ``calls`` calls, after warm-up."""
    return interleaved({"only": action}, repeat, calls)["only"]


def interleaved(actions: dict[str, Callable[[], object]], repeat: int,
                calls: int = 1) -> dict[str, tuple[float, float]]:
    """`timings` of several actions, taking turns round by round so load hits them alike."""
    for action in actions.values():
        action()
    rounds: dict[str, list[float]] = {name: [] for name in actions}
    for turn in range(repeat):
        order = list(actions.items())
        for name, action in order if turn % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            for _ in range(calls):
                action()
            rounds[name].append((time.perf_counter() - start) / calls)
    return {name: (statistics.median(times), min(times)) for name, times in rounds.items()}


def sgemm_flops(repeat: int) -> float:
    """Measured float32 FLOP/s of one large square NumPy matmul (best run)."""
    rng = np.random.default_rng(0)
    left, right = (rng.standard_normal((GEMM_SIZE, GEMM_SIZE), dtype=np.float32) for _ in "ab")
    out = np.empty((GEMM_SIZE, GEMM_SIZE), np.float32)
    _, best = timings(lambda: np.matmul(left, right, out=out), repeat)
    return 2 * GEMM_SIZE**3 / best


def graph_flops(model: Model, data_shape: tuple[int, ...]) -> int:
    """2 × multiply-adds of every Convolution and FullyConnected, from the inferred shapes."""
    graph = model.graph
    shapes = infer_shapes(graph, {**{n: a.shape for n, a in model.params.items()},
                                  "data": data_shape})
    total = 0
    for index, node in enumerate(graph.nodes):
        if node.op in ("Convolution", "FullyConnected"):
            weight = node.inputs[1]
            per_output = int(np.prod(shapes[weight.node][weight.index][1:]))
            total += 2 * int(np.prod(shapes[index][0])) * per_output
    return total


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def numpy_mlp(params: dict[str, np.ndarray], batch: int,
              product: Callable[..., Any] = np.matmul) -> Callable[[np.ndarray], np.ndarray]:
    """The MLP by hand: ``product`` into preallocated outputs, bias and ReLU in place."""
    weights = [params[f"dense{i}_weight"].T for i in range(3)]
    biases = [params[f"dense{i}_bias"] for i in range(3)]
    outs = [np.empty((batch, w.shape[1]), np.float32) for w in weights]

    def run(x: np.ndarray) -> np.ndarray:
        for index, (weight, bias, out) in enumerate(zip(weights, biases, outs)):
            product(x, weight, out=out)
            out += bias
            if index < 2:
                np.maximum(out, 0, out=out)
            x = out
        return out

    return run


def bench_mlp(repeat: int) -> None:
    """Model.infer, Plan.run and hand-written NumPy on the seed MLP."""
    rounds = max(repeat, MLP_ROUNDS)
    print("\nseed MLP 512-256(relu)-128(relu)-2, ms per call "
          f"(median of {rounds} rounds of {MLP_CALLS} calls [best])")
    print(f"{'batch':>5} {'Model.infer':>18} {'plan.run':>18} {'numpy matmul':>18} "
          f"{'numpy dot':>18} {'infer/matmul':>14} {'infer/dot':>14} {'max|diff|':>9}")
    symbol = nets.mlp()
    params = nets.random_params(symbol, (1, 512))
    model = engine.load_model(symbol, params, optimize=True)
    for batch in (1, 64):
        mlp_row(model, params, batch, rounds)


def mlp_row(model: Model, params: dict[str, np.ndarray], batch: int, repeat: int) -> None:
    """One batch size of the MLP table."""
    x = np.random.default_rng(batch).standard_normal((batch, 512), dtype=np.float32)
    feed = {"data": x}
    plan = model.plan_for(feed)
    by_hand = numpy_mlp(params, batch)
    by_dot = numpy_mlp(params, batch, np.dot)
    diff = float(np.abs(model.infer(feed)["dense2_output"] - by_hand(x)).max())
    times = interleaved({"infer": lambda: model.infer(feed), "run": lambda: plan.run(feed),
                         "matmul": lambda: by_hand(x), "dot": lambda: by_dot(x)},
                        repeat, MLP_CALLS)
    infer = times["infer"]
    cells = [f"{ms(med)} [{ms(best)}]" for med, best in times.values()]
    ratios = [f"{infer[0] / times[name][0]:.2f}× [{infer[1] / times[name][1]:.2f}×]"
              for name in ("matmul", "dot")]
    print(f"{batch:>5} {cells[0]:>18} {cells[1]:>18} {cells[2]:>18} {cells[3]:>18} "
          f"{ratios[0]:>14} {ratios[1]:>14} {diff:>9.1e}")


# -- ONNX Runtime as the peer, each runtime in its own process -----------------------------------

# (network, batch) cases and the largest ours/ORT ratio the issue asks for.
PEER_CASES = (("mlp", 1), ("mlp", 64), ("resnet18_v1", 1), ("resnet18_v1", 4),
              ("resnet18_v1", 8), ("mobilenetv2_1.0", 1), ("resnet50_v2", 1))
PEER_TARGETS = {"mlp": 1.0, "resnet18_v1": 1.0, "mobilenetv2_1.0": 1.5, "resnet50_v2": 1.0}
# OpenVINO's bf16 (AMX) seconds per call on the Intel machine at every core, from issue #36:
# the bf16 column's target is at most these.
OPENVINO_BF16 = {("resnet18_v1", 1): 8.2e-3, ("resnet18_v1", 8): 50.5e-3,
                 ("mobilenetv2_1.0", 1): 4.2e-3, ("resnet50_v2", 1): 23.7e-3}
RUNTIMES = ("ours", "bf16", "ort")  # ours in fp32, ours in bf16, ONNX Runtime
AGREEMENT_IMAGES = 256
NETWORKS: dict[str, tuple[Callable[[], Any], tuple[int, ...]]] = {
    "mlp": (nets.mlp, (512,)),
    "resnet18_v1": (nets.resnet18_v1, (3, 224, 224)),
    "mobilenetv2_1.0": (nets.mobilenet_v2, (3, 224, 224)),
    "resnet50_v2": (nets.resnet50_v2, (3, 224, 224)),
}


def case_inputs(name: str, batch: int) -> tuple[Any, dict[str, np.ndarray], np.ndarray]:
    """The symbol, its weights (seeded: every process builds the same) and the input."""
    build, shape = NETWORKS[name]
    symbol = build()
    params = nets.random_params(symbol, (1, *shape))
    data = np.random.default_rng(batch).standard_normal((batch, *shape), dtype=np.float32)
    return symbol, params, data


def ours_runner(name: str, batch: int, threads: int,
                precision: str = "fp32") -> tuple[Callable[[], Any], dict]:
    """`Model.infer` on the case, and its FLOPs and the sgemm rate at this thread count."""
    if threads:
        parallel.set_threads(threads)
    symbol, params, data = case_inputs(name, batch)
    model = engine.load_model(symbol, params, optimize=True, precision=precision)
    feed = {"data": data}
    model.infer(feed)  # first: loading may bring in another BLAS (SciPy's), limited here too
    if threads:
        from threadpoolctl import threadpool_limits

        threadpool_limits(threads, user_api="blas")
    info = {"output": next(iter(model.infer(feed).values())), "precision": model.precision,
            "flops": graph_flops(model, data.shape), "sgemm": sgemm_flops(3),
            "threads": f"BLAS {blas_threads()}, steps {parallel.threads()}, engine from "
                       f"{Path(engine.__file__).parent}"}
    if name != "mlp":
        kinds = step_kinds(model.plan_for(feed), feed, 3)
        info["kinds"] = ", ".join(
            f"{kind} {ms(seconds / batch)}" + (f" [{flop / seconds / 1e9:.0f}]" if flop else "")
            for kind, (seconds, flop) in sorted(kinds.items(), key=lambda item: -item[1][0]))
    return lambda: model.infer(feed), info


def ort_runner(name: str, batch: int, threads: int) -> tuple[Callable[[], Any], dict]:
    """An ONNX Runtime session (graph optimisations at their default, all) on the same weights,
    exported by `engine.onnx.export`; ``threads`` 0 leaves its thread pool at its default."""
    import tempfile

    import onnxruntime

    from engine.onnx import export

    symbol, params, data = case_inputs(name, batch)
    with tempfile.TemporaryDirectory() as folder:
        path = export((symbol, params), Path(folder) / f"{name}.onnx",
                      input_shapes={"data": (1, *data.shape[1:])})
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        session = onnxruntime.InferenceSession(str(path), options,
                                               providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: data}
    info = {"output": session.run(None, feed)[0], "threads": f"intra-op {threads or 'default'}",
            "version": onnxruntime.__version__}
    return lambda: session.run(None, feed), info


def peer_worker(connection: Any, runtime: str, name: str, batch: int, threads: int) -> None:
    """A process serving timed rounds of one runtime: receives a call count, sends back the
    seconds per call; None ends it."""
    if runtime == "ort":
        action, info = ort_runner(name, batch, threads)
    else:
        action, info = ours_runner(name, batch, threads, "bf16" if runtime == "bf16" else "fp32")
    action()
    info["call_seconds"] = min(_once(action) for _ in range(3))
    connection.send(info)
    while (calls := connection.recv()) is not None:
        start = time.perf_counter()
        for _ in range(calls):
            action()
        connection.send((time.perf_counter() - start) / calls)


def compare_peer(name: str, batch: int, threads: int, repeat: int) -> dict[str, Any]:
    """Ours (fp32 and bf16) and ONNX Runtime, each in its own process, taking turns round by
    round."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    workers = {}
    for runtime in RUNTIMES:
        mine, theirs = context.Pipe()
        process = context.Process(target=peer_worker, args=(theirs, runtime, name, batch,
                                                            threads))
        process.start()
        workers[runtime] = (mine, process)
    infos = {runtime: mine.recv() for runtime, (mine, _) in workers.items()}
    slowest = max(info.pop("call_seconds") for info in infos.values())
    calls = MLP_CALLS if name == "mlp" else max(1, round(ROUND_SECONDS / slowest))
    rounds: dict[str, list[float]] = {runtime: [] for runtime in workers}
    for turn in range(max(repeat, MLP_ROUNDS) if name == "mlp" else repeat):
        order = list(workers.items())
        for runtime, (mine, _) in order if turn % 2 == 0 else order[::-1]:
            time.sleep(SETTLE_SECONDS)
            mine.send(calls)
            rounds[runtime].append(mine.recv())
    for mine, process in workers.values():
        mine.send(None)
        process.join()
    outputs = {runtime: infos[runtime].pop("output") for runtime in workers}
    return {"infos": infos, "diff": float(np.abs(outputs["ours"] - outputs["ort"]).max()),
            "scale": float(np.abs(outputs["ort"]).max()),
            "bf16_error": float(np.abs(outputs["bf16"] - outputs["ours"]).max()
                                / np.abs(outputs["ours"]).max()),
            **{runtime: (statistics.median(times), min(times))
               for runtime, times in rounds.items()}}


def bench_peer(threads: int, repeat: int, quick: bool) -> None:
    """The ONNX Runtime table at one thread setting (0: each runtime at its default)."""
    label = "every core (each runtime's default)" if not threads else f"{threads} thread(s) each"
    print(f"\nours (fp32, bf16) vs ONNX Runtime, {label}; ms per call, median of interleaved "
          "rounds [best]; floor = FLOPs / sgemm at this thread count; OV = OpenVINO bf16 "
          "(issue #36, every core)")
    print(f"{'network':<16} {'batch':>5} {'ours fp32':>18} {'ours bf16':>18} "
          f"{'ONNX Runtime':>18} {'fp32/ORT':>14} {'target':>6} {'bf16/fp32':>9} "
          f"{'bf16/OV':>8} {'floor':>8} {'fp32/floor':>10} {'ORT/floor':>9}  max|diff|  "
          "bf16 err")
    for name, batch in PEER_CASES:
        if quick and batch > 1 and name != "mlp":
            continue
        before = vcpus.cross_read_ratio() if not threads else None
        result = compare_peer(name, batch, threads, repeat)
        after = vcpus.cross_read_ratio() if not threads else None
        print_peer_row(name, batch, threads, result)
        if before is not None and after is not None:
            print(f"    the other vCPU's data read ×{before:.2f} before, ×{after:.2f} after "
                  "(bench/vcpus.py; from about ×1.3 the vCPUs share no cache)")
    info = result["infos"]["ours"]
    print(f"    ours: {info['threads']}, sgemm {info['sgemm'] / 1e9:.1f} GFLOP/s, bf16 runs "
          f"{result['infos']['bf16']['precision']}; ONNX Runtime "
          f"{result['infos']['ort']['version']}, {result['infos']['ort']['threads']}; "
          f"load average now {os.getloadavg()[0]:.2f}")


def print_peer_row(name: str, batch: int, threads: int, result: dict[str, Any]) -> None:
    """One case of the peer table, and our steps by kind in fp32 and bf16."""
    ours, bf16, theirs = result["ours"], result["bf16"], result["ort"]
    info = result["infos"]["ours"]
    floor = info["flops"] / info["sgemm"]
    ratio = ours[0] / theirs[0]
    verdict = "met" if ratio <= PEER_TARGETS[name] else "MISSED"
    openvino = OPENVINO_BF16.get((name, batch)) if not threads else None
    against_openvino = "—" if openvino is None else f"{bf16[0] / openvino:.2f}×"
    print(f"{name:<16} {batch:>5} {ms(ours[0]):>9} [{ms(ours[1])}] "
          f"{ms(bf16[0]):>9} [{ms(bf16[1])}] "
          f"{ms(theirs[0]):>9} [{ms(theirs[1])}] {ratio:>5.2f}× [{ours[1] / theirs[1]:.2f}×] "
          f"{'≤' + str(PEER_TARGETS[name]):>6} {bf16[0] / ours[0]:>8.2f}× "
          f"{against_openvino:>8} {ms(floor):>8} {ours[0] / floor:>9.2f}× "
          f"{theirs[0] / floor:>8.2f}×  {result['diff']:.1e} (of {result['scale']:.0f}) "
          f"{result['bf16_error']:.1e} {verdict}")
    for runtime in ("ours", "bf16"):
        if "kinds" in result["infos"][runtime]:
            print(f"    {'fp32' if runtime == 'ours' else 'bf16'} by step kind, ms per image "
                  f"[GFLOP/s]: {result['infos'][runtime]['kinds']}")


def bf16_agreement(images: int = AGREEMENT_IMAGES, batch: int = 32) -> None:
    """Top-1 agreement of bf16 with fp32 on ResNet-18 (random weights) over ``images``
    random 224×224 images, and the largest difference relative to the largest logit."""
    symbol = nets.resnet18_v1()
    params = nets.random_params(symbol, (1, 3, 224, 224))
    fp32 = engine.load_model(symbol, params)
    reduced = engine.load_model(symbol, params, precision="bf16")
    rng = np.random.default_rng(36)
    agree, error = 0, 0.0
    for _ in range(images // batch):
        feed = {"data": rng.standard_normal((batch, 3, 224, 224), dtype=np.float32)}
        want = next(iter(fp32.infer(feed).values()))
        got = next(iter(reduced.infer(feed).values()))
        agree += int((np.argmax(got, axis=1) == np.argmax(want, axis=1)).sum())
        error = max(error, float(np.abs(got - want).max() / np.abs(want).max()))
    print(f"\nbf16 against fp32, ResNet-18 v1 (random weights, bf16 runs {reduced.precision}): "
          f"top-1 agreement {agree}/{images} ({agree / images:.1%}; target ≥ 99%), largest "
          f"difference {error:.2e} of the largest logit")


def step_kind(node: Any) -> tuple[str, Any]:
    """A convolution's kind (kernel size, depthwise), else the op type; and the head attrs."""
    op, attrs = node.op, node.params
    if op == "_fused_elementwise":
        op, attrs = node.params.head.op.name, node.params.head.attrs
    if op != "Convolution":
        return op, attrs
    size = "x".join(map(str, attrs.kernel))
    return (f"depthwise {size}" if attrs.num_group > 1 else f"conv {size}"), attrs


def step_kinds(plan: Any, feed: dict[str, np.ndarray],
               repeat: int) -> dict[str, tuple[float, int]]:
    """Seconds (best of ``repeat``) and FLOPs per step kind, steps timed one by one in order."""
    plan.run(feed, copy_outputs=False)  # every buffer holds this input's values
    graph = plan.graph
    shapes = infer_shapes(graph, {**{n: np.shape(v) for n, v in graph.constants.items()},
                                  **{n: a.shape for n, a in feed.items()}})
    index_of = {id(node): index for index, node in enumerate(graph.nodes)}
    kinds: dict[str, list] = {}
    counted: set[int] = set()
    for step in plan.steps:
        kind, _ = step_kind(step.node)
        entry = kinds.setdefault(kind, [0.0, 0])
        entry[0] += min(_once(step.call) for _ in range(repeat))
        index = index_of[id(step.node)]
        if kind.startswith(("conv", "depthwise", "FullyConnected")) and index not in counted:
            counted.add(index)  # a node's FLOPs once, however many calls it was bound to
            weight = step.node.inputs[1]
            entry[1] += 2 * int(np.prod(shapes[index][0])) * int(
                np.prod(shapes[weight.node][weight.index][1:]))
    return {kind: (seconds, flop) for kind, (seconds, flop) in kinds.items()}


def _once(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main() -> None:
    """Parse options and run every comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="timed rounds per measurement")
    parser.add_argument("--quick", action="store_true",
                        help="3 rounds, only batch 1 of the CNNs")
    parser.add_argument("--threads", type=int, default=None,
                        help="compare at this thread count only, and limit BLAS to it for the "
                             "NumPy table (0: each runtime's default); by default at every "
                             "core and again at one thread each")
    options = parser.parse_args()
    repeat = 3 if options.quick else options.repeat
    if options.threads:  # the hand-written NumPy table too
        from threadpoolctl import threadpool_limits

        threadpool_limits(options.threads, user_api="blas")
    print(f"engine from {Path(engine.__file__).parent}")
    print(f"{cpu_model()}, {os.cpu_count()} CPUs; numpy {np.__version__}; "
          f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; load average "
          f"{os.getloadavg()[0]:.2f}; our default thread count {parallel.threads()}")
    bench_mlp(repeat)
    if not options.quick:
        bf16_agreement()
    settings = (0, 1) if options.threads is None else (options.threads,)
    for threads in settings:
        bench_peer(threads, repeat, options.quick)
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
