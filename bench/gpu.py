"""GPU benchmarks: seed MLP latency with/without CUDA graphs, ResNet-50 v1 throughput against
PyTorch eager CUDA on the same weights, and kernel launches per forward before/after fusion.
Also a batch of 32 one-image requests joined into pinned memory directly against joined by
``np.concatenate`` first, and the seed MLP's graph launch and wait alone (the device's share).

Usage:
    python bench/gpu.py [--quick] [--output bench/results/gpu-<machine>.json]

Needs an NVIDIA GPU with CuPy (``pip install .[gpu]``); exits with a message otherwise. See
docs/gpu.md for running it on a GPU machine without network. The
PyTorch comparison runs when ``torch`` with CUDA is importable, and is reported as skipped when
not. Every time is end to end from a host numpy array to a host numpy array, for both engines.
Targets (issue #20): MLP batch-1 plan run under 30 µs with graphs; ResNet-50 ≥ 1.0× PyTorch
at batch 128 and ≥ 1.5× at batch 1. Issue #40: ResNet-50 in ``precision="fp16"`` ≥ 1.0×
PyTorch AMP (autocast fp16, channels_last) at batch 128, and at batch 1 with CUDA graphs on
both sides; top-1 agreement of fp16 with fp32 ≥ 99% on 256 inputs. The ``bf16`` rows (bf16
Convolution and Dense products, the rest float32) have no target: images/s and agreement.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import engine  # noqa: E402
from engine.device import get_device, gpu_unavailable_reason  # noqa: E402
from engine.graph.ir import Graph  # noqa: E402

SEED_MLP = ROOT / "tests" / "fixtures" / "mxnet" / "models" / "seed_mlp"
ALL_BUT_FUSION = ["fold_constants", "fold_batchnorm", "eliminate_dead_nodes", "plan_memory"]


def timings_us(call: Callable[[], Any], repeat: int, warmup: int = 20) -> dict[str, float]:
    """Median, p90 and p99 microseconds per call."""
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter_ns()
        call()
        samples.append((time.perf_counter_ns() - start) / 1e3)
    samples.sort()
    return {"median_us": round(statistics.median(samples), 2),
            "p90_us": round(samples[int(0.9 * (len(samples) - 1))], 2),
            "p99_us": round(samples[int(0.99 * (len(samples) - 1))], 2)}


def bench_mlp(repeat: int) -> dict[str, Any]:
    """Seed MLP, batch 1: `Model.infer` and `Plan.run`, with and without CUDA graphs."""
    files = (SEED_MLP / "seed_mlp-symbol.json", SEED_MLP / "seed_mlp-0000.params")
    feed = {"data": np.random.default_rng(0).normal(size=(1, 512)).astype(np.float32)}
    results: dict[str, Any] = {}
    for graphs in (False, True):
        model = engine.load_model(*files, device=get_device("gpu", cuda_graphs=graphs))
        plan = model.plan_for(feed)
        label = "with_cuda_graphs" if graphs else "without_cuda_graphs"
        results[label] = {
            "model_infer": timings_us(lambda m=model: m.infer(feed), repeat),
            "plan_run": timings_us(lambda p=plan: p.run(feed, copy_outputs=False), repeat),
            "plan": plan.execution_stats(),
        }
        graph = plan._gpu.graph
        if graph is not None:  # the device's share: one launch and its wait, nothing of ours
            results[label]["graph_launch_and_sync"] = timings_us(
                lambda g=graph: (g.replay(), g.stream.synchronize()), repeat)
    results["target"] = "plan_run median under 30 us with CUDA graphs"
    return results


def bench_join(model: Any, batch: int, repeat: int) -> dict[str, Any]:
    """A batch of ``batch`` one-image requests joined two ways: with ``np.concatenate``, then
    copied into the plan's pinned inputs by `Model.infer`, against straight into the pinned
    inputs (`Model.batch_buffers`, as the server's batcher joins them)."""
    from engine.runtime.buffers import join_rows

    rng = np.random.default_rng(3)
    requests = [rng.normal(size=(1, 3, 224, 224)).astype(np.float32) for _ in range(batch)]

    def concatenated() -> Any:
        return model.infer({"data": np.concatenate(requests)})

    def pinned() -> Any:
        with model.batch_buffers({"data": requests[0]}, batch) as joined:
            join_rows(joined.buffers["data"], requests)
            return joined.run()

    np.testing.assert_allclose(next(iter(pinned().values())),
                               next(iter(concatenated().values())), rtol=1e-4, atol=1e-4)
    return {"requests": batch, "concatenate_then_infer": timings_us(concatenated, repeat, 3),
            "joined_into_pinned": timings_us(pinned, repeat, 3)}


def resnet50_v1() -> tuple[Any, dict[str, np.ndarray]]:
    """ResNet-50 v1 (Gluon's layout: stride on the first 1x1 of a bottleneck) and random weights.

    Uses engine.gluon.model_zoo.vision (exported, then loaded) when it exists, else builds the
    symbol with engine.sym.
    """
    try:
        from engine.gluon.model_zoo import vision  # type: ignore[attr-defined]

        return _from_model_zoo(vision)
    except (ImportError, AttributeError):
        pass
    from engine import sym

    def conv_bn(x: Any, name: str, filters: int, kernel: int, stride: int, relu: bool) -> Any:
        x = sym.Convolution(x, num_filter=filters, kernel=(kernel, kernel),
                            stride=(stride, stride), pad=(kernel // 2, kernel // 2),
                            no_bias=True, name=f"{name}_conv")
        x = sym.BatchNorm(x, eps=1e-5, fix_gamma=False, name=f"{name}_bn")
        return sym.Activation(x, act_type="relu", name=f"{name}_relu") if relu else x

    x = conv_bn(sym.var("data"), "stem", 64, 7, 2, True)
    x = sym.Pooling(x, kernel=(3, 3), stride=(2, 2), pad=(1, 1), pool_type="max")
    for stage, (blocks, channels) in enumerate(zip((3, 4, 6, 3), (256, 512, 1024, 2048))):
        for block in range(blocks):
            name = f"stage{stage + 1}_unit{block + 1}"
            stride = 2 if block == 0 and stage > 0 else 1
            body = conv_bn(x, f"{name}_a", channels // 4, 1, stride, True)
            body = conv_bn(body, f"{name}_b", channels // 4, 3, 1, True)
            body = conv_bn(body, f"{name}_c", channels, 1, 1, False)
            shortcut = conv_bn(x, f"{name}_down", channels, 1, stride, False) if block == 0 \
                else x
            x = sym.Activation(sym.elemwise_add(body, shortcut), act_type="relu")
    x = sym.Pooling(x, global_pool=True, pool_type="avg", kernel=(1, 1))
    net = sym.FullyConnected(sym.Flatten(x), num_hidden=1000, name="fc")
    return net, _random_params(net)


def _from_model_zoo(vision: Any) -> tuple[Any, dict[str, np.ndarray]]:
    import tempfile

    net = vision.get_model("resnet50_v1")
    net.initialize()
    net.hybridize()
    from engine import nd

    net(nd.array(np.zeros((1, 3, 224, 224), np.float32)))
    from engine.runtime.loader import read_params

    with tempfile.TemporaryDirectory() as folder:
        net.export(f"{folder}/resnet50_v1")
        symbol = Path(f"{folder}/resnet50_v1-symbol.json").read_text()
        return symbol, read_params(Path(f"{folder}/resnet50_v1-0000.params"))


def _random_params(net: Any) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    args, _, auxs = net.infer_shape(data=(1, 3, 224, 224))
    params = {}
    for name, shape in zip(net.list_arguments() + net.list_auxiliary_states(), args + auxs):
        if name == "data":
            continue
        if name.endswith("_weight"):
            fan_in = int(np.prod(shape[1:]))
            value = rng.normal(0, np.sqrt(2 / fan_in), shape)
        elif name.endswith("_gamma"):
            value = rng.uniform(0.5, 1.0, shape)
        elif name.endswith("_moving_var"):
            value = rng.uniform(0.8, 1.2, shape)
        else:  # beta, bias, moving_mean
            value = rng.normal(0, 0.05, shape)
        params[name] = value.astype(np.float32)
    return params


class TorchGraph:
    """The same graph executed op by op with torch.nn.functional on CUDA: PyTorch eager."""

    def __init__(self, graph: Graph, params: dict[str, np.ndarray], torch: Any) -> None:
        self.torch = torch
        self.graph = graph
        self.weights = {name: torch.from_numpy(value).cuda() for name, value in params.items()}

    def __call__(self, data: Any) -> Any:
        values: list[Any] = []
        for node in self.graph.nodes:
            if node.is_variable:
                values.append(data if node.name not in self.weights else self.weights[node.name])
                continue
            args = [values[entry.node] for entry in node.inputs]
            values.append(self._op(node.op, node.params, args))
        return values[self.graph.heads[0].node]

    def _op(self, op: str, attrs: Any, args: list[Any]) -> Any:
        functional = self.torch.nn.functional
        if op == "Convolution":
            return functional.conv2d(args[0], args[1], None if attrs.no_bias else args[2],
                                     tuple(attrs.stride) or 1, tuple(attrs.pad) or 0,
                                     tuple(attrs.dilate) or 1, attrs.num_group)
        if op == "BatchNorm":
            gamma = self.torch.ones_like(args[1]) if attrs.fix_gamma else args[1]
            return functional.batch_norm(args[0], args[3], args[4], gamma, args[2],
                                         False, 0.0, attrs.eps)
        if op in ("Activation", "relu"):
            return functional.relu(args[0])
        if op in ("elemwise_add", "_Plus", "_plus", "broadcast_add"):
            return args[0] + args[1]
        if op == "Pooling":
            return self._pool(attrs, args[0], functional)
        if op == "Flatten":
            return args[0].flatten(1)
        if op == "FullyConnected":
            return functional.linear(args[0].flatten(1), args[1],
                                     None if attrs.no_bias else args[2])
        if op == "Dropout":
            return args[0]
        raise NotImplementedError(f"the PyTorch baseline has no mapping for op {op!r}")

    def _pool(self, attrs: Any, x: Any, functional: Any) -> Any:
        if attrs.global_pool:
            return functional.adaptive_avg_pool2d(x, 1) if attrs.pool_type == "avg" else \
                functional.adaptive_max_pool2d(x, 1)
        ceil = attrs.pooling_convention == "full"
        if attrs.pool_type == "max":
            return functional.max_pool2d(x, tuple(attrs.kernel), tuple(attrs.stride) or 1,
                                         tuple(attrs.pad) or 0, ceil_mode=ceil)
        return functional.avg_pool2d(x, tuple(attrs.kernel), tuple(attrs.stride) or 1,
                                     tuple(attrs.pad) or 0, ceil_mode=ceil,
                                     count_include_pad=attrs.count_include_pad is not False)


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 on both sides
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    return torch


def bench_resnet(batches: tuple[int, ...], repeat: int) -> dict[str, Any]:
    """Images per second at each batch size: the engine with CUDA graphs, its convolutions
    through cuDNN and through im2col + cuBLAS GEMM, and PyTorch eager."""
    net, params = resnet50_v1()
    model = engine.load_model(net, params, device="gpu")
    gemm = engine.load_model(net, params, device=get_device("gpu", cudnn=False))
    torch = _torch()
    baseline = TorchGraph(model.graph, model.params, torch) if torch else None
    rng = np.random.default_rng(2)
    results: dict[str, Any] = {"pytorch": torch.__version__ if torch else "not installed"}
    for batch in batches:
        data = rng.normal(size=(batch, 3, 224, 224)).astype(np.float32)
        ours = timings_us(lambda d=data: model.infer({"data": d}), repeat, warmup=3)
        fallback = timings_us(lambda d=data: gemm.infer({"data": d}), repeat, warmup=3)
        row: dict[str, Any] = {"engine": ours,
                               "engine_images_per_s": round(batch / ours["median_us"] * 1e6, 1),
                               "plan": model.plan_for({"data": data}).execution_stats(),
                               "engine_gemm_images_per_s": round(
                                   batch / fallback["median_us"] * 1e6, 1)}
        if baseline is not None:
            with torch.inference_mode():
                def run_torch(d: np.ndarray = data) -> np.ndarray:
                    return baseline(torch.from_numpy(d).cuda()).cpu().numpy()

                theirs = timings_us(run_torch, repeat, warmup=3)
                reference = run_torch()
            actual = list(model.infer({"data": data}).values())[0]
            row["pytorch_eager"] = theirs
            row["pytorch_images_per_s"] = round(batch / theirs["median_us"] * 1e6, 1)
            row["ratio_vs_pytorch"] = round(theirs["median_us"] / ours["median_us"], 3)
            row["max_abs_diff_vs_pytorch"] = float(np.max(np.abs(actual - reference)))
        results[f"batch{batch}"] = row
    if 32 in batches:
        results["join_32_requests"] = bench_join(model, 32, repeat)
    results["target"] = "ratio_vs_pytorch >= 1.0 at batch 128, >= 1.5 at batch 1"
    return results


def _torch_amp(graph: Graph, params: dict[str, np.ndarray], torch: Any, batch: int,
               graphed: bool) -> Callable[[np.ndarray], np.ndarray]:
    """PyTorch AMP's forward of ``graph``: autocast to fp16, channels_last input and weights,
    outputs cast to float32; replayed as a CUDA graph when ``graphed``."""
    model = TorchGraph(graph, params, torch)
    model.weights = {name: value.contiguous(memory_format=torch.channels_last)
                     if value.ndim == 4 else value for name, value in model.weights.items()}
    static = torch.zeros((batch, 3, 224, 224), device="cuda").contiguous(
        memory_format=torch.channels_last)

    def forward() -> Any:
        # Autocast's weight-cast cache would be captured stale: off when replaying a graph.
        with torch.autocast("cuda", dtype=torch.float16, cache_enabled=not graphed):
            return model(static).float()

    if not graphed:
        def run(data: np.ndarray) -> np.ndarray:
            static.copy_(torch.from_numpy(data))
            return forward().cpu().numpy()

        return run
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as PyTorch asks
        for _ in range(3):
            forward()
    torch.cuda.current_stream().wait_stream(side)
    cuda_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(cuda_graph):
        output = forward()

    def replay(data: np.ndarray) -> np.ndarray:
        static.copy_(torch.from_numpy(data))
        cuda_graph.replay()
        return output.cpu().numpy()

    return replay


def top1_agreement(first: Any, second: Any, inputs: int, batch: int = 32) -> float:
    """Share of ``inputs`` random images on which two models pick the same class."""
    rng = np.random.default_rng(40)
    same = 0
    for _ in range(inputs // batch):
        data = {"data": rng.normal(size=(batch, 3, 224, 224)).astype(np.float32)}
        ones, others = (list(model.infer(data).values())[0] for model in (first, second))
        same += int(np.sum(ones.argmax(axis=1) == others.argmax(axis=1)))
    return same / (inputs // batch * batch)


def bench_resnet_half(batches: tuple[int, ...], repeat: int, agreement_inputs: int
                      ) -> dict[str, Any]:
    """ResNet-50 v1 in fp16 (CUDA graphs) against PyTorch AMP channels_last (eager, and with
    CUDA graphs at batch 1), its top-1 agreement with fp32, and the same for bf16 (no
    PyTorch row: AMP's bf16 keeps activations in bf16 between ops, which ours does not)."""
    net, params = resnet50_v1()
    model = engine.load_model(net, params, device="gpu", precision="fp16")
    single = engine.load_model(net, params, device="gpu")
    torch = _torch()
    rng = np.random.default_rng(2)
    results: dict[str, Any] = {"pytorch": torch.__version__ if torch else "not installed"}
    for batch in batches:
        data = rng.normal(size=(batch, 3, 224, 224)).astype(np.float32)
        ours = timings_us(lambda d=data: model.infer({"data": d}), repeat, warmup=3)
        actual = list(model.infer({"data": data}).values())[0]
        reference = list(single.infer({"data": data}).values())[0]
        row: dict[str, Any] = {"engine": ours,
                               "engine_images_per_s": round(batch / ours["median_us"] * 1e6, 1),
                               "plan": model.plan_for({"data": data}).execution_stats(),
                               "max_abs_diff_vs_fp32": float(np.max(np.abs(actual - reference)))}
        if torch is not None:
            with torch.inference_mode():
                for label, graphed in (("pytorch_amp", False), ("pytorch_amp_cuda_graph", True)):
                    if graphed and batch != 1:
                        continue
                    run = _torch_amp(model.graph, model.params, torch, batch, graphed)
                    theirs = timings_us(lambda d=data, r=run: r(d), repeat, warmup=3)
                    row[label] = theirs
                    row[f"ratio_vs_{label}"] = round(theirs["median_us"] / ours["median_us"], 3)
        results[f"batch{batch}"] = row
    results["top1_agreement_vs_fp32"] = top1_agreement(model, single, agreement_inputs)
    bf16 = engine.load_model(net, params, device="gpu", precision="bf16")
    for batch in batches:
        data = rng.normal(size=(batch, 3, 224, 224)).astype(np.float32)
        timing = timings_us(lambda d=data: bf16.infer({"data": d}), repeat, warmup=3)
        results[f"bf16_batch{batch}"] = {
            "engine": timing, "engine_images_per_s": round(batch / timing["median_us"] * 1e6, 1),
            "plan": bf16.plan_for({"data": data}).execution_stats()}
    results["bf16_top1_agreement_vs_fp32"] = top1_agreement(bf16, single, agreement_inputs)
    results["target"] = ("ratio_vs_pytorch_amp >= 1.0 at batch 128, ratio_vs_pytorch_amp_cuda_"
                         "graph >= 1.0 at batch 1, top1_agreement_vs_fp32 >= 0.99 on 256")
    return results


def bench_launches() -> dict[str, Any]:
    """Plan steps and captured kernel launches per forward, without and with fusion."""
    from engine.cuda.graphs import kernel_node_count

    files = (SEED_MLP / "seed_mlp-symbol.json", SEED_MLP / "seed_mlp-0000.params")
    net, params = resnet50_v1()
    models = {"seed_mlp": (files, {"data": np.zeros((1, 512), np.float32)}),
              "resnet50_v1": ((net, params), {"data": np.zeros((1, 3, 224, 224), np.float32)})}
    results: dict[str, Any] = {}
    for name, (source, feed) in models.items():
        for label, passes in (("before_fusion", ALL_BUT_FUSION), ("after_fusion", True)):
            model = engine.load_model(*source, device="gpu", optimize=passes)
            for _ in range(3):
                model.infer(feed)
            plan = model.plan_for(feed)
            graph = plan._gpu.graph if plan._gpu is not None else None
            results[f"{name}_{label}"] = {
                "plan_steps": len(plan.steps),
                "kernel_launches": kernel_node_count(graph) if graph is not None else None,
                "cuda_graph_error": plan.execution_stats()["cuda_graph_error"]}
    return results


def machine() -> dict[str, Any]:
    """The GPU, CUDA and library versions the numbers were measured with."""
    import cupy

    from engine.cuda import cudnn_conv

    properties = cupy.cuda.runtime.getDeviceProperties(0)
    name = properties["name"]
    cudnn_reason = cudnn_conv.unavailable_reason()
    return {"gpu": name.decode() if isinstance(name, bytes) else name,
            "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
            "cupy": cupy.__version__, "numpy": np.__version__,
            "cudnn": cudnn_reason or importlib.import_module("cudnn").backend_version(),
            "python": platform.python_version(), "host": platform.node()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, batches 1 and 32")
    parser.add_argument("--output", type=Path, help="also write the results as JSON here")
    options = parser.parse_args()
    reason = gpu_unavailable_reason()
    if reason:
        print(f"bench/gpu.py needs an NVIDIA GPU with CuPy: {reason}", file=sys.stderr)
        return 2
    results = {"machine": machine(),
               "seed_mlp_batch1": bench_mlp(300 if options.quick else 3000),
               "launches_per_forward": bench_launches(),
               "resnet50_v1_fp32": bench_resnet((1, 32) if options.quick else (1, 32, 128),
                                                5 if options.quick else 20),
               "resnet50_v1_fp16": bench_resnet_half((1, 32) if options.quick else (1, 32, 128),
                                                     5 if options.quick else 20,
                                                     64 if options.quick else 256)}
    text = json.dumps(results, indent=2)
    print(text)
    if options.output:
        options.output.parent.mkdir(parents=True, exist_ok=True)
        options.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
