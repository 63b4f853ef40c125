"""Benchmark: the compiled CPU executor against hand-written NumPy, ONNX Runtime and the floor.

Usage: ``python bench/executor.py [--quick] [--threads N] [--cases ...] [--peers ...] [--armed]
[--every-step] [--clock process]``.
Prints, in one run:

* the seed MLP (512 → 256 → 128 → 2) at batch 1 and 64: ``Model.infer``, the plan's own
  ``run`` and a hand-written NumPy sequence of the same matmuls into preallocated outputs,
  written with ``np.matmul`` and again with ``np.dot`` (the call the plan makes);
* the peer table, at every core (each runtime's default) and again at one thread each: by
  default the seed MLP (batch 1, 64), ResNet-18 v1 (batch 1, 4) and MobileNet v2 1.0 (batch 1)
  at 224×224 (``--cases``: any of those networks and ResNet-50 v2, at any batch) through
  ``Model.infer`` in fp32 and in bf16 (``precision="bf16"``) and through ONNX Runtime on the
  same weights (the ONNX file `engine.onnx.export` writes; graph optimisations at their
  default, all). Each runtime runs in its own process and they take turns round by round;
  the columns give ours ÷ ORT against the issue's target, bf16 ÷ fp32, and at every core bf16
  against OpenVINO's bf16 (measured with ``--peers`` ov-bf16, else its times on the Intel
  machine from issue #36), then each runtime's distance from the GEMM floor (conv/FC FLOPs
  over the float32 2048³ matmul rate measured at the same thread count), plus our steps
  grouped by kind (on one thread timed by the thread's CPU time), and at every core how much
  slower the vCPUs read each other's data than their own just before and after the case
  (`bench/vcpus.py`: on a VM whose vCPUs at times share no cache);
* with ``--peers``, more columns: ours in int8 (``precision="int8"``, calibrated on the case's
  calibration inputs), and on the same ONNX file OpenVINO at f32, at bf16 and at int8
  (NNCF post-training quantisation), and ONNX Runtime int8 (static QDQ quantisation), each in
  its own process of the peer environment's Python (`bench/quantized_peers.py`,
  ``bench/requirements-peers.txt``), with the precision each runs its layers at and, at the
  first thread setting, every runtime's top-1 on the agreement inputs against ORT fp32's;
* with ``--armed``, our runs in those processes armed on every core every time, in place of
  the plan's measured choice between that and one thread (`spin_pool.Choice`), to read what
  its exploring runs and one-thread spells cost in the every-core columns;
* with ``--every-step``, our plans call every step at every run, their steady runs not
  replayed (`engine.cpu.steady_walk.use`), to read what the replay brings;
* with ``--clock process`` (and ``--threads 1``), the peer table's calls timed by each
  runtime's process CPU time rather than the wall clock: on a machine other jobs share, what
  each runtime's own work takes, the time those jobs held the core left out;
* bf16 against fp32 on ResNet-18 (random weights): top-1 agreement over 256 random 224×224
  images, and the largest difference relative to the largest logit.

ONNX Runtime and onnx are dev dependencies (``pip install -e .[dev]``), not runtime ones;
OpenVINO and NNCF are neither, only the peer environment's.
Times are medians over interleaved rounds (best in brackets), after a warm-up run; a round
is 200 calls of the MLP, or calls of a CNN for about `ROUND_SECONDS` (at least
`MIN_TURN_CALLS`). Where runtimes take turns in processes of their own, `UNTIMED_ROUNDS`
untimed rounds of turns come before the timed ones, and each case's "steady" line has the
median of every turn's calls after its first `STEADY_AFTER`: what a runtime runs at under
continuous load, where the turn's mean also counts the calls after an idle pause.
"""

from __future__ import annotations

import argparse
import json
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

import idle_memory  # noqa: E402 - the sibling modules, found through the path set just above
import nets  # noqa: E402
import quantized_peers  # noqa: E402
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
# Untimed rounds of turns before the timed ones, every runtime alike: a server runs a model
# many times before it is measured, and `spin_pool.Choice` takes about 15 runs of a ResNet-18
# to settle where its first samples were taken while the other runtimes loaded (a round
# is 4-5 of its calls at batch 1).
UNTIMED_ROUNDS = 3
# Every runtime's first calls of a turn run on caches (and, on some VMs, on memory mappings)
# the pause and the other runtimes' turns took away: a turn of at least `MIN_TURN_CALLS`
# calls times, beside the turn's mean, the calls from the third on, the steady rate a
# runtime runs at under continuous load.
MIN_TURN_CALLS = 4
STEADY_AFTER = 2
# Set by ``--armed`` for the processes the benchmark spawns (they inherit the environment):
# our plans' runs armed every time, `spin_pool.Choice`'s measured choice left out.
ARMED_VARIABLE = "HYBRIDSERVE_BENCH_ARMED"
# Set by ``--every-step``: our plans call every step at every run, none replayed.
EVERY_STEP_VARIABLE = "HYBRIDSERVE_BENCH_EVERY_STEP"
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


