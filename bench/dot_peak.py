"""Benchmark: one core's multiply-add ceiling, the rate our kernels are measured against.

A loop of vector multiply-adds into register accumulators, nothing loaded or stored: bf16
``vdpbf16ps`` (two pairs' products a float32 lane, 64 FLOPs a 512-bit instruction) where the
host has AVX512_BF16, and float32 fused multiply-adds (32 FLOPs a 512-bit instruction; LLVM
splits them on a host without AVX-512). Each accumulator is a chain of dependent adds, so
with too few of them the loop waits on the instruction's latency, with enough it runs at the
core's throughput: a kernel's register tile of N accumulators cannot beat the N row.

With AVX512_BF16 it also times a direct convolution tile's K loop as the kernels run it
(`tile_rate`): per step, ``vectors`` vectors of grid words loaded from one unaligned address
and ``rows`` weight words broadcast, ``rows × vectors`` ``vdpbf16ps``, over buffers that stay
in L1: `conv_bf16_ir`'s tile is 8 × 2, `conv_bf16_pixels_ir`'s 14 × 2 (pixels broadcast,
filters loaded). Where such a loop reaches the ceiling, a layer's time past it lies outside
the K loop.

Usage: python bench/dot_peak.py [--accumulators 12,16,24,28] [--tiles 8x2,14x2]
[--iterations N]
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from functools import cache
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's engine

from engine.cpu import host_features, llvm_jit  # noqa: E402
from engine.kernels.gemm_bf16_ir import DOT_PRODUCT, BFloatType  # noqa: E402

LANES = 16
# FLOPs of one instruction over 16 float32 lanes: bf16's two products and their adds a
# lane, float32's one of each.
FLOPS = {"bf16": 4 * LANES, "fp32": 2 * LANES}


def build(kind: str, accumulators: int) -> Any:
    """The module of ``peak(iterations, seed) -> float``: ``accumulators`` vectors, lane ``k``
    of accumulator ``a`` starting at ``a``, each gaining ``x·y`` per iteration (every lane of
    x and y ``seed + 1`` and ``seed + 2``, bf16 pairs for ``bf16``); the sum of accumulator
    lanes 0, so that nothing is optimised away."""
    import llvmlite.ir as ir

    f32, i64 = ir.FloatType(), ir.IntType(64)
    vector = ir.VectorType(f32, LANES)
    module = ir.Module(name=f"dot_peak_{kind}")
    if kind == "bf16":
        operand = ir.VectorType(BFloatType(), 2 * LANES)
        step = ir.Function(module, ir.FunctionType(vector, [vector, operand, operand]),
                           name=DOT_PRODUCT)
    else:
        operand = vector
        step = ir.Function(module, ir.FunctionType(vector, [vector, vector, vector]),
                           name="llvm.fma.v16f32")
    function = ir.Function(module, ir.FunctionType(f32, [i64, f32]), name="peak")
    iterations, seed = function.args
    entry, body, done = (function.append_basic_block(name) for name in ("entry", "body", "done"))
    builder = ir.IRBuilder(entry)
    seeded = builder.insert_element(ir.Constant(vector, [0.0] * LANES), seed,
                                    ir.Constant(ir.IntType(32), 0))
    seeded = builder.shuffle_vector(seeded, seeded, ir.Constant(ir.VectorType(
        ir.IntType(32), LANES), [0] * LANES))
    x, y = (builder.bitcast(builder.fadd(seeded, ir.Constant(vector, [shift] * LANES)), operand)
            for shift in (1.0, 2.0))
    builder.branch(body)
    builder = ir.IRBuilder(body)
    count = builder.phi(i64)
    count.add_incoming(i64(0), entry)
    sums = []
    for index in range(accumulators):
        cell = builder.phi(vector)
        cell.add_incoming(ir.Constant(vector, [float(index)] * LANES), entry)
        sums.append(cell)
    if kind == "bf16":
        added = [builder.call(step, [cell, x, y]) for cell in sums]
    else:
        added = [builder.call(step, [x, y, cell]) for cell in sums]
    close_loop(builder, (body, done), count, iterations, sums, added)
    return module


def close_loop(builder: Any, blocks: tuple[Any, Any], count: Any, iterations: Any,
               sums: list[Any], added: list[Any]) -> None:
    """The end of a loop ``body`` (``blocks``: it and the block after it): each accumulator
    phi in ``sums`` takes its ``added`` value, ``count`` its successor, the loop runs again
    while that is below ``iterations``, and after it the sum of the accumulators' lanes 0 is
    returned, so that nothing is optimised away."""
    import llvmlite.ir as ir

    body, done = blocks
    for cell, value in zip(sums, added, strict=True):
        cell.add_incoming(value, body)
    following = builder.add(count, ir.IntType(64)(1))
    count.add_incoming(following, body)
    builder.cbranch(builder.icmp_signed("<", following, iterations), body, done)
    builder = ir.IRBuilder(done)
    total = added[0]
    for value in added[1:]:
        total = builder.fadd(total, value)
    builder.ret(builder.extract_element(total, ir.Constant(ir.IntType(32), 0)))


@cache
def compiled(kind: str, accumulators: int) -> tuple[Any, Any] | None:
    """(engine, ``peak`` as a ctypes function) for the host, or None where it cannot run
    (bf16 without AVX512_BF16, or no LLVM JIT)."""
    if kind == "bf16" and not host_features.bf16_dot_product():
        return None
    engine = llvm_jit.compile_for_host(lambda: build(kind, accumulators))
    if engine is None:
        return None
    peak = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_int64, ctypes.c_float)(
        engine.get_function_address("peak"))
    return engine, peak


def rate(kind: str, accumulators: int, iterations: int, rounds: int = 5) -> float | None:
    """The best of ``rounds`` loops' GFLOP/s, or None where the loop cannot run here."""
    made = compiled(kind, accumulators)
    if made is None:
        return None
    best = quickest(lambda: made[1](iterations, 0.5), rounds)
    return iterations * accumulators * FLOPS[kind] / best / 1e9


