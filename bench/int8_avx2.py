"""Benchmark: the AVX2 int8 GEMM (`gemm_int8_avx2_ir`) against the two kernels it was chosen
over, one thread, the same packed weights and tiles of 2 rows by 16-column strips:

* ``vpmaddwd``: the kernel `gemm_int8` compiles (operands widened to int16, exact), its
  activations buffered once per row block where a panel has several strips;
* ``per strip``: the same kernel with each strip widening the activations itself;
* ``int16 weights``: the same kernel reading the packed weights stored as int16 (no
  widening in the K loop, twice the bytes);
* ``vpmaddubsw``: the bytes multiplied as they are (``vpmaddubsw``, then ``vpmaddwd`` by ones
  into int32, `gemm_int8_avx2_ir.NarrowInt8Kernel`): its int16 pair sums saturate past
  32 767, so it is exact only for activations under 128 or weights within ±63 (checked here
  on 7-bit and on full 8-bit activations, and on 8-bit activations by 7-bit weights).

Each kernel's ``panels`` is called directly on rows already padded (no copy), the thread's CPU
time, the best and the median of rounds each taking the best of many calls, in turn.

``--instructions`` instead times a loop of ten independent chains of one instruction
(``vpmaddwd``, ``vpmaddubsw``, ``vfmadd231ps``, ``vpaddd`` on ymm registers): how many of
each the core starts a second, the rate float32's FMA beside the integer products'.

``--narrow-tiles`` instead times the ``vpmaddubsw`` kernel alone at several tiles, rows by
strip columns (``NarrowInt8Kernel(rows, vectors, strip)``; `gemm_int8.NARROW_ROWS` by 16 is the
one `gemm_int8` compiles), on weights within ±63 and full 8-bit activations, each checked
against NumPy's sums, in turn as above.

``--classifier`` instead times the one-row tiles (a classifier at batch 1), ``vpmaddubsw`` on
weights within ±63 and ``vpmaddwd`` on full-range ones, on MobileNet v2's and ResNet's
classifiers, 16-column strips against a strip of the whole panel (the one `gemm_int8`
compiles), each call after a pass over ``--evict`` MB and once warm.

``--edge`` instead times 49 rows (ResNet's 7² layers) on the ``vpmaddubsw`` tiles: 13 tiles
of `gemm_int8.NARROW_ROWS` rows against 12 and the last row on the one-row tile.

``--layers`` times whole fused int8 convolutions (`int8_conv.FusedConv`: copy, gather,
product, requantize) of ResNet's shapes at ``--batch``, weights within ±63, packed once for
2-row ``vpmaddubsw`` tiles and once for `gemm_int8.NARROW_ROWS` rows, the two in turn each
round (each the best of 5 calls), and checks that both write the same bytes.

``--windows`` times the same convolutions at `gemm_int8.NARROW_ROWS` rows with their patches
gathered (`gemm_int8.table_runs` answering False while they bind) against the form a plan
binds now (windows read where they lie, `gemm_int8.table_job`; the stem packed by
`int8_conv.run_matrix`), in turn, and checks the bytes.

``--requantize`` times the requantize jobs alone (`int8_conv._requantize`) of ResNet's
convolutions as a plan binds them (channels-last data and output, relu; with a channels-last
int8 residual and relu after the sum, and without), the sums the layer's product wrote, against
the same jobs of another ``int8_conv.py`` (``--requantize-against FILE``, e.g. an earlier
commit's through ``git show``) in turn, and checks that both write the same bytes; without
one it prints each layer's jobs by kind and the requantize pass's share of the layer.

``--chunks`` times the same convolutions bound with a chained layer's shares
(`int8_conv.FusedConv._window_chain`) of `int8_conv.CHUNK_BYTES` of sums and of
`int8_conv.chunk_bytes` (a quarter of a small L2), in turn, and checks the bytes.

``--panels`` times the table product (`gemm_int8.table_job`) of a 3×3 512 → 512 layer at 7²
(its windows read where they lie in a padded copy) over one panel of 64 filters against all
eight, in turn, as GOP/s: the one panel's weights (295 KB) stay in a core's L2 from call to
call, the eight (2.4 MB) are read from L3 or memory each call, as a plan reads them.

Usage: python bench/int8_avx2.py [--rounds N] [--instructions | --narrow-tiles | --layers |
--windows | --chunks | --requantize [--requantize-against FILE] | --classifier [--evict MB] |
--edge | --panels] [--batch B]   (a host with AVX2)
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's engine

import llvmlite.ir as ir  # noqa: E402

from engine.cpu import host_features  # noqa: E402
from engine.kernels import gemm_int8, gemm_int8_avx2_ir  # noqa: E402
from engine.kernels.gemm_int8_ir import (  # noqa: E402
    I8,
    I32,
    I64,
)

SHAPES = ((3136, 576, 64), (3136, 64, 256), (784, 1152, 128), (196, 2304, 256),
          (49, 4608, 512))
BYTES = ir.VectorType(I8, 32)
WORDS = gemm_int8_avx2_ir.WORDS
SUMS = gemm_int8_avx2_ir.SUMS


KERNELS: dict[str, Callable[[int, int], gemm_int8_avx2_ir.Avx2Int8Kernel]] = {
    "vpmaddwd": lambda rows, vectors: gemm_int8_avx2_ir.Avx2Int8Kernel(rows, vectors),
    "per strip": lambda rows, vectors: gemm_int8_avx2_ir.Avx2Int8Kernel(rows, vectors,
                                                                        buffered=False),
    "int16 weights": lambda rows, vectors: gemm_int8_avx2_ir.Avx2Int8Kernel(rows, vectors,
                                                                            wide=True),
    "vpmaddubsw": gemm_int8_avx2_ir.NarrowInt8Kernel,
}
# the kernels reading weights stored as int16 (the same order as the int8 panels)
WIDE = {"int16 weights"}


def compiled(kernel: gemm_int8_avx2_ir.Avx2Int8Kernel, keep: list) -> Callable[..., None]:
    import llvmlite.binding as llvm

    from engine.cpu.llvm_jit import compile_ir

    kernel.define("panels")
    llvm.initialize_native_target()
    engine = compile_ir(str(kernel.module), llvm.get_host_cpu_name(),
                        llvm.get_host_cpu_features().flatten(), level=3, optimise=True)
    keep.append(engine)
    return gemm_int8._SIGNATURE(engine.get_function_address("panels"))


def bound(panels: Callable[..., None], rows: np.ndarray, packed: gemm_int8.PackedWeights,
          out: np.ndarray, weights: np.ndarray | None = None,
          blocks: int | None = None) -> Callable[[], None]:
    """``panels`` over all of ``rows`` (padded) and every panel of ``packed`` into ``out``;
    ``weights``: the panels to read in place of ``packed``'s (its int16 copy); ``blocks``:
    the row blocks, by default of `gemm_int8.AVX2_ROWS` rows."""
    blocks = blocks or rows.shape[0] // gemm_int8.AVX2_ROWS
    address = packed.addresses[0] if weights is None else weights.ctypes.data
    arguments = (rows.ctypes.data, rows.shape[1], address, packed.groups,
                 out.ctypes.data, out.shape[1], packed.addresses[1], blocks, 0, packed.panels)
    return lambda: panels(*arguments)


def chains(instruction: str, count: int = 10) -> ir.Module:
    """``run(steps)``: ``count`` independent chains, each step one ``instruction`` a chain
    (its own result fed back as an operand), the chains' sum returned so nothing is dropped."""
    module = ir.Module(name="hybridserve_instruction_rate")
    floats = ir.VectorType(ir.FloatType(), 8)
    vector, operand = {"vpmaddwd": (WORDS, WORDS), "vpmaddubsw": (BYTES, BYTES),
                       "vfmadd231ps": (floats, floats), "vpaddd": (SUMS, SUMS)}[instruction]
    if instruction == "vpmaddwd":
        product = ir.Function(module, ir.FunctionType(SUMS, [WORDS, WORDS]),
                              name="llvm.x86.avx2.pmadd.wd")
    elif instruction == "vpmaddubsw":
        product = ir.Function(module, ir.FunctionType(WORDS, [BYTES, BYTES]),
                              name="llvm.x86.avx2.pmadd.ub.sw")
    elif instruction == "vfmadd231ps":
        product = ir.Function(module, ir.FunctionType(floats, [floats] * 3),
                              name="llvm.fma.v8f32")
    function = ir.Function(module, ir.FunctionType(I32, [I64]), name="run")
    builder = ir.IRBuilder(function.append_basic_block("entry"))
    entry, loop = builder.block, function.append_basic_block("loop")
    done = function.append_basic_block("done")
    builder.branch(loop)
    builder.position_at_end(loop)
    step = builder.phi(I64)
    values = [builder.phi(vector) for _ in range(count)]
    factor = ir.Constant(operand, [1.0001 if vector == floats else 3] * operand.count)
    following = []
    for value in values:
        if instruction == "vfmadd231ps":
            following.append(builder.call(product, [value, factor, value]))
        elif instruction == "vpaddd":
            following.append(builder.add(value, factor))
        else:
            following.append(builder.bitcast(builder.call(product, [value, factor]), vector))
    step_next = builder.add(step, I64(1))
    builder.cbranch(builder.icmp_signed("<", step_next, function.args[0]), loop, done)
    step.add_incoming(I64(0), entry)
    step.add_incoming(step_next, loop)
    for index, (value, changed) in enumerate(zip(values, following, strict=True)):
        start = [1.0] * 8 if vector == floats else [index + 1] * vector.count
        value.add_incoming(ir.Constant(vector, start), entry)
        value.add_incoming(changed, loop)
    builder.position_at_end(done)
    total = builder.bitcast(following[0], SUMS)
    for changed in following[1:]:
        total = builder.xor(total, builder.bitcast(changed, SUMS))
    builder.ret(builder.extract_element(total, I32(0)))
    return module