# -- The peers, each runtime in its own process ---------------------------------------------------

# (network, batch) cases run by default, and the largest ours/ORT ratio the issue asks for.
PEER_CASES = (("mlp", 1), ("mlp", 64), ("resnet18_v1", 1), ("resnet18_v1", 4),
              ("resnet18_v1", 8), ("mobilenetv2_1.0", 1), ("resnet50_v2", 1))
# The cases the reduced-precision table of issue #36 has (`--cases`).
PRECISION_CASES = (("resnet18_v1", 1), ("resnet18_v1", 8), ("mobilenetv2_1.0", 1),
                   ("resnet50_v2", 1))
PEER_TARGETS = {"mlp": 1.0, "resnet18_v1": 1.0, "mobilenetv2_1.0": 1.5, "resnet50_v2": 1.0}
# OpenVINO's bf16 (AMX) seconds per call on the Intel machine at every core, from issue #36:
# the bf16 column's target is at most these (a run with the ov-bf16 peer uses its own times).
OPENVINO_BF16 = {("resnet18_v1", 1): 8.2e-3, ("resnet18_v1", 8): 50.5e-3,
                 ("mobilenetv2_1.0", 1): 4.2e-3, ("resnet50_v2", 1): 23.7e-3}
# ours in fp32, in bf16, in int8 (a peer: ``--peers int8``), ONNX Runtime fp32
LOCAL_RUNTIMES = ("ours", "bf16", "ort", "int8")
AGREEMENT_IMAGES = 256
NETWORKS: dict[str, tuple[Callable[[], Any], tuple[int, ...]]] = {
    "mlp": (nets.mlp, (512,)),
    "resnet18_v1": (nets.resnet18_v1, (3, 224, 224)),
    "mobilenetv2_1.0": (nets.mobilenet_v2, (3, 224, 224)),
    "resnet50_v2": (nets.resnet50_v2, (3, 224, 224)),
}
# The peers beside ONNX Runtime fp32: they run in the peer environment's Python
# (bench/quantized_peers.py, bench/requirements-peers.txt), never in the project's.
# Ours in int8 (``precision="int8"``, calibrated on the case's calibration inputs, as the
# int8 peers are) runs in this environment like fp32 and bf16.
EXTRA_PEERS = ("int8", *quantized_peers.RUNTIMES)
PEER_LABELS = {"ours": "ours", "bf16": "ours bf16", "int8": "ours int8", "ort": "ONNX Runtime",
               "ort-int8": "ORT int8",
               "ov-f32": "OpenVINO f32", "ov-bf16": "OpenVINO bf16", "ov-int8": "OpenVINO int8"}
AGREEMENT_INPUTS = 64  # inputs whose top-1 each runtime's is compared with ORT fp32's
CALIBRATION_SEED, AGREEMENT_SEED = 1000, 2000  # disjoint from the timed inputs' seeds (batch)
PEER_PYTHON_VARIABLE = "HYBRIDSERVE_BENCH_PEER_PYTHON"
DEFAULT_PEER_PYTHON = Path.home() / ".cache" / "hybridserve" / "bench-peers" / "bin" / "python"