def quickest(call: Any, rounds: int) -> float:
    """The best of ``rounds`` calls of ``call``, in seconds."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


# The grid words a tile step loads: 64 steps' rows, ``STEP_WORDS`` words apart, read from
# ``SHIFT`` words past a line as a tap's shifted columns are.
STEP_WORDS, SHIFT, STEPS = 40, 3, 64


def build_tile(rows: int, vectors: int) -> Any:
    """The module of ``tile_peak(iterations, a, b) -> float``: ``rows × vectors``
    accumulators from zero; each iteration ``k`` loads ``vectors`` vectors of bf16 pairs from
    ``b`` at word ``(k mod 64)·STEP_WORDS + SHIFT`` and broadcasts ``rows`` words of ``a``
    from word ``(k mod 64)·rows``, adding each word's products to each vector's accumulator;
    the sum of the accumulators' lanes 0."""
    import llvmlite.ir as ir

    from engine.kernels.task_ir import splat

    f32, i64 = ir.FloatType(), ir.IntType(64)
    vector = ir.VectorType(f32, LANES)
    operand = ir.VectorType(BFloatType(), 2 * LANES)
    module = ir.Module(name=f"dot_peak_tile_{rows}x{vectors}")
    step = ir.Function(module, ir.FunctionType(vector, [vector, operand, operand]),
                       name=DOT_PRODUCT)
    pointer = f32.as_pointer()
    function = ir.Function(module, ir.FunctionType(f32, [i64, pointer, pointer]),
                           name="tile_peak")
    iterations, a, b = function.args
    entry, body, done = (function.append_basic_block(name) for name in ("entry", "body", "done"))
    ir.IRBuilder(entry).branch(body)
    builder = ir.IRBuilder(body)
    count = builder.phi(i64)
    count.add_incoming(i64(0), entry)
    sums = []
    for _ in range(rows * vectors):
        cell = builder.phi(vector)
        cell.add_incoming(ir.Constant(vector, [0.0] * LANES), entry)
        sums.append(cell)
    row = builder.and_(count, i64(STEPS - 1))
    b_step = builder.gep(b, [builder.add(builder.mul(row, i64(STEP_WORDS)), i64(SHIFT))])
    a_step = builder.gep(a, [builder.mul(row, i64(rows))])
    words = [builder.bitcast(builder.load(builder.bitcast(builder.gep(
        b_step, [i64(j * LANES)]), vector.as_pointer()), align=4), operand)
        for j in range(vectors)]
    added = []
    for i in range(rows):
        weight = builder.bitcast(splat(builder, builder.load(builder.gep(a_step, [i64(i)])),
                                       vector), operand)
        added += [builder.call(step, [sums[i * vectors + j], weight, words[j]])
                  for j in range(vectors)]
    close_loop(builder, (body, done), count, iterations, sums, added)
    return module