def instruction_rates(rounds: int) -> None:
    import ctypes

    import llvmlite.binding as llvm

    from engine.cpu.llvm_jit import compile_ir

    llvm.initialize_native_target()
    steps, runs, engines = 20_000_000, {}, []
    for name in ("vpmaddwd", "vpmaddubsw", "vfmadd231ps", "vpaddd"):
        engines.append(compile_ir(str(chains(name)), llvm.get_host_cpu_name(),
                                  llvm.get_host_cpu_features().flatten(), level=3))
        runs[name] = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int64)(
            engines[-1].get_function_address("run"))
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            start = time.thread_time()
            run(steps)
            rates[name].append(10 * steps / (time.thread_time() - start) / 1e9)
    for name, values in rates.items():
        print(f"{name:12} {max(values):5.2f} billion a second "
              f"(median {statistics.median(values):.2f})")


# (rows, strip columns) of the ``vpmaddubsw`` tiles `--narrow-tiles` compares
NARROW_TILES = ((2, 16), (4, 16), (6, 16), (2, 32), (3, 32), (4, 32))
# `--narrow-tiles`' shapes: the five above, the stem's (7 × 7 × 3 patches, K 148 padded) and
# a 1×1 layer into 512 filters
NARROW_SHAPES = (*SHAPES, (12544, 148, 64), (784, 128, 512))


