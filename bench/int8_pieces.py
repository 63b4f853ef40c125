"""Benchmark: the int8 path's compiled passes other than the GEMM, each on one thread against
what runs in its place where it is missing, on the shapes ResNet-18 and MobileNet v2 give them
at batch 1 (interleaved rounds, medians of the thread's CPU time).

* affine (`int8_affine`, a BatchNorm and relu between two int8 layers, both channels-last):
  the LLVM IR task (`int8_affine_ir`, the variant the host builds), the numba pass, and
  NumPy's float32 form (`ranges.saturate_round` of ``x · scale + shift``);
* quantize (`int8_convert`, the image into channels-last bytes): the IR task
  (`int8_convert_ir`), the numba pass, and NumPy's quantize then transpose;
* depthwise (`int8_depthwise`, MobileNet v2's 3×3 windows, uint8 handed over channels-last,
  written channels-last): the IR task (`depthwise_int8_ir`), numba's one-pass window, and
  the NumPy path a plan runs without them (`integer.conv`'s float64 sums, the bias,
  `requantize.finish`).

Each variant's bytes are checked equal to NumPy's before timing.

``--depthwise-against FILE`` instead times the depthwise IR task (the variant the host builds)
of this checkout beside the one another ``depthwise_int8_ir.py`` builds (an earlier commit's),
on the same layer's context, in turn (the order reversed each round): each shape's best and
median µs, and the ratio of the summed bests.

Usage: python bench/int8_pieces.py [--rounds N] [--only affine|quantize|depthwise]
[--depthwise-against FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's engine

from engine.cpu import blas_threads, host_features, llvm_jit, spin_pool  # noqa: E402
from engine.kernels import (  # noqa: E402
    depthwise_int8_ir,
    int8_affine,
    int8_conv,
    int8_convert,
    int8_depthwise,
)
from engine.ops.quantized import integer, ranges  # noqa: E402
from engine.ops.quantized.requantize import finish  # noqa: E402

RNG = np.random.default_rng(7)
# ResNet-18's activations at batch 1, (C, H, W): each stage's
AFFINE_SHAPES = [(64, 56, 56), (128, 28, 28), (256, 14, 14), (512, 7, 7)]
# MobileNet v2's 3×3 depthwise layers at batch 1: (C, H, W, stride)
DEPTHWISE_SHAPES = [(32, 112, 112, 1), (96, 112, 112, 2), (144, 56, 56, 1), (144, 56, 56, 2),
                    (192, 28, 28, 1), (192, 28, 28, 2), (384, 14, 14, 1), (576, 14, 14, 2),
                    (960, 7, 7, 1)]


def laid(array: np.ndarray) -> np.ndarray:
    """An NCHW-shaped buffer holding ``array``'s values N, H, W, C."""
    return np.ascontiguousarray(np.moveaxis(array, 1, -1)).reshape(array.shape)