@cache
def compiled_tile(rows: int, vectors: int) -> tuple[Any, Any] | None:
    """(engine, ``tile_peak`` as a ctypes function) for the host, or None without
    AVX512_BF16 or an LLVM JIT."""
    if not host_features.bf16_dot_product():
        return None
    engine = llvm_jit.compile_for_host(lambda: build_tile(rows, vectors))
    if engine is None:
        return None
    peak = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)(
        engine.get_function_address("tile_peak"))
    return engine, peak


def tile_buffers(rows: int, vectors: int, weight: float = 1.5,
                 word: float = 2.5) -> tuple[Any, Any]:
    """The tile loop's weights and grid words: every float ``weight`` or ``word`` (as bf16
    pairs, its upper half that value and its lower half zero)."""
    import numpy as np

    return (np.full(STEPS * rows, weight, np.float32),
            np.full(STEPS * STEP_WORDS + SHIFT + vectors * LANES, word, np.float32))


def tile_rate(rows: int, vectors: int, iterations: int, rounds: int = 5) -> float | None:
    """The best of ``rounds`` tile loops' GFLOP/s, or None where it cannot run here."""
    made = compiled_tile(rows, vectors)
    if made is None:
        return None
    a, b = tile_buffers(rows, vectors)
    best = quickest(lambda: made[1](iterations, a.ctypes.data, b.ctypes.data), rounds)
    return iterations * rows * vectors * FLOPS["bf16"] / best / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accumulators", default="12,16,24,28",
                        help="comma list of register accumulators to try")
    parser.add_argument("--tiles", default="8x2,14x2",
                        help="comma list of ROWSxVECTORS direct convolution tiles to time")
    parser.add_argument("--iterations", type=int, default=2_000_000)
    options = parser.parse_args()
    counts = [int(text) for text in options.accumulators.split(",")]
    print("one thread, GFLOP/s, best of 5 loops of", options.iterations, "iterations")
    for kind in FLOPS:
        cells = [rate(kind, count, options.iterations) for count in counts]
        listed = ", ".join(f"{count} accumulators {value:.0f}" for count, value in
                           zip(counts, cells, strict=True) if value is not None)
        print(f"  {kind}: {listed or 'not on this host'}")
    tiles = [tuple(int(part) for part in text.split("x")) for text in options.tiles.split(",")]
    cells = [tile_rate(rows, vectors, options.iterations) for rows, vectors in tiles]
    listed = ", ".join(f"{rows}×{vectors} {value:.0f}" for (rows, vectors), value in
                       zip(tiles, cells, strict=True) if value is not None)
    print(f"  bf16 tiles' K loops (rows × vectors), grid words loaded, weights broadcast: "
          f"{listed or 'not on this host'}")


if __name__ == "__main__":
    main()
