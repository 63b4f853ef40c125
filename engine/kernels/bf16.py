"""bf16 operands for our GEMM: float32 rounded to bf16 and laid out in pairs along K.

bf16 is float32's upper half: the same exponent range, 8 bits of significand (about three
significant digits). Rounding keeps the nearest value, ties to even, as ``vcvtneps2bf16``
does; a NaN stays a NaN (its quiet bit set, where plain rounding could carry it into the
exponent and make it an infinity).

The bf16 kernels (`gemm_bf16_ir`, `gemm_amx_ir`) read both operands as 32-bit words, each
holding two bf16 values adjacent along K (element 2p in the low half, 2p + 1 in the high half;
an odd K's last word has a zero high half). A weight is rounded and paired once, when a plan
binds (`pair_rows`, `pair_columns`, in NumPy), then packed like a float32 one (for AMX tile by
tile, `amx_pack_rows`). An activation is paired on every run into a buffer of the plan's
workspace, as a `spin_pool` job: down its columns, from a matrix or straight from an im2col
view, by `bf16_pair_ir`'s pass (`patch_pairing`); along its rows, or into AVX-512 BF16's
panels, by a numba loop (`pairing`). A `PairedProduct` is that pass followed by the product.

On several threads that is two jobs, and each thread's share of the product reads the pairs
every thread wrote: where the activation is small and the product cut by its rows (MobileNet
v2's expanding 1×1 layers at 14² and 7²), that crossing cost more than the product's half
(one 384 × 64 × 196 layer, steady: 20 µs on both cores, 19 on one). A `PartPairedProduct`
runs instead as one job (`by_parts`) whose parts each pair the whole activation into words of
their own and multiply their share of the weight's rows by them (10 µs); on one thread it
pairs once.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from engine.cpu import compiled, kernel_jobs, llvm_jit, spin_pool, steady_walk
from engine.cpu.parts import PartedCall
from engine.kernels.workspace import empty_aligned

_kernels: dict[str, Any] = {}
_compiled: dict[str, Any] = {}  # the LLVM engine of `bf16_pair_ir` (it owns the code)
# The compiled loops round float32 bit patterns to bf16 in uint32 arithmetic (16 lanes of a
# 512-bit vector; int64 would halve that): add half an ulp of bf16, less one where the kept
# part is even (ties to even), and keep the upper half. A NaN gets its quiet bit instead, so
# that the carry cannot turn it into an infinity.
SHIFT, ONE, HALF = np.uint32(16), np.uint32(1), np.uint32(0x7FFF)
QUIET, MAGNITUDE, INFINITY = np.uint32(0x400000), np.uint32(0x7FFFFFFF), np.uint32(0x7F800000)
UPPER = np.uint32(0xFFFF0000)


def round_to_bf16(values: Any) -> np.ndarray:
    """The bf16 nearest each float32 of ``values`` (ties to even), as uint16 bit patterns."""
    bits = np.asarray(values, np.float32).view(np.uint32).astype(np.int64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    quiet_nan = (bits >> 16) | 0x40
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return np.where(is_nan, quiet_nan, rounded).astype(np.uint16)


def widen(bits: Any) -> np.ndarray:
    """bf16 bit patterns (uint16) as the float32 values they are."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def rounded(values: Any) -> np.ndarray:
    """``values`` (float32) rounded to bf16 and back: what the bf16 kernels compute with."""
    return widen(round_to_bf16(values))


def pair_rows(matrix: Any) -> np.ndarray:
    """``matrix`` (M, K) as bf16 pairs along its rows: words (M, ceil(K/2)), viewed as
    float32 (the form `gemm_kernel.pack` and the kernels take)."""
    rows, depth = matrix.shape
    bits = np.zeros((rows, depth + depth % 2), np.uint16)
    bits[:, :depth] = round_to_bf16(matrix)
    return bits.view(np.uint32).view(np.float32)