def timed(calls: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Each call's median CPU time in ms over ``rounds`` rounds, the calls in turn a round."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():
        call()  # compiled and in cache
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.thread_time()
            call()
            times[name].append(time.thread_time() - start)
    return {name: 1e3 * statistics.median(values) for name, values in times.items()}


class _NoVector:
    """Inside, ``module.attribute`` (a vector task's lookup) answers None: the numba pass
    binds."""

    def __init__(self, module: object, attribute: str) -> None:
        self.module, self.attribute = module, attribute

    def __enter__(self) -> None:
        self.saved = getattr(self.module, self.attribute)
        setattr(self.module, self.attribute, lambda *args, **kwargs: None)

    def __exit__(self, *exception: object) -> None:
        setattr(self.module, self.attribute, self.saved)


def _numpy_affine(values: np.ndarray, scale: np.ndarray, shift: np.ndarray) -> np.ndarray:
    return ranges.saturate_round(values.astype(np.float32) * scale + shift, np.uint8)


def _numpy_quantize(values: np.ndarray, scale: np.float32) -> np.ndarray:
    return laid(ranges.saturate_round(values * scale, np.uint8))


def affine(rounds: int) -> None:
    print("affine (uint8 -> uint8, both channels-last), ms:")
    for shape in AFFINE_SHAPES:
        values = RNG.integers(0, 256, (1, *shape)).astype(np.uint8)
        scale = RNG.uniform(0.2, 2.0, shape[0]).astype(np.float32)
        shift = RNG.uniform(-60, 60, shape[0]).astype(np.float32)
        want = ranges.saturate_round(values.astype(np.float32) * scale.reshape(1, -1, 1, 1)
                                     + shift.reshape(1, -1, 1, 1), np.uint8)
        data = laid(values)
        out_ir, out_numba = np.empty_like(data), np.empty_like(data)
        ir_job = int8_affine.affine_job(data, scale, shift, out_ir, True, True)
        with _NoVector(int8_affine, "vector_task"):
            numba_job = int8_affine.affine_job(data, scale, shift, out_numba, True, True)
        assert ir_job.args != numba_job.args
        ir_job(), numba_job()
        for out in (out_ir, out_numba):
            np.testing.assert_array_equal(out, laid(want))

        numpy_form = partial(_numpy_affine, values, scale.reshape(1, -1, 1, 1),
                             shift.reshape(1, -1, 1, 1))
        report(shape, timed({"ir": ir_job, "numba": numba_job, "numpy": numpy_form}, rounds))


def quantize(rounds: int) -> None:
    print("quantize (float32 image -> uint8 channels-last), ms:")
    for shape in [(3, 224, 224)]:
        values = RNG.standard_normal((1, *shape)).astype(np.float32)
        scale = np.array([40.0], np.float32)
        want = laid(ranges.saturate_round(values * scale[0], np.uint8))
        out_ir, out_numba = np.empty(values.shape, np.uint8), np.empty(values.shape, np.uint8)
        ir_job = int8_convert.quantize_channels_last_job(values, scale, 0, 255, out_ir)
        with _NoVector(int8_convert, "vector_task"):
            numba_job = int8_convert.quantize_channels_last_job(values, scale, 0, 255,
                                                                out_numba)
        assert ir_job.args != numba_job.args
        ir_job(), numba_job()
        for out in (out_ir, out_numba):
            np.testing.assert_array_equal(out, want)

        numpy_form = partial(_numpy_quantize, values, scale[0])
        report(shape, timed({"ir": ir_job, "numba": numba_job, "numpy": numpy_form}, rounds))


def depthwise(rounds: int) -> None:
    print("depthwise 3x3 (uint8 channels-last -> uint8 channels-last, relu6), ms:")
    for channels, height, width, stride in DEPTHWISE_SHAPES:
        data = RNG.integers(0, 256, (1, channels, height, width)).astype(np.uint8)
        weight = RNG.integers(-127, 128, (channels, 1, 3, 3)).astype(np.int8)
        geometry = int8_conv.Geometry((3, 3), (stride, stride), (1, 1), (1, 1))
        out_shape = (1, channels, *geometry.out_size(height, width))
        epilogue = int8_conv.Epilogue(
            bias=RNG.integers(-3000, 3000, channels).astype(np.int32),
            scales=np.full(channels, 128 / (3 * 127 * 60), np.float32), act="bounded_relu",
            act_high=200.5, low=0, high=255)

        def numpy_form(data=data, weight=weight, stride=stride, epilogue=epilogue,
                       channels=channels) -> np.ndarray:
            sums = integer.conv(data, weight, (3, 3), (stride, stride), (1, 1), (1, 1),
                                channels)
            sums += epilogue.bias.astype(np.float64).reshape(1, -1, 1, 1)
            from engine.ops.quantized.subgraph_attrs import Activation

            return finish(sums, epilogue.scales, 1, np.dtype(np.uint8),
                          Activation("bounded_relu", 200.5), None)

        want = laid(numpy_form())
        layouts = int8_conv.Layouts(data=True, out=True)
        out_ir, out_numba = np.empty(out_shape, np.uint8), np.empty(out_shape, np.uint8)
        ir_layer = int8_depthwise.FusedDepthwise(laid(data), weight, geometry, out_ir, None,
                                                 layouts)
        numba_layer = int8_depthwise.FusedDepthwise(laid(data), weight, geometry, out_numba,
                                                    None, layouts)
        ir_jobs = ir_layer.jobs_for(epilogue)
        with _NoVector(int8_depthwise, "_vector_task"):
            numba_jobs = numba_layer.jobs_for(epilogue)
        assert len(ir_jobs) == 1 and len(numba_jobs) == 2  # the numba window needs a copy
        for jobs in (ir_jobs, numba_jobs):
            for job in jobs:
                job()
        for out in (out_ir, out_numba):
            np.testing.assert_array_equal(out, want)

        def run(jobs: tuple) -> Callable[[], None]:
            def call() -> None:
                for job in jobs:
                    job()
            return call

        report((channels, height, width, f"s{stride}"), timed(
            {"ir": run(ir_jobs), "numba": run(numba_jobs), "numpy": numpy_form}, rounds))


def depthwise_against(rounds: int, against: str) -> None:
    """`DEPTHWISE_SHAPES` on this checkout's depthwise IR task and on ``against``'s."""
    spec = importlib.util.spec_from_file_location("depthwise_int8_ir_against", against)
    other = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other)
    engine = llvm_jit.compile_for_host(other.module)  # the variant the host calls for
    if engine is None or not int8_depthwise.vector_available():
        raise SystemExit("the depthwise IR task does not compile here")
    print(f"depthwise IR task: this checkout against {against}, µs best / median:")
    summed = {"this": 0.0, "against": 0.0}
    asked: list[bool] = []  # whether the bind took the folded task
    vector_task = int8_depthwise._vector_task

    def spied(stride: int, folded: bool = False) -> int | None:
        asked.append(folded)
        return vector_task(stride, folded)

    for channels, height, width, stride in DEPTHWISE_SHAPES:
        data = RNG.integers(0, 256, (1, channels, height, width)).astype(np.uint8)
        weight = RNG.integers(-127, 128, (channels, 1, 3, 3)).astype(np.int8)
        geometry = int8_conv.Geometry((3, 3), (stride, stride), (1, 1), (1, 1))
        out = np.empty((1, channels, *geometry.out_size(height, width)), np.uint8)
        epilogue = int8_conv.Epilogue(
            bias=RNG.integers(-3000, 3000, channels).astype(np.int32),
            scales=np.full(channels, 128 / (3 * 127 * 60), np.float32), act="bounded_relu",
            act_high=200.5, low=0, high=255)
        layer = int8_depthwise.FusedDepthwise(laid(data), weight, geometry, out, None,
                                              int8_conv.Layouts(data=True, out=True))
        int8_depthwise._vector_task = spied
        try:
            (job,) = layer.jobs_for(epilogue)
        finally:
            int8_depthwise._vector_task = vector_task
        task = engine.get_function_address(depthwise_int8_ir.task_name(stride, asked[-1]))
        jobs = {"this": job, "against": spin_pool.job(task, job.keep[0], 1, keep=job.keep)}
        outputs = []
        for call in jobs.values():
            out[...] = 0
            call()
            outputs.append(out.copy())
        np.testing.assert_array_equal(outputs[0], outputs[1])
        times: dict[str, list[float]] = {name: [] for name in jobs}
        for round_number in range(rounds):
            for name in list(jobs)[::1 if round_number % 2 == 0 else -1]:
                start = time.thread_time()
                jobs[name]()
                times[name].append(time.thread_time() - start)
        for name in summed:
            summed[name] += min(times[name])
        print(f"  {str((channels, height, width, f's{stride}')):24s}" + "".join(
            f"  {name} {1e6 * min(values):7.1f} / {1e6 * statistics.median(values):7.1f}"
            for name, values in times.items())
            + f"   best ratio {min(times['this']) / min(times['against']):.3f}")
    print(f"  summed bests: this {1e6 * summed['this']:.1f} µs, against "
          f"{1e6 * summed['against']:.1f} µs, ratio {summed['this'] / summed['against']:.3f}")


def report(shape: tuple, medians: dict[str, float]) -> None:
    print(f"  {str(shape):24s}" + "".join(f"  {name} {value:8.3f}"
                                           for name, value in medians.items())
          + f"   numba/ir {medians['numba'] / medians['ir']:.2f}x"
          + f"   numpy/ir {medians['numpy'] / medians['ir']:.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--only", choices=("affine", "quantize", "depthwise"))
    parser.add_argument("--depthwise-against", metavar="FILE",
                        help="time the depthwise IR task against another depthwise_int8_ir.py")
    args = parser.parse_args()
    print("host:", ", ".join(name for name, present in host_features.summary().items()
                             if present) or "no AVX-512", "| IR variant:",
          "AVX-512" if host_features.has("avx512bw") else "generic")
    with blas_threads.one_thread():
        if args.depthwise_against:
            depthwise_against(args.rounds, args.depthwise_against)
            return
        for name, bench in (("affine", affine), ("quantize", quantize),
                            ("depthwise", depthwise)):
            if args.only in (None, name):
                bench(args.rounds)


if __name__ == "__main__":
    main()
