"""Benchmark: the compiled CPU executor against hand-written NumPy, the sgemm floor and PyTorch.

Usage: ``python bench/executor.py [--quick]``. Prints, in one run:

* the seed MLP (512 → 256 → 128 → 2) at batch 1 and 64: ``Model.infer``, the plan's own
  ``run`` and a hand-written NumPy sequence of the same matmuls into preallocated outputs
  (target: ``Model.infer`` ≤ 1.15× NumPy), written with ``np.matmul`` and again with
  ``np.dot`` (the call the plan makes: at batch 1 it skips the ufunc machinery);
* ResNet-18 v1 (batch 1 and 8) and MobileNet v2 1.0 (batch 1) at 224×224: ms per image for our
  model, the floor (conv/FC FLOPs over NumPy's measured float32 matmul FLOP/s) and PyTorch on
  the CPU with the same weights, plus the two outputs' max abs difference and our time per op
  type (targets: ResNet-18 ≤ 1.5× the floor and faster than PyTorch; MobileNet v2 ≤ 2× PyTorch).

PyTorch is not a project dependency; install it into the venv to run this:
``.venv/bin/pip install torch==2.13.0``. It runs with as many threads as NumPy's BLAS.
Times are medians over repeated runs (best in brackets), after a warm-up run.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

import nets  # noqa: E402 - the sibling module, found through the path set just above

import engine  # noqa: E402
from engine.graph.infer import infer_shapes  # noqa: E402
from engine.runtime import Model  # noqa: E402

MLP_CALLS = 200  # calls per timed round of the MLP (one call is microseconds)
MLP_ROUNDS = 31  # at least: a round takes milliseconds, so one burst of load can skew a few
GEMM_SIZE = 2048


def blas_threads() -> int:
    """Threads NumPy's BLAS uses (threadpoolctl when present, else the CPU count)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return os.cpu_count() or 1
    counts = [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]
    return counts[0] if counts else os.cpu_count() or 1


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


def bench_cnn(name: str, symbol: Any, torch_module: Any, batch: int, repeat: int,
              flops_per_second: float, threads: int) -> None:
    """Our compiled model vs the FLOP floor vs PyTorch, per image, plus a per-op profile."""
    import torch

    shape = (batch, 3, 224, 224)
    params = nets.random_params(symbol, (1, 3, 224, 224))
    model = engine.load_model(symbol, params, optimize=True)
    peer = torch_module(params)
    x = np.random.default_rng(batch).standard_normal(shape, dtype=np.float32)
    feed, tensor = {"data": x}, torch.from_numpy(x)
    torch.set_num_threads(threads)
    with torch.inference_mode():
        ours_out = next(iter(model.infer(feed).values()))
        peer_out = peer(tensor).numpy()
        diff = float(np.abs(ours_out - peer_out).max())
        scale = float(np.abs(peer_out).max())
        times = interleaved({"ours": lambda: model.infer(feed), "torch": lambda: peer(tensor)},
                            repeat)
    ours, theirs = times["ours"], times["torch"]
    flops = graph_flops(model, shape)
    floor = flops / flops_per_second
    print(f"{name:<16} {batch:>5} {flops / batch / 1e9:>7.2f} "
          f"{ms(ours[0] / batch):>9} [{ms(ours[1] / batch)}] {ms(floor / batch):>8} "
          f"{ms(theirs[0] / batch):>9} [{ms(theirs[1] / batch)}] "
          f"{ours[0] / floor:>6.2f}× [{ours[1] / floor:.2f}×] "
          f"{ours[0] / theirs[0]:>5.2f}× [{ours[1] / theirs[1]:.2f}×] {diff:.1e} (of {scale:.0f})")
    profile = model.profile(feed, repeat=max(2, repeat // 2))
    total = sum(profile.values())
    top = sorted(profile.items(), key=lambda item: -item[1])[:6]
    print(f"    model.profile, {ms(total / batch)} ms per image: " + ", ".join(
        f"{label} {ms(seconds / batch)} ({seconds / total:.0%})" for label, seconds in top))
    kinds = step_kinds(model.plan_for(feed), feed, max(2, repeat // 2))
    print("    by step kind, ms per image [GFLOP/s]: " + ", ".join(
        f"{kind} {ms(seconds / batch)}" + (f" [{flop / seconds / 1e9:.0f}]" if flop else "")
        for kind, (seconds, flop) in sorted(kinds.items(), key=lambda item: -item[1][0])))


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
    """Parse options, set the thread count, run every comparison and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="timed rounds per measurement")
    parser.add_argument("--quick", action="store_true", help="3 rounds, skip ResNet-18 batch 8")
    parser.add_argument("--threads", type=int, default=0,
                        help="limit NumPy's BLAS (and torch) to this many threads (needs "
                             "threadpoolctl); 0: leave BLAS as it is")
    options = parser.parse_args()
    if options.threads:
        from threadpoolctl import threadpool_limits

        threadpool_limits(options.threads, user_api="blas")
    run(options)


def run(options: argparse.Namespace) -> None:
    """Every comparison, with the BLAS thread count already set."""
    repeat = 3 if options.quick else options.repeat
    threads = blas_threads()
    flops_per_second = sgemm_flops(repeat)
    print(f"numpy {np.__version__}, BLAS threads {threads} (torch.set_num_threads({threads})); "
          f"sgemm {GEMM_SIZE}³ float32: {flops_per_second / 1e9:.1f} GFLOP/s; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    bench_mlp(repeat)
    print(f"\nCNNs at 224×224, ms per image (median of {repeat} [best]); floor = FLOPs / sgemm")
    print(f"{'network':<16} {'batch':>5} {'GFLOP/im':>7} {'ours':>20} {'floor':>8} "
          f"{'pytorch':>20} {'ours/floor':>15} {'ours/torch':>13} max|diff|")
    cases = [("resnet18_v1", nets.resnet18_v1, nets.torch_resnet18_v1, 1),
             ("resnet18_v1", nets.resnet18_v1, nets.torch_resnet18_v1, 8),
             ("mobilenetv2_1.0", nets.mobilenet_v2, nets.torch_mobilenet_v2, 1)]
    for name, build, torch_module, batch in cases:
        if options.quick and batch > 1:
            continue
        nets_repeat = repeat if batch == 1 else max(3, repeat // 2)
        # The floor uses the best sgemm rate seen in the run (re-measured before each network).
        flops_per_second = max(flops_per_second, sgemm_flops(repeat))
        bench_cnn(name, build(), torch_module, batch, nets_repeat, flops_per_second, threads)
    print(f"\nsgemm best {flops_per_second / 1e9:.1f} GFLOP/s; "
          f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