def pair_columns(matrix: Any) -> np.ndarray:
    """``matrix`` (K, N) as bf16 pairs down its columns: words (ceil(K/2), N), word (p, j)
    holding elements (2p, j) and (2p + 1, j), viewed as float32."""
    depth, columns = matrix.shape
    bits = np.zeros((depth + depth % 2, columns), np.uint16)
    bits[:depth] = round_to_bf16(matrix)
    words = np.ascontiguousarray(bits.reshape(-1, 2, columns).transpose(0, 2, 1))
    return words.view(np.uint32).reshape(-1, columns).view(np.float32)


def paired_shape(shape: tuple[int, int], along_rows: bool,
                 panel: int | None = None) -> tuple[int, ...]:
    """The words (as a float32 shape) holding a (rows, columns) matrix paired along its rows
    (K is its second axis) or down its columns (K is its first); down its columns with
    ``panel``, as panels of that many columns ((panels, ceil(K/2), panel), zero-padded), the
    layout `gemm_kernel.pack_columns` gives a weight."""
    rows, columns = shape
    if along_rows:
        return rows, -(-columns // 2)
    if panel is None:
        return -(-rows // 2), columns
    return -(-columns // panel), -(-rows // 2), panel


def amx_rows(count: int) -> int:
    """Rows of an AMX operand: A's rows and B's columns padded to a whole tile (32)."""
    return -(-count // 32) * 32


def amx_depth(depth: int) -> int:
    """Words along K of an AMX operand: ``depth`` values in pairs, padded to 16 words."""
    return -(-depth // 32) * 16


def amx_weight_rows(matrix: Any) -> np.ndarray:
    """A constant (M, K) as AMX's A: pairs along rows, zero-padded (`amx_rows`,
    `amx_depth`)."""
    rows, depth = matrix.shape
    words = np.zeros((amx_rows(rows), amx_depth(depth)), np.float32)
    paired = pair_rows(matrix)
    words[:rows, :paired.shape[1]] = paired
    return words


def amx_pack_rows(words: np.ndarray) -> np.ndarray:
    """AMX's A (`amx_weight_rows`) with each tile's 16 rows × 16 words contiguous, in the
    order the kernel loads them: per block of 32 rows, per 16 words of K, the upper tile then
    the lower (blocks, K/16, 2, 16, 16). Tiles of a matrix read 16 rows far apart, which from
    memory are 16 misses the prefetcher does not see coming; packed, a block streams (ResNet-18
    at batch 1, one thread: its steps in sequence took 3–4× their time run one at a time)."""
    rows, depth = words.shape
    tiled = words.reshape(rows // 32, 2, 16, depth // 16, 16).transpose(0, 3, 1, 2, 4)
    return _aligned(np.ascontiguousarray(tiled).reshape(rows, depth))


def _aligned(array: np.ndarray) -> np.ndarray:
    copy = empty_aligned(np, array.shape, array.dtype)
    copy[...] = array
    return copy


def amx_weight_columns(matrix: Any) -> np.ndarray:
    """A constant (K, N) as AMX's B: pairs down columns, zero-padded."""
    depth, columns = matrix.shape
    words = np.zeros((amx_depth(depth), amx_rows(columns)), np.float32)
    paired = pair_columns(matrix)
    words[:paired.shape[0], :columns] = paired
    return words


def pairing(source: Any, target: Any, along_rows: bool) -> Callable[[], Any]:
    """A call writing ``source`` (a float32 matrix, any non-negative strides) into
    ``target`` (float32-viewed words of its `paired_shape`, C-contiguous, zeroed once) as
    bf16 pairs along its rows or down its columns (a 3-D target: in panels, by
    `panel_pairing` where that compiles): a `spin_pool` job where numba runs it, else NumPy."""
    if target.ndim == 3 and not along_rows:
        panels = panel_pairing(source, target)
        if panels is not None:
            return panels
    rows, columns = source.shape
    item = source.itemsize
    row_step, column_step = (stride // item for stride in source.strides)
    if along_rows:  # word (r, c) = source[r, 2c], source[r, 2c + 1]
        outer, inner, pair_step = row_step, 2 * column_step, column_step
        whole_rows, whole_columns = rows, columns // 2
    else:  # word (r, c) = source[2r, c], source[2r + 1, c]
        outer, inner, pair_step = 2 * row_step, column_step, row_step
        whole_rows, whole_columns = rows // 2, columns
    word_rows, word_columns = paired_shape(source.shape, along_rows)
    # Word (r, c) lies at (c // width) * panel_step + r * width + c % width.
    width, panel_step = (target.shape[2], target.shape[1] * target.shape[2]) \
        if target.ndim == 3 else (target.shape[1], 0)
    words = target.reshape(-1).view(np.uint32)
    job = None
    if compiled.available() and min(source.strides) >= 0 and not source.strides[0] % item:
        span = _span(source).view(np.uint32)
        job = kernel_jobs.bind((__name__, "pairs"), (
            span, outer, inner, pair_step, whole_rows, whole_columns, word_columns, width,
            panel_step, words), word_rows, kernel_jobs.parts_for(word_rows, 3 * words.size))
    if job is not None:
        return job
    return partial(_pair_in_numpy, source, target, along_rows)


def panel_pairing(source: Any, target: Any) -> Callable[[], Any] | None:
    """A call writing ``source`` (a (K, N) float32 matrix, non-negative strides) into
    ``target``'s panels (`paired_shape` with a panel width: (panels, ceil(K/2), width),
    C-contiguous, zeroed once) as bf16 pairs down its columns: `bf16_pair_ir`'s
    ``patch_pairs`` pass, each panel a run of ``width`` columns whose word rows lie ``width``
    words apart, and a last, narrower panel a job of its own (a run's length is the pass's
    one for all runs). On AVX-512 BF16 the pass rounds 16 floats an instruction where
    numba's integer rounding took one float at a time: Zen 5, one thread, 576 × 3136 0.31 ms
    against 1.09, 64 × 196 2 µs against 8 (docs/benchmarks.md). Denormal floats become zeros
    of their sign, as the conversion reads them (and as the compute threads' float32
    arithmetic does, `engine.cpu.denormals`). None where the pass cannot compile."""
    item = source.itemsize
    task = _pair_task()
    panels, word_rows, width = target.shape
    depth, columns = source.shape
    if (task is None or source.dtype != np.float32 or target.dtype != np.float32
            or not target.flags.c_contiguous or min(source.strides) < 0
            or any(stride % item for stride in source.strides)
            or (panels, word_rows) != (-(-columns // width), -(-depth // 2))):
        return None
    row_step, column_step = (stride // item for stride in source.strides)
    rows = np.arange(depth, dtype=np.int64) * row_step
    span = _span(source)
    whole = columns // width
    jobs = []
    for first, count, run in ((0, whole, width), (whole, panels - whole, columns % width)):
        if count == 0 or run == 0:
            continue
        panel = np.arange(first, first + count, dtype=np.int64)
        outer = panel * width * column_step
        into = panel * word_rows * width
        context = np.array([span.ctypes.data, rows.ctypes.data, outer.ctypes.data, depth,
                            count, run, column_step, target.ctypes.data, width, word_rows,
                            into.ctypes.data], np.int64)
        parts = kernel_jobs.parts_for(word_rows, 3 * word_rows * count * run)
        jobs.append(spin_pool.job(task, context, parts,
                                  keep=(span, rows, outer, target, into)))
    return jobs[0] if len(jobs) == 1 else partial(_both, *jobs)


def patch_pairing(view: Any, k_axes: int, target: Any, into: np.ndarray | None = None,
                  k_offsets: np.ndarray | None = None,
                  batchnorm: tuple[Any, ...] | None = None,
                  twin: int | None = None) -> Callable[[], Any] | None:
    """A call writing ``view`` (a strided float32 view whose first ``k_axes`` axes run along
    K and the rest along the columns: an im2col patch view over a padded input) into
    ``target`` (float32-viewed words, (at least ceil(K/2), at least the columns), rows
    contiguous, zeroed once) as bf16 pairs down its columns, read straight from the input: no
    patch array is copied first (ResNet-18 at batch 1: im2col's copies took 4.5 ms and pairing
    the copies 10.7, one thread). The columns' last axis is written in runs, end to end, or
    with ``into`` from each run's word in a target row (int64, one per run: `conv_amx`'s
    zero-bordered grid). ``k_offsets`` (int64, one per K index, in floats from the view's
    first element) replaces the offsets the K axes' strides give, for a source no strides
    describe (`conv_bind`'s input split by column parity: tap ``kx`` at half ``kx % 2``, cell
    ``kx // 2``); its K axes then give only K's length. ``batchnorm``: (scale, shift, low,
    high), K index k being channel k, for the pairs of ``clip(view · scale + shift, low,
    high)``: a BatchNorm's (`gemm_preact.scale_shift`; `bf16_pair_ir`'s
    ``batchnorm_pairs``). ``twin``:
    where the view's runs step two floats, the words from which each run's twin (the floats
    one on: the next column phase of a stride-2 grid) goes, ``twin`` words after its own,
    both from one read of the input (`bf16_pair_ir`'s ``phase_pairs``). A `spin_pool` job of
    `bf16_pair_ir`'s pass; None where that cannot compile."""
    item = view.itemsize
    task = _pair_task("patch_pairs" if batchnorm is None and twin is None
                      else "batchnorm_pairs" if twin is None else "phase_pairs")
    if task is None or min(view.strides, default=0) < 0 or any(
            stride % item for stride in view.strides):
        return None
    if twin is not None and (batchnorm is not None or view.strides[-1] != 2 * item):
        raise ValueError(f"a twin run pairs the floats one on from a run of stride 2 "
                         f"floats, no BatchNorm; got strides {view.strides}")
    steps = np.array(view.strides, np.int64) // item
    depth = int(np.prod(view.shape[:k_axes]))
    rows = element_offsets(view.shape[:k_axes], steps[:k_axes]) if k_offsets is None \
        else np.ascontiguousarray(k_offsets, np.int64)
    if rows.shape != (depth,) or rows.min(initial=0) < 0:
        raise ValueError(f"pairing needs one non-negative offset per K index ({depth}); got "
                         f"{rows.shape}")
    # The columns: every offset of the column axes but the last, and the last as a run.
    outer = element_offsets(view.shape[k_axes:-1], steps[k_axes:-1])
    run, step = view.shape[-1], int(steps[-1])
    word_rows = -(-depth // 2)
    if into is None:
        into = np.arange(outer.size, dtype=np.int64) * run
    into = np.ascontiguousarray(into, np.int64)
    if into.shape != (outer.size,):
        raise ValueError(f"pairing needs one target offset per run ({outer.size}); got "
                         f"{into.shape}")
    starts = into if twin is None else np.concatenate([into, into + twin])
    if (target.shape[0] < word_rows or target.strides[1] != target.itemsize
            or target.shape[1] < int(starts.max(initial=0)) + run
            or starts.min(initial=0) < 0):
        raise ValueError(f"pairing target {target.shape} is too small for {view.shape}")
    # the twin reads a float past each run's last
    span = _span(view) if twin is None else _span(view, 1)
    context = np.array([span.ctypes.data, rows.ctypes.data, outer.ctypes.data, depth,
                        outer.size, run, step, target.ctypes.data,
                        target.strides[0] // target.itemsize, word_rows, into.ctypes.data,
                        *_batchnorm_words(batchnorm, depth),
                        *(() if twin is None else (twin,))], np.int64)
    runs = outer.size * (1 if twin is None else 2)  # a twin run's words too
    parts = kernel_jobs.parts_for(word_rows, 3 * word_rows * runs * run)
    return spin_pool.job(task, context, parts, keep=(span, rows, outer, target, into,
                                                     batchnorm))


def word_copying(view: Any, target: Any) -> Callable[[], Any] | None:
    """A call copying ``view`` (a strided float32-viewed view of words already paired, its
    first axis their word rows, the rest the columns) into ``target``'s word rows (rows
    contiguous), the columns end to end, bit for bit: `bf16_pair_ir`'s ``copy_words``, as a
    `spin_pool` job; None where that cannot compile."""
    item = view.itemsize
    task = _pair_task("copy_words")
    if (task is None or view.ndim < 2 or view.dtype != np.float32
            or min(view.strides) < 0 or any(stride % item for stride in view.strides)):
        return None
    steps = np.array(view.strides, np.int64) // item
    word_rows = view.shape[0]
    rows = np.arange(word_rows, dtype=np.int64) * steps[0]
    outer = element_offsets(view.shape[1:-1], steps[1:-1])
    run, step = view.shape[-1], int(steps[-1])
    into = np.arange(outer.size, dtype=np.int64) * run
    if (target.shape[0] < word_rows or target.strides[1] != target.itemsize
            or target.shape[1] < outer.size * run):
        raise ValueError(f"word copy target {target.shape} is too small for {view.shape}")
    span = _span(view)
    context = np.array([span.ctypes.data, rows.ctypes.data, outer.ctypes.data, word_rows,
                        outer.size, run, step, target.ctypes.data,
                        target.strides[0] // target.itemsize, word_rows, into.ctypes.data],
                       np.int64)
    parts = kernel_jobs.parts_for(word_rows, 2 * word_rows * outer.size * run)
    return spin_pool.job(task, context, parts, keep=(span, rows, outer, target, into))


# Positions in `bf16_pair_ir.FIELDS` that `by_parts` reads and changes.
_DEPTH, _TARGET = 3, 7


def _batchnorm_words(batchnorm: tuple[Any, ...] | None, depth: int) -> list[int]:
    """`bf16_pair_ir.BATCHNORM_FIELDS` of ``batchnorm`` (none without one): the float32
    scale and shift by address, one per K index, and the bounds as float64 bits."""
    if batchnorm is None:
        return []
    *affine, low, high = batchnorm
    if any(not isinstance(value, np.ndarray) or value.dtype != np.float32
           or value.shape != (depth,) or not value.flags.c_contiguous for value in affine):
        raise ValueError(f"BatchNorm pairing needs a float32 scale and shift, one per K "
                         f"index ({depth}); got {[getattr(v, 'shape', v) for v in affine]}")
    low, high = (int(np.float64(value).view(np.int64)) for value in (low, high))
    return [*(value.ctypes.data for value in affine), low, high]


def _pair_task(name: str = "patch_pairs") -> int | None:
    """The address of `bf16_pair_ir`'s task ``name`` (``patch_pairs``, ``batchnorm_pairs``,
    ``copy_words``),
    compiled once per process; None where llvmlite cannot compile it."""
    engine = compiled.made_once(_compiled, "pairs", _compile_pairs)
    return None if engine is None else engine.get_function_address(name)


def each_part_task() -> int | None:
    """The address of `bf16_pair_ir`'s ``each_part`` (tasks run in turn within each part of
    one job: `by_parts`, `gemm_transposed.by_filters`); None where llvmlite cannot compile
    it."""
    return _pair_task("each_part")


def _compile_pairs() -> Any:
    return llvm_jit.compile_for_host(_pair_module)


def _pair_module() -> Any:
    from engine.kernels.bf16_pair_ir import module

    return module()


def element_offsets(shape: tuple[int, ...], steps: Any) -> np.ndarray:
    """Every element's offset (in elements) of an array of ``shape`` and ``steps``, in C
    order, as int64 (one zero for no axes)."""
    offsets = np.zeros(1, np.int64)
    for size, step in zip(shape, steps, strict=True):
        offsets = (offsets[:, None] + np.arange(size, dtype=np.int64) * step).reshape(-1)
    return offsets


class PairedProduct(PartedCall):
    """An activation paired into bf16 words (``pairing``), then the bf16 product reading
    them (a `gemm_kernel.Product`): one call, taking the product's epilogue."""

    leaves_blas_alone = True  # both halves run on the spin pool or inline, never in BLAS

    @property
    def product(self) -> Any:
        return self.args[1]

    def with_epilogue(self, bias_rows: Any = None, bias_columns: Any = None,
                      low: float = -np.inf, high: float = np.inf) -> PairedProduct:
        """This call with its product adding a bias and clamping (`Product.with_epilogue`)."""
        return PairedProduct(self.func, self.args[0],
                             self.product.with_epilogue(bias_rows, bias_columns, low, high))

    def writes_within(self, out: Any) -> bool:
        """Whether the product's output lies inside ``out`` (`Product.writes_within`)."""
        return self.product.writes_within(out)

    def with_residual(self, out: Any, other: Any) -> PairedProduct:
        """This call with its product adding a residual (`Product.with_residual`)."""
        return PairedProduct(self.func, self.args[0], self.product.with_residual(out, other))


# Paired activations of this size at most are paired by each part of its product
# (`PartPairedProduct`): MobileNet v2's expanding layers' at 14² and 7² (43 KB at most),
# where pairing twice costs 2-5 µs against a product of 10-40.
PART_PAIRED_BYTES = 64 << 10


class PartPairedProduct(PairedProduct):
    """A `PairedProduct` that, on the runs where its product writes its float32 output, runs
    as one job whose parts each pair the activation into words of their own and multiply
    their share of the weight's rows by them (`by_parts`). Its product may be a
    `gemm_amx_handoff.HandingProduct` (``handoff``, ``lays_ever``): on runs where every
    reader took the hand-off, the pairing then that product, which lays the readers' layout
    (and likewise where a BatchNorm reading its sum asked it for its words); on the others
    the parts, and the hand-off marked not laid. ``workspace`` gives the parts'
    words.

    A run reads two attributes and makes one native call: measured in order on one thread
    (the Python objects then out of cache), each Python frame more in a step cost about a
    microsecond (the 11 parted layers of MobileNet v2 took 1.07× as long through three
    frames, 0.93× through none)."""

    parted: spin_pool.Job

    def __new__(cls, func: Any, pair: Any, product: Any, workspace: Any) -> PartPairedProduct:
        return super().__new__(cls, func, pair, product)

    def __init__(self, func: Any, pair: Any, product: Any, workspace: Any) -> None:
        super().__init__()
        self.workspace = workspace
        self.parted = by_parts(pair, getattr(product, "plain", product), workspace)
        self.handoff = getattr(product, "handoff", None)
        self.lays_ever = bool(getattr(product, "lays_ever", False))

    def __call__(self) -> None:
        handoff = self.handoff
        if handoff is None:
            self.parted()
        elif self.lays_ever and handoff.taken or getattr(handoff, "preact", None) is not None:
            # the pairing then that product, which lays the readers' layout, or adds its
            # residual and writes a BatchNorm's words that asked (`gemm_preact`)
            self.args[0]()
            self.args[1]()
        else:
            self.parted()
            handoff.laid = False

    def replayable(self) -> bool:
        """Whichever way it runs, jobs alone (`steady_walk`)."""
        return steady_walk.all_replayable(self.parted, *self.args)

    def with_epilogue(self, bias_rows: Any = None, bias_columns: Any = None,
                      low: float = -np.inf, high: float = np.inf) -> PartPairedProduct:
        """This call with its product adding a bias and clamping (`Product.with_epilogue`)."""
        return PartPairedProduct(self.func, self.args[0], self.product.with_epilogue(
            bias_rows, bias_columns, low, high), self.workspace)

    def with_residual(self, out: Any, other: Any) -> PartPairedProduct:
        """This call with its product adding a residual (`Product.with_residual`)."""
        return PartPairedProduct(self.func, self.args[0],
                                 self.product.with_residual(out, other), self.workspace)


def parts_pair(pair: Any, product: Any) -> bool:
    """Whether ``pair`` (a `patch_pairing` job) and ``product`` (an AMX `gemm_kernel.Product`
    reading its words, one matrix) may run as `by_parts`: words of `PART_PAIRED_BYTES` at
    most, two blocks of rows or more, and several threads for the plan's runs, the product
    walking its row blocks outside (`gemm_bind._amx_weight_tiles`: its weight larger than its
    words), so that its parts already cut it by rows and each thread's rows of the output are
    where they were. A product cut by columns (MobileNet v2's 192 × 32 × 784 at 28²) would be
    cut by rows instead, and its output then lay elsewhere for its reader: in order, on one
    thread, such layers took 1.06-1.15× as long parted, on both 0.91-1.13×."""
    from engine.kernels import gemm_kernel

    field = gemm_kernel.CONTEXT_FIELDS
    if (type(pair) is not spin_pool.Job or type(product) is not gemm_kernel.Product
            or spin_pool.threads() < 2):
        return False
    context = product.context
    words = product.operands[1]
    return (int(context[field["kernel"]]) == gemm_kernel.AMX
            and int(context[field["batch"]]) == 1
            and int(context[field["columns_outside"]]) == 0
            and isinstance(words, np.ndarray) and words.nbytes <= PART_PAIRED_BYTES
            and int(pair.keep[0][_TARGET]) == words.ctypes.data
            and int(context[field["b"]]) == words.ctypes.data
            and int(context[field["m"]]) > gemm_kernel.AMX_TILE.rows)


def by_parts(pair: Any, product: Any, workspace: Any) -> spin_pool.Job:
    """``pair()`` then ``product()`` (`parts_pair`) as one `bf16_pair_ir` ``each_part`` job:
    run whole (one thread), the pairing then the product; cut in parts, each part pairs the
    whole activation into words of its own (the first part into the product's, the others
    into a workspace buffer kept for their shape and K) and multiplies its share of the
    product's blocks of 32 rows by them, so that no thread's tiles read pairs another thread
    wrote. Parts: one per thread a run armed now uses (`spin_pool.threads`: a thread taking
    two parts pairs twice), at most one per block of rows."""
    from engine.kernels import gemm_kernel

    field = gemm_kernel.CONTEXT_FIELDS
    # A `spin_pool.Job`'s arguments end with (task, context address, parts), and it keeps
    # its context array first; a `gemm_kernel.Product` is such a job too.
    pair_task, pair_context = pair.args[-3], pair.keep[0]
    product_task = int(product.args[-3])
    context, words = product.context, product.operands[1]
    rows, whole = int(context[field["m"]]), gemm_kernel.AMX_TILE.rows
    blocks = -(-rows // whole)
    parts = min(blocks, spin_pool.threads())
    others = workspace.zeroed((parts - 1, *words.shape), np.float32,
                              ("bf16 words by part", int(pair_context[_DEPTH])))
    table = [2, parts, pair_task, pair_context.ctypes.data, product_task, context.ctypes.data]
    contexts = []
    for part in range(parts):
        target = words if part == 0 else others[part - 1]
        pairs = pair_context.copy()
        pairs[_TARGET] = target.ctypes.data
        first = part * blocks // parts * whole
        last = min(rows, (part + 1) * blocks // parts * whole)
        share = gemm_kernel.row_share(context, first, last)
        share[field["b"]] = target.ctypes.data
        contexts += [pairs, share]
        table += [pair_task, pairs.ctypes.data, product_task, share.ctypes.data]
    return spin_pool.job(_pair_task("each_part"), np.array(table, np.int64), parts,
                         keep=(pair, product, others, *contexts))


def paired_product(pair: Callable[[], Any], product: Any) -> PairedProduct:
    """``pair()`` then ``product()``, as one call; where ``pair`` says how it runs before a
    product (``then``: a hand-off reader's, `bf16_handoff.take`), that way, in one frame."""
    return PairedProduct(getattr(pair, "then", _both), pair, product)


@steady_walk.in_turn
def _both(first: Callable[[], Any], second: Callable[[], Any]) -> None:
    first()
    second()


def _pair_in_numpy(source: Any, target: Any, along_rows: bool) -> None:
    words = pair_rows(source) if along_rows else pair_columns(source)
    if target.ndim == 2:
        target[:words.shape[0], :words.shape[1]] = words
        return
    panels, depth, width = target.shape
    padded = np.zeros((depth, panels * width), np.float32)
    padded[:, :words.shape[1]] = words
    target[...] = padded.reshape(depth, panels, width).transpose(1, 0, 2)


def _span(array: np.ndarray, beyond: int = 0) -> np.ndarray:
    """A 1-D contiguous view from ``array``'s first element to its last (and ``beyond``
    elements past it)."""
    extent = 1 + beyond + sum((size - 1) * stride for size, stride in zip(
        array.shape, array.strides, strict=True)) // array.itemsize
    return np.lib.stride_tricks.as_strided(array, shape=(extent,), strides=(array.itemsize,))


def compiled_kernels() -> dict[str, Any]:
    """The kernel by name (`kernel_jobs` runs it as jobs), compiled on first use."""
    return compiled.compiled_once(_kernels, lambda: {"pairs": compiled.compile_kernel(_pairs)})


def _pairs(source: Any, outer: int, inner: int, pair_step: int, whole_rows: int,
           whole_columns: int, columns: int, width: int, panel_step: int, target: Any,
           first: int, last: int) -> None:  # pragma: no cover - runs compiled
    """Word rows [first, last): word (r, c), at ``(c // width)·panel_step + r·width +
    c % width`` of ``target`` (uint32), pairs the float32 bit patterns at
    ``source[r·outer + c·inner]`` and ``pair_step`` further on, each rounded to bf16 (see
    `round_to_bf16`); the second is zero past ``whole_rows`` or ``whole_columns`` (an odd
    K's last word). Unit steps get a loop of their own, which LLVM vectorises (a 576 × 3136
    patch array: 1.0 ms, against 3.7 with the step unknown)."""
    for row in range(first, last):
        paired = whole_columns if row < whole_rows else 0
        for start in range(0, columns, width):
            stop = min(start + width, columns)
            into = (start // width) * panel_step + row * width - start
            base = row * outer
            both = min(stop, paired)
            if inner == 1:
                for column in range(start, both):
                    low = source[base + column]
                    high = source[base + column + pair_step]
                    low = (low | QUIET if low & MAGNITUDE > INFINITY
                           else low + HALF + ((low >> SHIFT) & ONE))
                    high = (high | QUIET if high & MAGNITUDE > INFINITY
                            else high + HALF + ((high >> SHIFT) & ONE))
                    target[into + column] = (low >> SHIFT) | (high & UPPER)
            else:
                for column in range(start, both):
                    at = base + column * inner
                    low = source[at]
                    high = source[at + pair_step]
                    low = (low | QUIET if low & MAGNITUDE > INFINITY
                           else low + HALF + ((low >> SHIFT) & ONE))
                    high = (high | QUIET if high & MAGNITUDE > INFINITY
                            else high + HALF + ((high >> SHIFT) & ONE))
                    target[into + column] = (low >> SHIFT) | (high & UPPER)
            for column in range(max(start, both), stop):
                low = source[base + column * inner]
                low = (low | QUIET if low & MAGNITUDE > INFINITY
                       else low + HALF + ((low >> SHIFT) & ONE))
                target[into + column] = low >> SHIFT