def narrow_tiles(rounds: int) -> None:
    """GOP/s best / median of ``rounds`` of the ``vpmaddubsw`` kernel at each of
    `NARROW_TILES`, one thread, called on padded rows."""
    rng, keep = np.random.default_rng(0), []
    print(f"one thread, vpmaddubsw, GOP/s best / median of {rounds} rounds by rows × strip; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"{'M×K×N':>16} " + " ".join(f"{f'{r} × {c}':>11}" for r, c in NARROW_TILES))
    for m, k, n in NARROW_SHAPES:
        weights = rng.integers(-63, 64, (k, n)).astype(np.int8)
        packed = gemm_int8.PackedWeights(weights)
        a = rng.integers(0, 256, (m, k)).astype(np.uint8)
        want = a.astype(np.int64) @ weights.astype(np.int64)
        calls = []
        for rows_per_tile, strip in NARROW_TILES:
            panels = compiled(gemm_int8_avx2_ir.NarrowInt8Kernel(rows_per_tile, packed.vectors,
                                                                 strip), keep)
            blocks = -(-m // rows_per_tile)
            rows = np.zeros((blocks * rows_per_tile, packed.groups * 4), np.uint8)
            rows[:m, :k] = a
            out = np.empty((len(rows), packed.panels * packed.vectors * gemm_int8.LANES),
                           np.int32)
            call = bound(panels, rows, packed, out, blocks=blocks)
            call()
            if not np.array_equal(out[:m, :n], want):
                raise SystemExit(f"{rows_per_tile} × {strip}: not NumPy's sums")
            calls.append((call, rows, out))
        best = timed([call for call, *_ in calls], m * k * n, rounds)
        work = 2 * m * k * n / 1e9
        print(f"{m:>5}×{k:>4}×{n:>4} " + " ".join(
            f"{work / min(b):4.0f} / {work / statistics.median(b):4.0f}" for b in best))


# `--layers`' convolutions: (name, channels, size, filters, kernel, stride, padding)
LAYERS = (("stem 3→64 7×7 s2 at 224²", 3, 224, 64, 7, 2, 3),
          ("stem 3→32 3×3 s2 at 224²", 3, 224, 32, 3, 2, 1),
          ("3×3 64→64 at 56²", 64, 56, 64, 3, 1, 1),
          ("3×3 64→128 s2 at 56²", 64, 56, 128, 3, 2, 1),
          ("3×3 128→128 at 28²", 128, 28, 128, 3, 1, 1),
          ("3×3 256→256 at 14²", 256, 14, 256, 3, 1, 1),
          ("3×3 512→512 at 7²", 512, 7, 512, 3, 1, 1),
          ("1×1 64→256 at 56²", 64, 56, 256, 1, 1, 0),
          ("1×1 256→64 at 56²", 256, 56, 64, 1, 1, 0),
          ("1×1 512→128 at 28²", 512, 28, 128, 1, 1, 0),
          ("1×1 1024→256 at 14²", 1024, 14, 256, 1, 1, 0),
          ("1×1 2048→512 at 7²", 2048, 7, 512, 1, 1, 0))


def layer_cases(batch: int) -> list[tuple[str, np.ndarray, np.ndarray, Any]]:
    """`LAYERS` as (name, data, weights within ±63, geometry) at ``batch``."""
    from engine.kernels import int8_conv

    if not gemm_int8.narrow_weights_pay():
        raise SystemExit("this host runs the VNNI kernels: no vpmaddubsw kernels to compare")
    rng = np.random.default_rng(0)
    cases = []
    for name, channels, size, filters, kernel, stride, pad in LAYERS:
        dtype = np.int8 if channels == 3 else np.uint8  # the stem reads the quantized image
        info = np.iinfo(dtype)
        data = rng.integers(info.min, info.max + 1, (batch, channels, size, size)).astype(dtype)
        weight = rng.integers(-63, 64, (filters, channels, kernel, kernel)).astype(np.int8)
        cases.append((name, data, weight, int8_conv.Geometry(
            (kernel, kernel), (stride, stride), (1, 1), (pad, pad))))
    return cases


def bound_layer(data: np.ndarray, weight: np.ndarray, geometry: Any,
                packed: gemm_int8.PackedWeights) -> tuple[tuple, np.ndarray]:
    """A fused convolution's jobs (channels-last data and output, relu) and its output."""
    from engine.kernels import int8_conv

    out = np.zeros((len(data), len(weight), *geometry.out_size(*data.shape[2:])), np.uint8)
    conv = int8_conv.FusedConv(data, weight, packed, geometry, out, None,
                               int8_conv.Layouts(data=True, out=True))
    return conv.jobs_for(int8_conv.Epilogue(
        bias=np.zeros(len(weight), np.int32), scales=np.full(len(weight), 2e-3, np.float32),
        act="relu", low=0, high=255)), out


def compare(made: dict, names: list[str], forms: tuple[str, str], rounds: int) -> None:
    """Each layer's two forms' jobs in turn, ms best / median, and whether their bytes agree."""
    for name in names:
        def run(jobs: tuple) -> Callable[[], None]:
            return lambda: [job() for job in jobs]
        best = timed([run(made[name, form][0]) for form in forms], 10 ** 12, rounds)
        same = np.array_equal(made[name, forms[0]][1], made[name, forms[1]][1])
        before, after = (statistics.median(b) for b in best)
        print(f"{name:26} {forms[0]} {min(best[0]) * 1e3:6.3f} / {before * 1e3:6.3f}, "
              f"{forms[1]} {min(best[1]) * 1e3:6.3f} / {after * 1e3:6.3f}: "
              f"×{after / before:.2f}{'' if same else ', NOT THE SAME BYTES'}")


def windows(rounds: int, batch: int) -> None:
    """`LAYERS` gathered against read in place, ms best / median."""
    from engine.kernels import int8_conv

    cases, made = layer_cases(batch), {}
    runs = gemm_int8.table_runs
    for form in ("gathered", "in place"):
        gemm_int8.table_runs = runs if form == "in place" else lambda weights: False
        for name, data, weight, geometry in cases:
            run = int8_conv.run_bytes(data.shape[1], geometry)
            matrix = int8_conv.run_matrix(weight, run) if run and form == "in place" else \
                int8_conv.weight_matrix(weight)
            made[name, form] = bound_layer(data, weight, geometry,
                                           gemm_int8.PackedWeights(matrix))
    gemm_int8.table_runs = runs
    print(f"batch {batch}, one thread, fused int8 convolutions, ms best / median of {rounds} "
          f"rounds; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    compare(made, [name for name, *_ in cases], ("gathered", "in place"), rounds)


def chunks(rounds: int, batch: int) -> None:
    """`LAYERS` bound with a chained layer's shares of `int8_conv.CHUNK_BYTES` of sums
    against shares of `int8_conv.chunk_bytes` (the host's L2 share), ms best / median."""
    from engine.kernels import int8_conv

    cases, made = layer_cases(batch), {}
    host = int8_conv.chunk_bytes()
    forms = (f"{int8_conv.CHUNK_BYTES >> 10} KB", f"{host >> 10} KB")
    for form, size in zip(forms, (int8_conv.CHUNK_BYTES, host), strict=True):
        int8_conv.chunk_bytes = lambda size=size: size
        for name, data, weight, geometry in cases:
            run = int8_conv.run_bytes(data.shape[1], geometry)
            matrix = int8_conv.run_matrix(weight, run) if run else int8_conv.weight_matrix(
                weight)
            made[name, form] = bound_layer(data, weight, geometry,
                                           gemm_int8.PackedWeights(matrix))
    print(f"batch {batch}, one thread, fused int8 convolutions by shares of sums, ms best / "
          f"median of {rounds} rounds; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    compare(made, [name for name, *_ in cases], forms, rounds)


def layers(rounds: int, batch: int) -> None:
    """`LAYERS` on 2-row tiles against `gemm_int8.NARROW_ROWS` rows, ms best / median."""
    from engine.kernels import int8_conv

    cases = layer_cases(batch)
    tiles, keep, made = (2, gemm_int8.NARROW_ROWS), [], {}
    chosen = gemm_int8.NARROW_ROWS
    for rows_per_tile in tiles:  # each tile's kernels compiled afresh, their engines kept
        gemm_int8.NARROW_ROWS = rows_per_tile
        gemm_int8._state.pop("narrow kernels", None)
        keep.append(gemm_int8._state.pop("narrow engines", None))
        for name, data, weight, geometry in cases:
            made[name, f"{rows_per_tile} rows"] = bound_layer(
                data, weight, geometry,
                gemm_int8.PackedWeights(int8_conv.weight_matrix(weight)))
    gemm_int8.NARROW_ROWS = chosen
    print(f"batch {batch}, one thread, fused int8 convolutions, ms best / median of {rounds} "
          f"rounds; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    compare(made, [name for name, *_ in cases], tuple(f"{rows} rows" for rows in tiles), rounds)


# ResNet-18's convolutions (its stem's patches gathered, where a plan reads them in place), and
# ResNet-50's 1×1 into 256 filters
REQUANTIZED = (("stem 3→64 7×7 s2 at 224²", 3, 224, 64, 7, 2, 3),
               ("3×3 64→64 at 56²", 64, 56, 64, 3, 1, 1),
               ("3×3 128→128 at 28²", 128, 28, 128, 3, 1, 1),
               ("3×3 256→256 at 14²", 256, 14, 256, 3, 1, 1),
               ("3×3 512→512 at 7²", 512, 7, 512, 3, 1, 1),
               ("1×1 64→256 at 56²", 64, 56, 256, 1, 1, 0))


# `timed`'s size for 20 calls a round
TWENTY_CALLS = 1_500_000


def requantize_jobs(module: Any, name: str, residual_added: bool,
                    batch: int) -> tuple[list[tuple[str, Any]], np.ndarray]:
    """A `REQUANTIZED` layer's jobs bound by ``module`` (an `int8_conv`), each with its
    kernel's name ("product" where `kernel_jobs` binds none), run once; and a copy of the
    output then (rerun alone, a layer's requantize jobs of several chunks read the last
    chunk's sums: its bytes no longer the layer's)."""
    from engine.cpu import kernel_jobs

    _, channels, size, filters, kernel, stride, pad = next(
        layer for layer in REQUANTIZED if layer[0] == name)
    rng = np.random.default_rng(channels * 7 + filters)
    dtype = np.int8 if channels == 3 else np.uint8
    info = np.iinfo(dtype)
    data = rng.integers(info.min, info.max + 1, (batch, channels, size, size)).astype(dtype)
    weight = rng.integers(-63, 64, (filters, channels, kernel, kernel)).astype(np.int8)
    geometry = module.Geometry((kernel, kernel), (stride, stride), (1, 1), (pad, pad))
    shape = (batch, filters, *geometry.out_size(size, size))
    out = np.zeros(shape, np.int8 if residual_added else np.uint8)
    residual = rng.integers(-128, 128, shape).astype(np.int8) if residual_added else None
    conv = module.FusedConv(data, weight, gemm_int8.PackedWeights(module.weight_matrix(weight)),
                            geometry, out, residual,
                            module.Layouts(data=True, out=True, residual=residual_added))
    bounds = {"residual_scale": 0.5, "postsum_act": "relu", "low": -128, "high": 127} \
        if residual_added else {"low": 0, "high": 255}
    epilogue = module.Epilogue(bias=rng.integers(-2000, 2000, filters).astype(np.int32),
                               scales=np.full(filters, 2e-3, np.float32), act="relu", **bounds)
    names, bind = [], kernel_jobs.bind

    def named(kernel: tuple[str, str], *args: Any, **keywords: Any) -> Any:
        job = bind(kernel, *args, **keywords)
        names.append((job, kernel[1]))
        return job

    kernel_jobs.bind = named
    vector = getattr(conv, "_vector_requantize", None)  # `int8_requantize_ir`'s job, if any
    if vector is not None:
        def named_vector(*args: Any) -> Any:
            job = vector(*args)
            names.append((job, "requantize"))
            return job

        conv._vector_requantize = named_vector
    try:
        jobs = conv.jobs_for(epilogue)
    finally:
        kernel_jobs.bind = bind
    for job in jobs:
        job()
    return [(next((kind for bound, kind in names if bound is job), "product"), job)
            for job in jobs], out.copy()


def requantize(rounds: int, batch: int, against: str | None) -> None:
    """`REQUANTIZED`'s requantize jobs: their share of each layer, or against ``against``."""
    from engine.kernels import int8_conv

    modules = [int8_conv]
    if against:
        spec = importlib.util.spec_from_file_location("int8_conv_against", against)
        other = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = other  # `kernel_jobs` finds the kernels by module name
        spec.loader.exec_module(other)
        modules.insert(0, other)
    print(f"batch {batch}, one thread, requantize jobs alone, ms best / median of {rounds} "
          f"rounds (each the best of 20 calls); "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for residual_added in (False, True):
        for name, channels, *_ in REQUANTIZED:
            if residual_added and channels == 3:  # a stem adds no residual
                continue
            made = [requantize_jobs(module, name, residual_added, batch) for module in modules]
            label = f"{name:22} {'residual' if residual_added else 'no residual':11}"
            if not against:
                kinds: dict[str, list[Any]] = {}
                for kind, job in made[0][0]:
                    kinds.setdefault(kind, []).append(job)
                took = {kind: statistics.median(timed(
                    [lambda jobs=jobs: [job() for job in jobs]], TWENTY_CALLS, rounds)[0])
                    for kind, jobs in kinds.items()}
                # a chained layer's passes run inside its one job, after each share's product
                share = f"requantize {took['requantize'] / sum(took.values()):.0%}" \
                    if "requantize" in took else "no requantize job of its own (chained)"
                print(f"{label} " + ", ".join(f"{kind} {seconds * 1e3:.3f}"
                                              for kind, seconds in took.items())
                      + f": {share}")
                continue
            calls = [lambda jobs=jobs: [job() for kind, job in jobs if kind == "requantize"]
                     for jobs, _ in made]
            best = timed(calls, TWENTY_CALLS, rounds)
            same = np.array_equal(made[0][1], made[1][1])
            before, after = (statistics.median(b) for b in best)
            sums = made[1][1].size
            print(f"{label} {min(best[0]) * 1e3:6.3f} / {before * 1e3:6.3f} → "
                  f"{min(best[1]) * 1e3:6.3f} / {after * 1e3:6.3f}: ×{after / before:.2f}, "
                  f"{sums / before / 1e9:.1f} → {sums / after / 1e9:.1f} G sums/s"
                  f"{'' if same else ', NOT THE SAME BYTES'}")


# `--classifier`'s products of one row: (K, N, name)
CLASSIFIERS = ((1280, 1000, "MobileNet v2"), (512, 1000, "ResNet-18"), (2048, 1000, "ResNet-50 v2"))
# (label, one-row kernel) `--classifier` compares for each weights' range: 16-column strips
# against a strip of the whole panel (the ones `gemm_int8` compiles), for narrow weights
# (``vpmaddubsw``) and full-range ones (``vpmaddwd``, which fully connected layers keep)
CLASSIFIER_KERNELS: dict[int, tuple[tuple[str, Callable[[int], Any]], ...]] = {
    63: (("vpmaddubsw, 16-column strips", lambda vectors: gemm_int8_avx2_ir.NarrowInt8Kernel(
            1, vectors)),
         ("vpmaddubsw, the whole panel", lambda vectors: gemm_int8_avx2_ir.NarrowInt8Kernel(
            1, vectors, vectors * gemm_int8.LANES))),
    127: (("vpmaddwd, 16-column strips", lambda vectors: gemm_int8_avx2_ir.Avx2Int8Kernel(
             1, vectors)),
          ("vpmaddwd, the whole panel", lambda vectors: gemm_int8_avx2_ir.Avx2Int8Kernel(
             1, vectors, buffered=False, strip=vectors * gemm_int8.LANES)))}


def classifier(rounds: int, evict_mb: int) -> None:
    """The one-row tiles on the classifiers' shapes, weights within ±63 and full range, a
    16-column strip against a strip of the whole panel, in turn: each call after a pass over
    ``evict_mb`` MB (the weights out of L2, or out of L3 past its size: as a network's walk
    leaves them), then once more at once (warm). Each checked against NumPy's sums."""
    rng, keep = np.random.default_rng(0), []
    evict = np.ones(evict_mb << 20, np.uint8)
    print(f"one thread, one row, µs median (best) of {rounds} calls after {evict_mb} MB "
          f"evicted | warm; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for k, n, name in CLASSIFIERS:
        for limit, kernels in CLASSIFIER_KERNELS.items():
            weights = rng.integers(-limit - 1 if limit == 127 else -limit, limit + 1,
                                   (k, n)).astype(np.int8)
            packed = gemm_int8.PackedWeights(weights)
            a = rng.integers(0, 256, (1, k)).astype(np.uint8)
            rows = np.zeros((1, packed.groups * 4), np.uint8)
            rows[:, :k] = a
            calls = []
            for label, make in kernels:
                panels = compiled(make(packed.vectors), keep)
                out = np.empty((1, packed.panels * packed.vectors * gemm_int8.LANES), np.int32)
                call = bound(panels, rows, packed, out, blocks=1)
                call()
                if not np.array_equal(out[:, :n],
                                      a.astype(np.int64) @ weights.astype(np.int64)):
                    raise SystemExit(f"{name}, {label}: not NumPy's sums")
                calls.append((label, call, out))  # ``out`` kept alive: the call writes there
            cold: dict[str, list[float]] = {label: [] for label, *_ in calls}
            warm: dict[str, list[float]] = {label: [] for label, *_ in calls}
            for _ in range(rounds):
                for label, call, _ in calls:
                    np.add(evict, 1, out=evict)
                    for times in (cold, warm):
                        start = time.thread_time()
                        call()
                        times[label].append(time.thread_time() - start)
            print(f"{name}'s classifier, {k} × {n} ({packed.packed.nbytes / 1e6:.2f} MB):")
            for label, *_ in calls:
                print(f"  {label:29} {statistics.median(cold[label]) * 1e6:6.1f} "
                      f"({min(cold[label]) * 1e6:5.1f}) | "
                      f"{statistics.median(warm[label]) * 1e6:5.1f} "
                      f"({min(warm[label]) * 1e6:5.1f})")


# `--edge`'s products of 49 rows (ResNet's 7² layers): (K, N, name)
EDGE_SHAPES = ((4608, 512, "3×3 512→512"), (2048, 512, "1×1 2048→512"),
               (512, 2048, "1×1 512→2048"))


def edge(rounds: int) -> None:
    """49 rows on the ``vpmaddubsw`` tiles (weights within ±63): 13 tiles of
    `gemm_int8.NARROW_ROWS` rows (52 rows computed) against 12 tiles and the 49th row on the
    one-row tile (as `gemm_int8`'s jobs run a short last block), in turn, each checked against
    NumPy's sums."""
    rng, keep, tile = np.random.default_rng(0), [], gemm_int8.NARROW_ROWS
    m = 49
    print(f"one thread, {m} rows, vpmaddubsw, µs median (range) of {rounds} rounds, each the "
          f"best of 10 calls; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for k, n, name in EDGE_SHAPES:
        weights = rng.integers(-63, 64, (k, n)).astype(np.int8)
        packed = gemm_int8.PackedWeights(weights)
        whole = compiled(gemm_int8_avx2_ir.NarrowInt8Kernel(tile, packed.vectors), keep)
        one = compiled(gemm_int8_avx2_ir.NarrowInt8Kernel(
            1, packed.vectors, packed.vectors * gemm_int8.LANES), keep)
        blocks = -(-m // tile)
        rows = np.zeros((blocks * tile, packed.groups * 4), np.uint8)
        rows[:m, :k] = rng.integers(0, 256, (m, k))
        want = rows[:m, :k].astype(np.int64) @ weights.astype(np.int64)
        out = np.empty((blocks * tile, packed.panels * packed.vectors * gemm_int8.LANES),
                       np.int32)
        tiles_only = bound(whole, rows, packed, out, blocks=blocks)
        short = m - (blocks - 1) * tile
        first = bound(whole, rows, packed, out, blocks=blocks - 1)
        last = bound(one, rows[m - short:], packed, out[m - short:], blocks=short)

        def with_edge(first: Callable[[], None] = first,
                      last: Callable[[], None] = last) -> None:
            first()
            last()

        calls = {f"{blocks} tiles": tiles_only, f"{blocks - 1} tiles + {short} row": with_edge}
        for label, call in calls.items():
            out[...] = 0
            call()
            if not np.array_equal(out[:m, :n], want):
                raise SystemExit(f"{name}, {label}: not NumPy's sums")
        times: dict[str, list[float]] = {label: [] for label in calls}
        for _ in range(rounds):
            for label, call in calls.items():
                best = float("inf")
                for _ in range(10):
                    start = time.thread_time()
                    call()
                    best = min(best, time.thread_time() - start)
                times[label].append(best)
        print(f"{m}×{k}×{n} ({name}): " + "; ".join(
            f"{label} {statistics.median(t) * 1e6:.0f} ({min(t) * 1e6:.0f}–{max(t) * 1e6:.0f})"
            for label, t in times.items()))


def panel_residency(rounds: int, batch: int) -> None:
    """The table product of a 3×3 512 → 512 layer at 7² (``batch`` images, weights within
    ±63) over 64 filters and over 512, GOP/s best / median of ``rounds`` rounds in turn, each
    the best of a few calls, each checked against NumPy's sums."""
    if not gemm_int8.narrow_weights_pay():
        raise SystemExit("this host runs the VNNI kernels: no table product to time")
    rng = np.random.default_rng(0)
    channels, size, taps = 512, 7, 3
    padded_size = size + 2
    padded = rng.integers(0, 256, (batch, padded_size, padded_size, channels)).astype(np.uint8)
    m, k = batch * size * size, taps * taps * channels
    image, y, x = (axis.ravel() for axis in np.meshgrid(
        np.arange(batch), np.arange(size), np.arange(size), indexing="ij"))
    # each window's first byte, then each group of four K values' offset from it: a kernel
    # row's 3 × 512 bytes lie together, the next kernel row a padded row on
    starts = ((image * padded_size + y) * padded_size + x) * channels
    within = np.arange(0, k, 4)
    offsets = (within // (taps * channels)) * padded_size * channels + within % (taps * channels)
    windows = np.stack([padded.reshape(-1)[start + np.arange(k) // (taps * channels)
                                           * padded_size * channels
                                           + np.arange(k) % (taps * channels)]
                        for start in starts])
    calls = {}
    for filters in (64, 512):
        weights = rng.integers(-63, 64, (k, filters)).astype(np.int8)
        packed = gemm_int8.PackedWeights(weights)
        blocks = -(-m // packed.rows)
        addresses = np.full(blocks * packed.rows, padded.ctypes.data, np.int64)
        addresses[:m] += starts
        out = np.empty((blocks * packed.rows, packed.panels * packed.vectors * gemm_int8.LANES),
                       np.int32)
        job = gemm_int8.table_job(addresses, offsets.astype(np.int64), m, packed, False, out,
                                  padded)
        job()
        if not np.array_equal(out[:m, :filters],
                              windows.astype(np.int64) @ weights.astype(np.int64)):
            raise SystemExit(f"{filters} filters: not NumPy's sums")
        calls[f"{filters} filters"] = (job, 2 * m * k * filters / 1e9)
    best = timed([job for job, _ in calls.values()], 10 ** 12, rounds)
    print(f"one thread, table product {m}×{k}×N (3×3 512 → N at 7², batch {batch}), GOP/s "
          f"best / median of {rounds} rounds; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print("; ".join(f"{label} {work / min(times):.0f} / {work / statistics.median(times):.0f}"
                    for (label, (_, work)), times in zip(calls.items(), best, strict=True)))


def timed(calls: list[Callable[[], None]], size: int, rounds: int) -> list[list[float]]:
    """Each call's best thread CPU time of many, per round, the calls in turn each round."""
    repeat = max(5, int(3e7 / size))
    best: list[list[float]] = [[] for _ in calls]
    for _ in range(rounds):
        for index, call in enumerate(calls):
            times = []
            for _ in range(repeat):
                start = time.thread_time()
                call()
                times.append(time.thread_time() - start)
            best[index].append(min(times))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--instructions", action="store_true")
    parser.add_argument("--narrow-tiles", action="store_true")
    parser.add_argument("--layers", action="store_true")
    parser.add_argument("--windows", action="store_true")
    parser.add_argument("--requantize", action="store_true")
    parser.add_argument("--chunks", action="store_true")
    parser.add_argument("--requantize-against", metavar="FILE")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--classifier", action="store_true")
    parser.add_argument("--edge", action="store_true")
    parser.add_argument("--panels", action="store_true")
    parser.add_argument("--evict", type=int, default=64, help="--classifier's MB evicted")
    options = parser.parse_args()
    if not host_features.has("avx2"):
        raise SystemExit("this host has no AVX2")
    if options.instructions:
        instruction_rates(options.rounds)
        return
    if options.edge:
        edge(options.rounds)
        return
    if options.panels:
        panel_residency(options.rounds, options.batch)
        return
    if options.classifier:
        classifier(options.rounds, options.evict)
        return
    if options.narrow_tiles:
        narrow_tiles(options.rounds)
        return
    if options.layers:
        layers(options.rounds, options.batch)
        return
    if options.windows:
        windows(options.rounds, options.batch)
        return
    if options.chunks:
        chunks(options.rounds, options.batch)
        return
    if options.requantize:
        requantize(options.rounds, options.batch, options.requantize_against)
        return
    rows_per_tile, keep = gemm_int8.AVX2_ROWS, []
    print(f"one thread, GOP/s best / median of {options.rounds} rounds; {rows_per_tile}-row "
          f"tiles; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"{'M×K×N':>16} " + " ".join(f"{name:>14}" for name in KERNELS))
    rng = np.random.default_rng(0)
    exact = {(name, bits): True for name in KERNELS for bits in (7, 8, "7-bit weights")}
    for m, k, n in SHAPES:
        weights = rng.integers(-128, 128, (k, n)).astype(np.int8)
        packed = gemm_int8.PackedWeights(weights)
        blocks = -(-m // rows_per_tile)
        out = np.empty((blocks * rows_per_tile, packed.panels * packed.vectors * gemm_int8.LANES),
                       np.int32)
        rows = np.zeros((blocks * rows_per_tile, packed.groups * 4), np.uint8)
        calls = []
        wide = packed.packed.astype(np.int16)
        narrow_weights = rng.integers(-63, 64, (k, n)).astype(np.int8)
        narrow = gemm_int8.PackedWeights(narrow_weights)
        for name, make in KERNELS.items():
            panels = compiled(make(rows_per_tile, packed.vectors), keep)
            call = bound(panels, rows, packed, out, wide if name in WIDE else None)
            for bits in (7, 8):
                a = rng.integers(0, 1 << bits, (m, k)).astype(np.uint8)
                rows[:m, :k] = a
                call()
                exact[name, bits] &= np.array_equal(
                    out[:m, :n], a.astype(np.int64) @ weights.astype(np.int64))
            if name not in WIDE:  # full 8-bit activations by 7-bit weights (±63)
                bound(panels, rows, narrow, out)()
                exact[name, "7-bit weights"] &= np.array_equal(
                    out[:m, :n], a.astype(np.int64) @ narrow_weights.astype(np.int64))
            calls.append(call)
        best = timed(calls, m * k * n, options.rounds)
        work = 2 * m * k * n / 1e9
        print(f"{m:>5}×{k:>4}×{n:>4} " + " ".join(
            f"{work / min(b):6.0f} / {work / statistics.median(b):5.0f}" for b in best))
    for name in KERNELS:
        print(f"{name}: NumPy's sums on 7-bit activations: {'yes' if exact[name, 7] else 'no'}, "
              f"on 8-bit: {'yes' if exact[name, 8] else 'no'}" + (
                  "" if name in WIDE else ", on 8-bit activations by 7-bit weights: "
                  f"{'yes' if exact[name, '7-bit weights'] else 'no'}"))

if __name__ == "__main__":
    main()