def parse_peers(text: str) -> tuple[str, ...]:
    """``--peers``: "all" or a comma list of `EXTRA_PEERS` (ONNX Runtime fp32 always runs: it
    is the reference the agreement and the targets are measured against)."""
    names = EXTRA_PEERS if text.strip() == "all" else tuple(
        name.strip() for name in text.split(",") if name.strip() and name.strip() != "ort")
    unknown = [name for name in names if name not in EXTRA_PEERS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown peer(s) {', '.join(unknown)}; known: ort, {', '.join(EXTRA_PEERS)}, all")
    return ("ort", *dict.fromkeys(names))


def parse_cases(text: str) -> tuple[tuple[str, int], ...]:
    """``--cases``: "default", "precision" or a comma list of ``network:batch``."""
    if text.strip() in ("default", "precision"):
        return PEER_CASES if text.strip() == "default" else PRECISION_CASES
    cases = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, batch = item.partition(":")
        if name not in NETWORKS or not batch.isdigit() or int(batch) < 1:
            raise argparse.ArgumentTypeError(
                f"case {item!r} is not network:batch with a network among "
                f"{', '.join(NETWORKS)} and a batch of 1 or more")
        cases.append((name, int(batch)))
    return tuple(cases)


def peer_python(option: str | None) -> str:
    """The peer environment's Python: the option, else the variable, else the default path."""
    return option or os.environ.get(PEER_PYTHON_VARIABLE) or str(DEFAULT_PEER_PYTHON)


def peer_environment_problem(python: str, runtimes: tuple[str, ...]) -> str | None:
    """Why ``python`` cannot run ``runtimes`` (a missing interpreter or module), or None."""
    import subprocess

    modules = {"onnxruntime"} | ({"openvino", "nncf"} if any(
        runtime.startswith("ov-") for runtime in runtimes) else set())
    try:
        check = subprocess.run([python, "-c", f"import {', '.join(sorted(modules))}"],
                               capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{python}: {error}"
    if check.returncode:
        return f"{python} cannot import {', '.join(sorted(modules))}: " \
               f"{check.stderr.strip().splitlines()[-1] if check.stderr.strip() else 'failed'}"
    return None


def prepare_network(name: str, root: Path, agreement: int) -> Path:
    """The network's folder under ``root``, written once: its symbol and seeded weights, the
    ONNX file our exporter writes from them, and the calibration and agreement inputs."""
    from engine.onnx import export

    folder = root / name
    if (folder / "model.onnx").exists():
        return folder
    folder.mkdir(parents=True)
    build, shape = NETWORKS[name]
    symbol = build()
    params = nets.random_params(symbol, (1, *shape))
    (folder / "model-symbol.json").write_text(symbol.tojson())
    np.savez(folder / "params.npz", **params)
    export((symbol, params), folder / "model.onnx", input_shapes={"data": (1, *shape)})
    for file, seed, count in (("calibration.npy", CALIBRATION_SEED,
                               quantized_peers.CALIBRATION_INPUTS),
                              ("agreement.npy", AGREEMENT_SEED, agreement)):
        rng = np.random.default_rng(seed)
        np.save(folder / file, rng.standard_normal((count, *shape), dtype=np.float32))
    return folder


def write_case_input(folder: Path, batch: int) -> None:
    """The timed input of one batch size (seeded by the batch, as it always was)."""
    shape = np.load(folder / "calibration.npy", mmap_mode="r").shape[1:]
    data = np.random.default_rng(batch).standard_normal((batch, *shape), dtype=np.float32)
    np.save(folder / f"data-b{batch}.npy", data)


def ours_runner(folder: Path, batch: int, threads: int, precision: str = "fp32"
                ) -> tuple[Callable[[], Any], Callable[[np.ndarray], Any], dict]:
    """`Model.infer` on the case, and its FLOPs and the sgemm rate at this thread count."""
    from engine import sym

    if threads:
        from threadpoolctl import threadpool_limits

        parallel.set_threads(threads)
        # before the model binds: its plans cut their jobs for the threads BLAS has then, as
        # OpenVINO compiles for INFERENCE_NUM_THREADS (a one-thread plan bound at two threads
        # runs two parts' work, a bf16 product's pairing pass among them, on one)
        threadpool_limits(threads, user_api="blas")
    symbol = sym.load(folder / "model-symbol.json")
    with np.load(folder / "params.npz") as stored:
        params = dict(stored)
    calibration = {"calibration": {"data": np.load(folder / "calibration.npy")}} \
        if precision == "int8" else {}
    model = engine.load_model(symbol, params, optimize=True, precision=precision,
                              **calibration)
    feed = {"data": np.load(folder / f"data-b{batch}.npy")}
    if os.environ.get(EVERY_STEP_VARIABLE):
        from engine.cpu import steady_walk

        steady_walk.use(False)
    if os.environ.get(ARMED_VARIABLE):
        force_armed(model, feed)
    model.infer(feed)  # first: loading may bring in another BLAS (SciPy's), limited here too
    if threads:
        threadpool_limits(threads, user_api="blas")
    info = {"flops": graph_flops(model, feed["data"].shape), "sgemm": sgemm_flops(3),
            "precision": model.precision,
            "threads": f"BLAS {blas_threads()}, steps {parallel.threads()}, engine from "
                       f"{Path(engine.__file__).parent}"}
    if folder.name != "mlp":
        # On one thread every step runs on this one, so its CPU time leaves out the time other
        # jobs of a loaded machine held the core (wall-clock bests read 2-3× the steps' own
        # time at load average 6-7 on 2 vCPUs); at every core the pool's threads run parts too.
        clock = time.thread_time if threads == 1 else time.perf_counter
        info["kinds_clock"] = "CPU" if threads == 1 else "wall-clock"
        kinds = step_kinds(model.plan_for(feed), feed, 3, clock)
        info["kinds"] = ", ".join(
            f"{kind} {ms(seconds / batch)}" + (f" [{flop / seconds / 1e9:.0f}]" if flop else "")
            for kind, (seconds, flop) in sorted(kinds.items(), key=lambda item: -item[1][0]))
    return (lambda: model.infer(feed),
            lambda x: next(iter(model.infer({"data": x}).values())), info)


def force_armed(model: Model, feed: dict[str, np.ndarray]) -> None:
    """The model's plan for ``feed`` armed on every core at every run (``--armed``), not as
    its `spin_pool.Choice` measures."""
    from every_core import Forced

    plan = model.plan_for(feed)
    if not hasattr(plan, "_spin_choice"):
        raise SystemExit(f"--armed: the plan ({type(plan).__name__}) makes no armed-or-not "
                         "choice to force")
    plan._spin_choice = Forced(True)


def ort_runner(folder: Path, batch: int, threads: int
               ) -> tuple[Callable[[], Any], Callable[[np.ndarray], Any], dict]:
    """An ONNX Runtime session (graph optimisations at their default, all) on the ONNX file
    `engine.onnx.export` wrote; ``threads`` 0 leaves its thread pool at its default."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(str(folder / "model.onnx"), options,
                                           providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    feed = {name: np.load(folder / f"data-b{batch}.npy")}
    info = {"threads": f"intra-op {threads or 'default'}",
            "version": f"ONNX Runtime {onnxruntime.__version__}", "precision": "fp32"}
    return (lambda: session.run(None, feed),
            lambda x: session.run(None, {name: x})[0], info)


def peer_worker(connection: Any, runtime: str, folder: Path, batch: int, threads: int,
                agreement: bool, clock: str = "wall") -> None:
    """A process serving timed rounds of ours (fp32 or bf16) or ONNX Runtime fp32: writes its
    outputs as `quantized_peers.serve` does, then receives a call count and sends back each
    call's seconds by the ``clock`` named (`quantized_peers.CLOCKS`); None ends it."""
    if runtime == "ort":
        action, run, info = ort_runner(folder, batch, threads)
    else:
        action, run, info = ours_runner(folder, batch, threads, {
            "bf16": "bf16", "int8": "int8"}.get(runtime, "fp32"))
    np.save(folder / f"{runtime}-b{batch}-output.npy",
            np.asarray(run(np.load(folder / f"data-b{batch}.npy"))))
    if agreement:
        np.save(folder / f"{runtime}-b{batch}-agreement.npy", quantized_peers.outputs_in_batches(
            run, np.load(folder / "agreement.npy"), batch))
    action()
    info["call_seconds"] = min(_once(action) for _ in range(3))
    connection.send(info)
    while (calls := connection.recv()) is not None:
        connection.send(quantized_peers.timed_calls(action, calls,
                                                    quantized_peers.CLOCKS[clock]))


class LocalPeer:
    """Ours (fp32 or bf16) or ONNX Runtime fp32 in a spawned process of this Python."""

    def __init__(self, runtime: str, folder: Path, batch: int, threads: int,
                 agreement: bool, clock: str = "wall") -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self.connection, theirs = context.Pipe()
        self.process = context.Process(target=peer_worker, args=(
            theirs, runtime, folder, batch, threads, agreement, clock))
        self.process.start()

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def send(self, calls: int | None) -> None:
        self.connection.send(calls)

    def recv(self) -> Any:
        return self.connection.recv()

    def join(self) -> None:
        self.process.join()


class ExternalPeer:
    """A `quantized_peers` runtime in the peer environment's Python, over stdin and stdout."""

    def __init__(self, python: str, runtime: str, folder: Path, batch: int, threads: int,
                 agreement: bool, clock: str = "wall") -> None:
        import subprocess

        self.runtime = runtime
        script = Path(__file__).resolve().with_name("quantized_peers.py")
        self.process = subprocess.Popen(
            [python, str(script), runtime, str(folder), "--batch", str(batch), "--threads",
             str(threads), "--clock", clock, *(["--agreement"] if agreement else [])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def send(self, calls: int | None) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("\n" if calls is None else f"{calls}\n")
        self.process.stdin.flush()

    def recv(self) -> Any:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.runtime} peer ended (exit status "
                               f"{self.process.wait()}) before answering; its error is above")
        return json.loads(line)

    def join(self) -> None:
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()


def top1_agreement(reference: np.ndarray, other: np.ndarray, centred: bool = False
                   ) -> tuple[int, int]:
    """(matching, total) top-1 classes of two runtimes' outputs on the same inputs. Centred
    takes each runtime's mean output over the inputs away first: random weights give every
    input the same raw top-1, and what depends on the input is what is left."""
    if centred:
        reference, other = reference - reference.mean(0), other - other.mean(0)
    return int((reference.argmax(1) == other.argmax(1)).sum()), len(reference)


def compare_peers(folder: Path, batch: int, threads: int, repeat: int,
                  runtimes: tuple[str, ...], python: str, agreement: bool,
                  clock: str = "wall") -> dict[str, Any]:
    """Ours (fp32 and bf16) and every peer, each in its own process, taking turns round by
    round, each timing its calls by the ``clock`` named (`quantized_peers.CLOCKS`)."""
    write_case_input(folder, batch)
    workers: dict[str, LocalPeer | ExternalPeer] = {}
    for runtime in ("ours", "bf16", *runtimes):
        workers[runtime] = (LocalPeer(runtime, folder, batch, threads, agreement, clock)
                            if runtime in LOCAL_RUNTIMES else
                            ExternalPeer(python, runtime, folder, batch, threads, agreement,
                                         clock))
    infos = {runtime: worker.recv() for runtime, worker in workers.items()}
    slowest = max(info.pop("call_seconds") for info in infos.values())
    is_mlp = folder.name == "mlp"
    calls = MLP_CALLS if is_mlp else max(MIN_TURN_CALLS, round(ROUND_SECONDS / slowest))
    # Untimed rounds of turns first: every process loaded and warmed up at once, so a
    # runtime that adapts to what it measures (ours: `spin_pool.Choice`) would otherwise
    # start its timed turns on samples taken while the others were still loading.
    untimed: dict[str, list[float]] = {}  # each runtime's calls in the last untimed round
    for _ in range(UNTIMED_ROUNDS):
        for runtime, worker in workers.items():
            time.sleep(SETTLE_SECONDS)
            worker.send(calls)
            untimed[runtime] = worker.recv()
    if untimed and not is_mlp:
        calls = turn_calls(untimed)
    rounds: dict[str, list[list[float]]] = {runtime: [] for runtime in workers}
    # Each runtime's turns: their wall seconds, its own CPU seconds and the others' in them.
    cpu = {runtime: [0.0, 0.0, 0.0] for runtime in workers}
    for turn in range(max(repeat, MLP_ROUNDS) if is_mlp else repeat):
        order = list(workers.items())
        for runtime, worker in order if turn % 2 == 0 else order[::-1]:
            time.sleep(SETTLE_SECONDS)
            before, started = processes_cpu(workers), time.perf_counter()
            worker.send(calls)
            rounds[runtime].append(worker.recv())
            spent, after = time.perf_counter() - started, processes_cpu(workers)
            own = after[runtime] - before[runtime]
            cpu[runtime][0] += spent
            cpu[runtime][1] += own
            cpu[runtime][2] += sum(after.values()) - sum(before.values()) - own
    for worker in workers.values():
        worker.send(None)
        worker.join()
    outputs = {runtime: np.load(folder / f"{runtime}-b{batch}-output.npy") for runtime in workers}
    result: dict[str, Any] = {
        "infos": infos, "calls": calls, "scale": float(np.abs(outputs["ort"]).max()),
        "bf16_error": float(np.abs(outputs["bf16"] - outputs["ours"]).max()
                            / np.abs(outputs["ours"]).max()),
        "diff": {runtime: float(np.abs(output - outputs["ort"]).max())
                 for runtime, output in outputs.items()},
        "times": {runtime: turn_times(turns) for runtime, turns in rounds.items()},
        "steady": {runtime: steady_time(turns) for runtime, turns in rounds.items()},
        "turn_cpu": {runtime: (own / spent, others / spent)
                     for runtime, (spent, own, others) in cpu.items()}}
    if agreement:
        logits = {runtime: np.load(folder / f"{runtime}-b{batch}-agreement.npy")
                  for runtime in workers}
        result["classes"] = len(np.unique(logits["ort"].argmax(1)))
        result["agreement"] = {runtime: (top1_agreement(logits["ort"], output),
                                         top1_agreement(logits["ort"], output, centred=True))
                               for runtime, output in logits.items() if runtime != "ort"}
    return result


def processes_cpu(workers: dict[str, Any]) -> dict[str, float]:
    """Each worker process's CPU seconds so far, all its threads (Linux's /proc; 0 where a
    process cannot be read)."""
    tick = os.sysconf("SC_CLK_TCK")
    seconds = {}
    for runtime, worker in workers.items():
        try:
            fields = Path(f"/proc/{worker.pid}/stat").read_text().rsplit(")", 1)[1].split()
            seconds[runtime] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        except (OSError, IndexError, ValueError):
            seconds[runtime] = 0.0
    return seconds


def turn_cpu_line(result: dict[str, Any]) -> str:
    """The CPU each runtime's process used in its own turns, and the other processes in them:
    a peer whose threads go on spinning after its turn shows in the others' column (which
    the clock's ticks can leave a hair below zero: shown as 0)."""
    return "    CPU in each runtime's turns, cores (its own / the other processes'): " + ", ".join(
        f"{PEER_LABELS.get(runtime, runtime)} {own:.2f} / {max(0.0, others):.2f}"
        for runtime, (own, others) in result["turn_cpu"].items())


def turn_times(turns: list[list[float]]) -> tuple[float, float]:
    """The median and the best of a runtime's turns, each turn its mean seconds per call."""
    means = [statistics.fmean(calls) for calls in turns]
    return statistics.median(means), min(means)


def turn_calls(last_turns: dict[str, list[float]]) -> int:
    """Calls a CNN's turn runs: about `ROUND_SECONDS` of the slowest runtime's steady calls
    in the last untimed round. (The first estimate, each runtime's best of three calls timed
    while every process loaded at once, ran two or three times slow on two vCPUs: turns of
    five calls of MobileNet v2, the steady median then taking in the calls that follow a
    turn's pause.)"""
    slowest = max(statistics.median(calls[STEADY_AFTER:] or calls)
                  for calls in last_turns.values())
    return max(MIN_TURN_CALLS, round(ROUND_SECONDS / slowest))


def steady_time(turns: list[list[float]]) -> float:
    """The median seconds of a runtime's calls that follow its turns' first `STEADY_AFTER`."""
    return statistics.median(call for calls in turns for call in calls[STEADY_AFTER:])


def steady_line(result: dict[str, Any]) -> str:
    """The case's steady calls: each runtime's time and ours against the peer of its precision."""
    steady = result["steady"]
    times = ", ".join(f"{PEER_LABELS.get(runtime, runtime)} {ms(seconds)}"
                      for runtime, seconds in steady.items())
    float_peers = [steady[peer] for peer in ("ort", "ov-f32") if peer in steady]
    ratios = [f"fp32 ÷ faster float peer {steady['ours'] / min(float_peers):.2f}×"]
    for ours, peer in (("bf16", "ov-bf16"), ("int8", "ov-int8")):
        if ours in steady and peer in steady:
            ratios.append(f"{ours} ÷ {PEER_LABELS[peer]} {steady[ours] / steady[peer]:.2f}×")
    return (f"    steady calls (each turn's {result['calls']} calls from call "
            f"{STEADY_AFTER + 1} on, median): {times}; "
            + ", ".join(ratios))


def peer_header(extras: tuple[str, ...]) -> str:
    """The table's column names: ours in fp32 and bf16 against ORT fp32, then one column per
    extra peer."""
    return (f"{'network':<16} {'batch':>5} {'ours fp32':>18} {'ours bf16':>18} "
            f"{'ONNX Runtime':>18} {'fp32/ORT':>14} {'target':>6} {'bf16/fp32':>9} "
            f"{'bf16/OV':>8} {'floor':>8} {'fp32/floor':>10} {'ORT/floor':>9}  max|diff|  "
            "bf16 err" + "".join(f" {PEER_LABELS[peer]:>18}" for peer in extras))


def against_openvino(name: str, batch: int, threads: int, result: dict[str, Any]) -> str:
    """Our bf16 ÷ OpenVINO's bf16: measured where the run has the ov-bf16 peer, else (every
    core only) the issue's times on the Intel machine, marked with an asterisk."""
    bf16 = result["times"]["bf16"][0]
    if "ov-bf16" in result["times"]:
        return f"{bf16 / result['times']['ov-bf16'][0]:.2f}×"
    openvino = OPENVINO_BF16.get((name, batch)) if not threads else None
    return "—" if openvino is None else f"{bf16 / openvino:.2f}×*"


def peer_lines(name: str, batch: int, threads: int, result: dict[str, Any],
               extras: tuple[str, ...]) -> list[str]:
    """One case of the table: its row, then the extra peers' ratios, agreement and our steps."""
    times, info = result["times"], result["infos"]["ours"]
    ours, bf16, theirs = times["ours"], times["bf16"], times["ort"]
    floor = info["flops"] / info["sgemm"]
    ratio = ours[0] / theirs[0]
    target = PEER_TARGETS.get(name)
    verdict = "" if target is None else " met" if ratio <= target else " MISSED"
    row = (f"{name:<16} {batch:>5} {ms(ours[0]):>9} [{ms(ours[1])}] "
           f"{ms(bf16[0]):>9} [{ms(bf16[1])}] "
           f"{ms(theirs[0]):>9} [{ms(theirs[1])}] {ratio:>5.2f}× [{ours[1] / theirs[1]:.2f}×] "
           f"{'≤' + str(target) if target else '—':>6} {bf16[0] / ours[0]:>8.2f}× "
           f"{against_openvino(name, batch, threads, result):>8} {ms(floor):>8} "
           f"{ours[0] / floor:>9.2f}× {theirs[0] / floor:>8.2f}×  "
           f"{result['diff']['ours']:.1e} {result['bf16_error']:.1e}"
           + "".join(f" {ms(times[peer][0]):>8} [{ms(times[peer][1])}]" for peer in extras)
           + f"  (outputs up to {result['scale']:.0f}){verdict}")
    lines = [row, steady_line(result)]
    if "turn_cpu" in result:
        lines.append(turn_cpu_line(result))
    if extras:
        lines.append("    ours fp32 ÷ peer: " + ", ".join(
            f"{PEER_LABELS[peer]} {ours[0] / times[peer][0]:.2f}×" for peer in extras)
            + "; max|diff| from ORT fp32: " + ", ".join(
            f"{PEER_LABELS[peer]} {result['diff'][peer]:.1e}" for peer in extras))
    if "agreement" in result:
        count = next(iter(result["agreement"].values()))[0][1]
        lines.append(
            f"    top-1 agreeing with ORT fp32 over {count} inputs (fp32 picks "
            f"{result['classes']} class(es); [centred on each runtime's mean output]): "
            + ", ".join(f"{PEER_LABELS[runtime]} {raw[0]}/{raw[1]} [{centred[0]}/{centred[1]}]"
                        for runtime, (raw, centred) in result["agreement"].items()))
    for runtime in ("ours", "bf16"):
        if "kinds" in result["infos"][runtime]:
            lines.append(f"    {'fp32' if runtime == 'ours' else 'bf16'} by step kind, "
                         f"{result['infos'][runtime]['kinds_clock']} ms per image [GFLOP/s]: "
                         f"{result['infos'][runtime]['kinds']}")
    return lines


def bench_peer(threads: int, repeat: int, cases: tuple[tuple[str, int], ...],
               runtimes: tuple[str, ...], python: str, root: Path, agreement: int,
               clock: str = "wall") -> None:
    """The peer table at one thread setting (0: each runtime at its default); ``agreement``
    inputs (0: none) compared by top-1 where the batch divides their count; each call timed
    by the ``clock`` named (`quantized_peers.CLOCKS`)."""
    label = "every core (each runtime's default)" if not threads else f"{threads} thread(s) each"
    extras = runtimes[1:]
    names = ", ".join(PEER_LABELS[runtime] for runtime in runtimes)
    unit = "each process's CPU ms per call" if clock == "process" else "ms per call"
    print(f"\nours (fp32, bf16) vs {names}, {label}; {unit}, median of interleaved "
          "rounds [best]; floor = FLOPs / sgemm at this thread count")
    print(peer_header(extras))
    for name, batch in cases:
        before = vcpus.cross_read_ratio() if not threads else None
        folder = prepare_network(name, root, agreement or AGREEMENT_INPUTS)
        result = compare_peers(folder, batch, threads, repeat, runtimes, python,
                               agreement > 0 and agreement % batch == 0, clock)
        after = vcpus.cross_read_ratio() if not threads else None
        for line in peer_lines(name, batch, threads, result, extras):
            print(line)
        info = result["infos"]["ours"]
        if before is not None and after is not None:
            print(f"    the other vCPU's data read ×{before:.2f} before, ×{after:.2f} after "
                  "(bench/vcpus.py; from about ×1.3 the vCPUs share no cache)")
        for runtime in extras:
            print(f"    {PEER_LABELS[runtime]} precision: "
                  f"{result['infos'][runtime]['precision']}")
    print(f"    ours: {info['threads']}, sgemm {info['sgemm'] / 1e9:.1f} GFLOP/s, bf16 runs "
          f"{result['infos']['bf16']['precision']}; load average now {os.getloadavg()[0]:.2f}"
          "; * OpenVINO bf16 from issue #36")
    for runtime in runtimes:
        peer = result["infos"][runtime]
        version = peer.get("version", f"this checkout, {peer['precision']}")  # ours int8
        print(f"    {PEER_LABELS[runtime]}: {version}, {peer['threads']}")


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


def step_kinds(plan: Any, feed: dict[str, np.ndarray], repeat: int,
               clock: Callable[[], float] = time.perf_counter) -> dict[str, tuple[float, int]]:
    """Seconds by ``clock`` (best of ``repeat``) and FLOPs per step kind, steps timed one by one
    in order within runs made as `plan.run` makes them (`Plan.walk`)."""
    walks = [plan.walk(feed, clock) for _ in range(repeat)]
    graph = plan.graph
    shapes = infer_shapes(graph, {**{n: np.shape(v) for n, v in graph.constants.items()},
                                  **{n: a.shape for n, a in feed.items()}})
    index_of = {id(node): index for index, node in enumerate(graph.nodes)}
    kinds: dict[str, list] = {}
    counted: set[int] = set()
    for position, step in enumerate(plan.steps):
        kind, _ = step_kind(step.node)
        entry = kinds.setdefault(kind, [0.0, 0])
        entry[0] += min(seconds[position] for seconds in walks)
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


def parser() -> argparse.ArgumentParser:
    """The command line: rounds, thread settings, cases, peers and the agreement inputs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="timed rounds per measurement")
    parser.add_argument("--quick", action="store_true",
                        help="3 rounds, only batch 1 of the CNNs")
    parser.add_argument("--threads", type=int, default=None,
                        help="compare at this thread count only, and limit BLAS to it for the "
                             "NumPy table (0: each runtime's default); by default at every "
                             "core and again at one thread each")
    parser.add_argument("--cases", type=parse_cases, default=PEER_CASES,
                        help="network:batch list, or 'default' (the seed MLP, ResNet-18 v1, "
                             "MobileNet v2) or 'precision' (ResNet-18 v1 at 1 and 8, "
                             "MobileNet v2, ResNet-50 v2)")
    parser.add_argument("--peers", type=parse_peers, default=("ort",),
                        help=f"peers beside ONNX Runtime fp32: a comma list of "
                             f"{', '.join(EXTRA_PEERS)}, or 'all'; these run in the peer "
                             "environment (bench/requirements-peers.txt)")
    parser.add_argument("--armed", action="store_true",
                        help="our runs armed on every core every time, not as "
                             "spin_pool.Choice decides from its own timings (its exploring "
                             "runs and one-thread spells left out)")
    parser.add_argument("--every-step", action="store_true",
                        help="our plans call every step at every run: their steady runs "
                             "not replayed (engine.cpu.steady_walk)")
    parser.add_argument("--clock", choices=("wall", "process"), default="wall",
                        help="what the peer table's calls are timed by; process: each "
                             "runtime's process CPU time (all its threads), which leaves out "
                             "the time a loaded machine's other jobs held the cores; with "
                             "--threads 1 only (on more, it adds the threads' times)")
    parser.add_argument("--peer-python", default=None,
                        help=f"that environment's Python (default: ${PEER_PYTHON_VARIABLE}, "
                             f"else ~/.cache/hybridserve/bench-peers/bin/python)")
    parser.add_argument("--agreement", type=int, default=None,
                        help=f"inputs whose top-1 is compared with ONNX Runtime fp32's "
                             f"(default {AGREEMENT_INPUTS} with extra peers, else 0), at the "
                             "first thread setting only")
    return parser


def cpu_flags(wanted: tuple[str, ...] = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16",
                                         "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")
              ) -> str:
    """Which of the flags that pick the peers' kernels the CPU reports."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            flags = next((set(line.split(":", 1)[1].split()) for line in info
                          if line.startswith("flags")), set())
    except OSError:
        return "flags unknown"
    return "flags " + " ".join(flag for flag in wanted if flag in flags)


def main() -> None:
    """Parse options and run every comparison."""
    import tempfile

    options = parser().parse_args()
    if options.clock == "process" and options.threads != 1:
        parser().error("--clock process times one thread's calls: give --threads 1 too")
    if options.armed:
        os.environ[ARMED_VARIABLE] = "1"
    if options.every_step:
        os.environ[EVERY_STEP_VARIABLE] = "1"
    repeat = 3 if options.quick else options.repeat
    cases = tuple(case for case in options.cases
                  if not (options.quick and case[1] > 1 and case[0] != "mlp"))
    runtimes = options.peers
    python = peer_python(options.peer_python)
    if len(runtimes) > 1 and (problem := peer_environment_problem(python, runtimes[1:])):
        print(f"the peers {', '.join(runtimes[1:])} are left out: {problem} (make the "
              "environment with bench/requirements-peers.txt, docs/benchmarks.md)")
        runtimes = runtimes[:1]
    agreement = options.agreement if options.agreement is not None else (
        AGREEMENT_INPUTS if len(runtimes) > 1 else 0)
    if options.threads:  # the hand-written NumPy table too
        from threadpoolctl import threadpool_limits

        threadpool_limits(options.threads, user_api="blas")
    print(f"engine from {Path(engine.__file__).parent}")
    print(f"{cpu_model()}, {os.cpu_count()} CPUs, {cpu_flags()}; numpy {np.__version__}; "
          f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; load average "
          f"{os.getloadavg()[0]:.2f}; our default thread count {parallel.threads()}")
    print(f"memory left idle 0.1 s: {idle_memory.idle_page_cost():.2f} µs a 4 KB page at its "
          "next read (bench/idle_memory.py: where it is microseconds, every runtime's first "
          "calls of a turn run several times their steady ones)")
    bench_mlp(repeat)
    settings = (0, 1) if options.threads is None else (options.threads,)
    with tempfile.TemporaryDirectory(prefix="executor-bench-") as root:
        for index, threads in enumerate(settings):
            bench_peer(threads, repeat, cases, runtimes, python, Path(root),
                       agreement if index == 0 else 0, options.clock)
    if not options.quick:
        bf16_agreement()
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
