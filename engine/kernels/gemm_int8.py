"""An exact int8 GEMM of our own: uint8 or int8 rows times int8 columns into int32, with
AVX-512 VNNI's ``vpdpbusd`` in LLVM IR (`gemm_int8_ir`), compiled once per process.

``vpdpbusd`` multiplies unsigned bytes by signed bytes. Signed (int8) activations are moved
onto uint8 by adding 128 (flipping each byte's top bit), and the kernel takes
``128 · Σ_k w[k, n]`` back off every column's sum: a per-column int32 offset computed when the
weights are packed, as oneDNN does. The sums are integers and exact, so a caller gets the
numbers NumPy's integer matmul gives, bit for bit.

A product of one row (a classifier at batch 1) runs on a one-row tile of the same panels:
the full tile would compute five rows of padding for each row it keeps (ResNet-50 v2's
classifier, K 2048 and N 1000, from out of L2, one thread: 0.36 → 0.27 ms).

The weights (the right operand) are packed once (`PackedWeights`): K padded to a multiple of
four with zeros, columns to a whole panel. The activations are copied per call into rows of a
padded uint8 matrix (the kernel reads four K values at a time and whole row blocks), which is
the same pass that shifts signed values.

Where the host has AMX-INT8 and Linux grants the tile state, an AMX kernel
(`gemm_int8_amx_ir`: ``tdpbusd``, 32 × 32 tiles of C) takes weights packed with ``amx``: the
same panel layout at 32 columns, K padded to 64. Callers choose per product (AMX pays for
long K and many rows, see `engine.ops.quantized.integer`).

Where the host has AVX2 but not AVX-512 VNNI, an AVX2 kernel (`gemm_int8_avx2_ir`:
``vpmaddwd`` on operands widened to int16) computes the same exact sums from the same packed
weights, in tiles of `AVX2_ROWS` rows (`tiles`) that fit AVX2's sixteen registers. Weights
within ±63 (`PackedWeights.narrow`: a float model this engine quantizes on such a host,
`narrow_weights_pay`) run on ``vpmaddubsw`` instead (`gemm_int8_avx2_ir.NarrowInt8Kernel`),
which cannot saturate on them: the same exact sums, about 1.5 times as fast, in tiles of
`NARROW_ROWS` rows (the weights' `PackedWeights.rows`). Their jobs compute a short last row
block's rows on the one-row tile (`_edge`): 49 rows, ResNet's 7² layers, take 12 whole tiles
and one row, not 13 tiles (on a Zen 3 core, one thread, 2–7% less of a 3×3 512 → 512
product, `bench/int8_avx2.py --edge`).

A convolution's windows are read where they lie in its channels-last copy, by a table of
their addresses (`table_job`), on VNNI's tiles and on the narrow-weight AVX2 kernels.

`available()` is False where the host has neither or lacks llvmlite's JIT: callers keep their
float64 products. Which kernel runs, or that none does, is logged once.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.cpu import compiled, host_features
from engine.kernels import run_taps_ir
from engine.kernels.workspace import empty_aligned

log = logging.getLogger(__name__)

LANES = 16
# The longest K whose sums stay inside int32 whatever the values (255 · 128 a product); past
# it a sum that fits int32 still comes out exact (the accumulators wrap, never saturate), but
# one that does not wraps where float64 would not.
EXACT_DEPTH = (2 ** 31 - 1) // (255 * 128)
# (zmm vectors per row, rows) of the register tiles: 24 accumulators each, at most 4 of B.
TILES = ((1, 16), (2, 12), (4, 6))
# Rows of `fused_job`'s run tiles: two runs of output positions.
RUN_ROWS = 2 * run_taps_ir.SEGMENT
# The largest weight magnitude the AVX2 host's ``vpmaddubsw`` kernel is exact for: it sums two
# products of a uint8 activation and an int8 weight into int16 with saturation, and
# 2 · 255 · 63 = 32 130 fits where 2 · 255 · 128 does not.
NARROW_LIMIT = 63
# Rows of the AVX2 kernel's tiles, whatever the panel's width: 8 accumulators of a 16-column
# strip, 4 ymm of widened weights (two rows share each) and the rows' activations fill 14 of
# the 16 ymm registers; at 3 rows the tile spills (`gemm_int8_avx2_ir`).
AVX2_ROWS = 2
# Rows of the ``vpmaddubsw`` kernel's tiles (narrow weights): its 16-column strip keeps 2
# accumulators a row and 2 ymm of weights as they are, so 4 rows fit AVX2's registers (8
# accumulators), each step's two loads of weights serving 8 multiplies, not 4. On a Zen 3 core,
# one thread, 1.05–1.2× the GOP/s of 2 rows on ResNet's shapes (`bench/int8_avx2.py
# --narrow-tiles`); 2 rows of 32 columns, 3 or 4 of 32 (spilled) and 6 of 16 were slower.
NARROW_ROWS = 4

_state: dict[str, Any] = {}
_SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                              ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                              ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)


def available() -> bool:
    """Whether an int8 kernel (VNNI's or AVX2's) compiled for this CPU (compiled on the first
    call)."""
    return _compiled() is not None


def vnni_available() -> bool:
    """Whether the kernels here are AVX-512 VNNI's (the AVX2 kernel runs where they are not)."""
    return _compiled() is not None and _has_vnni()


def tiles() -> tuple[tuple[int, int], ...]:
    """(vectors of 16 columns in a panel, rows of a tile) for each panel width, as the kernel
    this host runs tiles them: VNNI's `TILES`, else the AVX2 kernel's `AVX2_ROWS`."""
    return TILES if _has_vnni() else tuple((vectors, AVX2_ROWS) for vectors, _ in TILES)


def narrow_weights_pay() -> bool:
    """Whether weights quantized within ±`NARROW_LIMIT` run faster here:
    the host runs the AVX2 kernels, whose products of such weights take ``vpmaddubsw``."""
    return _compiled() is not None and not _has_vnni()


def _has_vnni() -> bool:
    return host_features.has("avx512f") and host_features.has("avx512_vnni")


@dataclass(frozen=True)
class TapRuns:
    """What `fused_job`'s run tiles know of a convolution: each tap's output rows and
    columns reading inside the image (`border_taps.tap_bounds`), the output's width and its
    positions an image (a whole number of runs a row), and the bytes from a window to the
    next one along an output row."""

    bounds: np.ndarray
    width: int
    positions: int
    step: int


class PackedWeights:
    """An int8 matrix ``weights`` (K, N) packed as the kernel reads it, with the column sums
    that signed activations need."""

    def __init__(self, weights: Any, amx: bool = False,
                 empty: Callable[[tuple[int, ...], Any], np.ndarray] | None = None) -> None:
        """``amx``: packed for `gemm_int8_amx_ir` (32-column panels, K padded to 64).
        ``empty(shape, dtype)``: where the arrays the kernels read are made (a plan's arena
        on huge pages, `int8_memory`); by default NumPy's memory from a cache line's start."""
        if empty is None:
            def empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
                return empty_aligned(np, shape, dtype)
        weights = np.asarray(weights)
        if weights.dtype != np.int8 or weights.ndim != 2:
            raise ValueError(f"int8 GEMM weights must be a 2-d int8 matrix; got "
                             f"{weights.dtype} {weights.shape}")
        k, n = weights.shape
        self.k, self.n = k, n
        self.amx = amx
        # within ±63: the AVX2 host's `vpmaddubsw` kernels take them, exactly
        self.narrow = not amx and int(np.abs(weights, dtype=np.int16).max(initial=0)) <= \
            NARROW_LIMIT
        if amx:
            self.vectors, self.rows = 2, 32
        else:
            self.vectors = next(v for v, _ in TILES if n <= v * LANES) if n <= 4 * LANES else 4
            # the ``vpmaddubsw`` kernels' rows where they run these weights (`_kernel`): they
            # compile now, at the first narrow weights packed, so that the rows always match
            # the kernel that runs
            self.rows = NARROW_ROWS if self.narrow and _narrow_kernels() is not None else \
                dict(tiles())[self.vectors]
        columns = self.vectors * LANES
        self.groups = -(-k // 64) * 16 if amx else -(-k // 4)
        self.panels = -(-n // columns)
        padded = np.zeros((self.groups * 4, self.panels * columns), np.int8)
        padded[:k, :n] = weights
        # (groups, 4, panels, columns) -> (panels, groups, columns, 4)
        order = padded.reshape(self.groups, 4, self.panels, columns).transpose(2, 0, 3, 1)
        self.packed = empty(order.shape, np.int8)
        self.packed[...] = order
        sums = np.zeros(self.panels * columns, np.int64)
        sums[:n] = weights.sum(axis=0, dtype=np.int64)
        self.no_offsets = empty((self.panels * columns,), np.int32)
        self.no_offsets[...] = 0
        self.signed_offsets = empty((self.panels * columns,), np.int32)
        self.signed_offsets[...] = -128 * sums
        # addresses for the foreign call, read once (each ``.ctypes`` costs a microsecond)
        self.addresses = (self.packed.ctypes.data, self.no_offsets.ctypes.data,
                          self.signed_offsets.ctypes.data)


def multiply(a: Any, weights: PackedWeights) -> np.ndarray:
    """``a @ w`` as int32 (M, N), for ``a`` (M, K) uint8 or int8 and ``w`` packed in
    ``weights``; a view into a padded result."""
    a = np.asarray(a)
    if a.ndim != 2 or a.shape[1] != weights.k or a.dtype not in (np.uint8, np.int8):
        raise ValueError(f"int8 GEMM: activations {a.dtype} {a.shape} do not fit weights "
                         f"of K = {weights.k}")
    rows = padded_rows(a.shape[0], weights)
    if a.dtype == np.int8:  # + 128: the top bit flipped
        np.bitwise_xor(a.view(np.uint8), np.uint8(0x80), out=rows[:a.shape[0], :weights.k])
    else:
        rows[:a.shape[0], :weights.k] = a
    return multiply_rows(rows, a.shape[0], weights, signed=a.dtype == np.int8)


def padded_rows(m: int, weights: PackedWeights) -> np.ndarray:
    """A uint8 matrix for ``m`` rows of activations as the kernel reads them: whole row
    blocks, K padded to a multiple of four, the padding zero. The caller writes the
    activations into ``[:m, :weights.k]`` (shifted by 128 where they are signed) and passes it
    to `multiply_rows`: a convolution lays its patches there directly."""
    blocks = -(-m // weights.rows)
    # plain np.empty: the kernel reads rows unaligned, and aligning costs a call 5 µs
    rows = np.empty((blocks * weights.rows, weights.groups * 4), np.uint8)
    rows[m:] = 0
    rows[:m, weights.k:] = 0
    return rows


def multiply_rows(rows: np.ndarray, m: int, weights: PackedWeights, signed: bool,
                  offsets: np.ndarray | None = None) -> np.ndarray:
    """The int32 product (m, N) of the first ``m`` rows of ``rows`` (from `padded_rows`,
    filled) with the packed weights; ``signed``: the rows hold int8 values plus 128.
    ``offsets``: int32, one a padded column (``weights.panels · vectors · LANES``), added to
    every row's sums in place of the signed rows' compensation (a caller's bias folded in
    with it; the sums wrap, so the result is exact wherever it fits int32)."""
    kernels, blocks, columns, packed, offset_address = _checked(rows, m, weights, signed,
                                                                offsets)
    if m == 1 and not weights.amx:
        # one row (a classifier at batch 1): the one-row tile, not a whole tile of which all
        # rows but one are padding
        out = np.empty((1, columns), np.int32)
        kernel, blocks = _kernel(kernels, weights, "row", weights.vectors), 1
    else:
        out = np.empty((rows.shape[0], columns), np.int32)
        kernel = _kernel(kernels, weights, "amx" if weights.amx else weights.vectors)
    kernel(rows.ctypes.data, rows.shape[1], packed, weights.groups, out.ctypes.data,
           out.shape[1], offset_address, blocks, 0, weights.panels)
    return out[:m, :weights.n]


def _kernel(kernels: dict[Any, Any], weights: PackedWeights, *key: Any) -> Any:
    """The kernel under ``key`` for ``weights``: the ``vpmaddubsw`` form where the weights
    are narrow and the host runs the AVX2 kernels (compiled when the first such weights are
    packed, so that a process whose weights are all full-range never spends their compile
    time)."""
    if weights.narrow:
        narrow = _narrow_kernels()
        if narrow is not None:
            kernels = narrow
    return kernels[key if len(key) > 1 else key[0]]


def _narrow_kernels() -> dict[Any, Any] | None:
    """The ``vpmaddubsw`` kernels where narrow weights run on them here (compiled on the
    first ask), else None."""
    if not narrow_weights_pay():
        return None
    return compiled.made_once(_state, "narrow kernels", _compile_narrow)


def _checked(rows: np.ndarray, m: int, weights: PackedWeights, signed: bool,
             offsets: np.ndarray | None,
             only_m: bool = False) -> tuple[Any, int, int, int, int]:
    """(the kernels, row blocks, padded columns, the packed weights' address, the column
    offsets' address) for a product of ``m`` of ``rows`` (`multiply_rows`' arguments),
    raising where the kernels are missing or ``rows`` or ``offsets`` are not as it needs.
    ``only_m``: ``rows`` may also hold just the ``m`` rows where the product reads no
    others (`reads_rows_only`)."""
    kernels = _compiled()
    if kernels is None:
        raise RuntimeError("the int8 GEMM kernels are not available on this machine")
    blocks = -(-m // weights.rows)
    held = {blocks * weights.rows, m if only_m and reads_rows_only(weights, m) else 0}
    if (rows.dtype != np.uint8 or rows.ndim != 2 or rows.shape[0] not in held
            or rows.shape[1] != weights.groups * 4 or not rows.flags.c_contiguous):
        raise ValueError(f"int8 GEMM: rows {rows.dtype} {rows.shape} are not padded_rows' "
                         f"for {m} rows")
    packed, no_offsets, signed_offsets = weights.addresses
    columns = weights.panels * weights.vectors * LANES
    if offsets is not None:
        if offsets.dtype != np.int32 or offsets.shape != (columns,) or \
                not offsets.flags.c_contiguous:
            raise ValueError(f"int8 GEMM: offsets {offsets.dtype} {offsets.shape} are not "
                             f"int32 for {columns} columns")
        no_offsets = signed_offsets = offsets.ctypes.data
    return kernels, blocks, columns, packed, signed_offsets if signed else no_offsets


def product_job(rows: np.ndarray, m: int, weights: PackedWeights, signed: bool,
                out: np.ndarray, offsets: np.ndarray | None = None) -> Any:
    """`multiply_rows` as a `spin_pool` job writing ``out`` (int32, ``rows``' row count by
    ``weights``' padded columns, C-contiguous): its (panel, row block) tiles shared among the
    parts, so one product spreads over the cores. ``rows`` and ``out`` are read at each run:
    the caller fills ``rows`` before running the job. ``offsets``: as `multiply_rows`'.

    A single row (a classifier at batch 1) runs on the one-row tile, its panels shared
    among the parts: such a product streams its weights from memory once, so its parts are
    counted by the weights' bytes, each core streaming its own panels (ResNet-18's 512 ×
    1000 classifier, 0.5 MB)."""
    from engine.cpu import kernel_jobs, spin_pool

    kernels, blocks, columns, packed, offset_address = _checked(rows, m, weights, signed,
                                                                offsets, only_m=True)
    if out.dtype != np.int32 or out.shape != (rows.shape[0], columns) or \
            not out.flags.c_contiguous:
        raise ValueError(f"int8 GEMM: result {out.dtype} {out.shape} does not hold "
                         f"{rows.shape[0]} rows of {columns} columns")
    one_row = m == 1 and not weights.amx
    context = np.array([rows.ctypes.data, rows.shape[1], packed, weights.groups,
                        out.ctypes.data, columns, offset_address, blocks, weights.panels,
                        *_edge(weights, m, "edge", weights.vectors)], np.int64)
    if one_row:
        task = _kernel(kernels, weights, "task", "row", weights.vectors)
        work = weights.k * weights.n  # the weights' bytes, read once
    else:
        task = _kernel(kernels, weights, "task", "amx" if weights.amx else weights.vectors)
        work = m * weights.k * weights.n // 64
    parts = min(blocks * weights.panels, kernel_jobs.parts_for(blocks * weights.panels, work))
    return spin_pool.job(task, context, parts, keep=(rows, out, weights, offsets))


def reads_rows_only(weights: PackedWeights, m: int) -> bool:
    """Whether `product_job` of ``m`` rows of ``weights`` reads and writes those rows and no
    others: whole row blocks, a one-row product, or a short last block its task computes a
    row at a time on the one-row tile (`_edge`), so that its rows and result may end at
    row ``m`` (a layer's rows read where they lie, up to the data's end)."""
    return m % weights.rows == 0 or (not weights.amx and (
        m == 1 or _edge(weights, m, "edge", weights.vectors)[0] != 0))


def _edge(weights: PackedWeights, m: int, *key: Any) -> tuple[int, int]:
    """The context's last two fields for a product of ``m`` rows of ``weights``
    (`gemm_int8_ir.define_task`'s ``edge``): the address of the one-row ``panels`` under
    ``key`` that finishes a short last row block, and the rows of that block that hold
    data; (0, a whole block) where no task reads them (the tiles without an edge)."""
    narrow = _narrow_kernels() if weights.narrow and weights.rows == NARROW_ROWS else None
    if narrow is None:
        return 0, weights.rows
    return narrow[key], m - (-(-m // weights.rows) - 1) * weights.rows


def table_runs(weights: PackedWeights) -> bool:
    """Whether `table_job` runs products of ``weights`` here: narrow weights on the AVX2
    host's ``vpmaddubsw`` kernels, or any weights not packed for AMX on VNNI's."""
    if not weights.amx and vnni_available():
        return True
    return taps_run(weights)


def taps_run(weights: PackedWeights) -> bool:
    """Whether `taps_job` runs products of ``weights`` here: narrow weights on the AVX2
    host's ``vpmaddubsw`` kernels."""
    return weights.narrow and weights.rows == NARROW_ROWS and _narrow_kernels() is not None


def _table_task(weights: PackedWeights) -> int:
    """The address of the `spin_pool` task of `table_job` for ``weights``: the
    ``vpmaddubsw`` kernels' or VNNI's (compiled at the first table product of a panel
    width)."""
    if taps_run(weights):
        return _narrow_kernels()["task", "table", weights.vectors]
    return compiled.made_once(_state, ("vnni table", weights.vectors),
                              lambda: _compile_vnni_table(weights.vectors))


def _compile_vnni_table(vectors: int) -> int:
    """VNNI's tile of ``vectors`` reading its rows where a table points, as its task's
    address."""
    from engine.kernels.gemm_int8_ir import Int8Kernel, define_task

    def module() -> Any:
        rows = dict(TILES)[vectors]
        kernel = Int8Kernel(rows, vectors, table=True)
        define_task(kernel.module, kernel.define("panels"), rows, row_bytes=8)
        return kernel.module

    return _task_address(module)


def _task_address(module: Callable[[], Any]) -> int:
    """The address of the task ``module()``'s module defines, compiled for the host (its
    engine kept with the others, which own the machine code); RuntimeError where it does not
    compile."""
    from engine.cpu import llvm_jit

    engine = llvm_jit.compile_for_host(module)
    if engine is None:
        raise RuntimeError("an int8 kernel did not compile for this host")
    _state.setdefault("task engines", []).append(engine)
    return engine.get_function_address("task")


def table_job(addresses: np.ndarray, group_offsets: np.ndarray, m: int,
              weights: PackedWeights, signed: bool, out: np.ndarray,
              source: np.ndarray | None = None) -> Any:
    """The product of ``m`` rows that lie where ``addresses`` points (int64, one a row, whole
    row blocks: rows past ``m`` pointing anywhere readable), each row's group of four K
    values g at its address plus ``group_offsets[g]`` (int64, one a group): a convolution's
    windows read where they lie in its padded copy, no patch rows gathered. As a
    `spin_pool` job writing ``out`` as `product_job`'s; where `table_runs` (VNNI, or narrow
    weights on the AVX2 host). ``signed``: the bytes hold int8 values plus 128. ``source``:
    the array the addresses point into, kept alive with the job."""
    from engine.cpu import kernel_jobs, spin_pool

    if not table_runs(weights):
        raise RuntimeError("the table product needs the VNNI kernels, or narrow weights on "
                           "the vpmaddubsw kernels")
    blocks = -(-m // weights.rows)
    columns = weights.panels * weights.vectors * LANES
    if (addresses.dtype != np.int64 or len(addresses) < blocks * weights.rows
            or group_offsets.dtype != np.int64 or len(group_offsets) != weights.groups):
        raise ValueError(f"int8 table product: {len(addresses)} row addresses and "
                         f"{len(group_offsets)} group offsets do not fit {blocks} blocks "
                         f"and {weights.groups} groups")
    if out.dtype != np.int32 or out.ndim != 2 or out.shape[1] != columns or \
            out.shape[0] < blocks * weights.rows or not out.flags.c_contiguous:
        raise ValueError(f"int8 table product: result {out.dtype} {out.shape} does not hold "
                         f"{blocks * weights.rows} rows of {columns} columns")
    packed, no_offsets, signed_offsets = weights.addresses
    context = np.array([addresses.ctypes.data, group_offsets.ctypes.data, packed,
                        weights.groups, out.ctypes.data, columns,
                        signed_offsets if signed else no_offsets, blocks, weights.panels,
                        *_edge(weights, m, "edge", "table", weights.vectors)], np.int64)
    task = _table_task(weights)
    parts = min(blocks * weights.panels, kernel_jobs.parts_for(
        blocks * weights.panels, m * weights.k * weights.n // 64))
    return spin_pool.job(task, context, parts,
                         keep=(addresses, group_offsets, out, weights, source))


def fused_runs(weights: PackedWeights) -> bool:
    """Whether `fused_job` runs products of ``weights`` here: VNNI's tiles (not AMX's)."""
    return not weights.amx and vnni_available()


def fused_job(a: np.ndarray, lda: np.ndarray | int, m: int, weights: PackedWeights,
              signed: bool, requantize: tuple[Any, ...], source: np.ndarray | None = None,
              runs: TapRuns | None = None) -> Any:
    """The product of ``m`` rows requantized in its tiles' epilogue
    (`gemm_int8_fused_ir`): no int32 sums written, each tile's bytes written where
    ``requantize`` (`int8_epilogue_ir`'s terms and factors, then anything the job keeps
    alive) says. ``a``: the rows (uint8, whole row blocks of ``weights.groups · 4`` bytes),
    ``lda`` then ignored; or a table of the rows' addresses (int64, whole row blocks: rows
    past ``m`` pointing anywhere readable) with ``lda`` each group's byte offset in a row
    (int64, `table_job`'s). As a `spin_pool` job, its tiles shared among the parts as the
    terms ask (rows first, or panels). ``signed``: the bytes hold int8 values plus 128.
    ``source``: an array the addresses point into, kept alive with the job. ``runs``: the
    rows are a convolution's output positions, read by their table from a zero-padded
    copy of unsigned data, in runs of `run_taps_ir.SEGMENT` within output rows: tiles of
    two runs (`RunsFusedInt8Kernel`, `RUN_ROWS` rows a block) leave out each tap of a
    window in the padding."""
    from engine.cpu import kernel_jobs, spin_pool

    if not fused_runs(weights):
        raise RuntimeError("the int8 product requantized in its epilogue needs the VNNI "
                           "kernels and weights not packed for AMX")
    rows = weights.rows if runs is None else RUN_ROWS
    blocks = -(-m // rows)
    table = isinstance(lda, np.ndarray)
    if runs is not None and (not table or signed or weights.vectors % 2):
        raise ValueError("int8 fused product: run tiles read unsigned windows by their "
                         "table, panels of 2 or 4 vectors")
    if table:
        if (a.dtype != np.int64 or len(a) < blocks * rows or lda.dtype != np.int64
                or len(lda) != weights.groups):
            raise ValueError(f"int8 fused product: {len(a)} row addresses and {len(lda)} "
                             f"group offsets do not fit {blocks} blocks and "
                             f"{weights.groups} groups")
        stride = lda.ctypes.data
    else:
        if (a.dtype != np.uint8 or a.ndim != 2 or a.shape[0] < blocks * weights.rows
                or a.shape[1] != weights.groups * 4 or not a.flags.c_contiguous):
            raise ValueError(f"int8 fused product: rows {a.dtype} {a.shape} are not "
                             f"{blocks} whole blocks of {weights.groups * 4} bytes")
        stride = a.shape[1]
    packed, no_offsets, signed_offsets = weights.addresses
    fields = [a.ctypes.data, stride, packed, weights.groups, requantize[0].ctypes.data,
              requantize[1].ctypes.data, signed_offsets if signed else no_offsets, blocks,
              weights.panels]
    if runs is None:
        task = compiled.made_once(_state, ("fused", weights.vectors, table),
                                  lambda: _compile_fused(weights.vectors, table))
    else:
        fields += [runs.bounds.ctypes.data, runs.width, runs.positions,
                   weights.groups // len(runs.bounds), m, runs.step]
        task = compiled.made_once(_state, ("fused runs", weights.vectors),
                                  lambda: _compile_fused_runs(weights.vectors))
    parts = min(blocks * weights.panels, kernel_jobs.parts_for(
        blocks * weights.panels, m * weights.k * weights.n // 64))
    return spin_pool.job(task, np.array(fields, np.int64), parts,
                         keep=(a, lda, weights, requantize, source, runs))


def _compile_fused(vectors: int, table: bool) -> int:
    """VNNI's tile of ``vectors`` with the requantize in its epilogue (reading its rows
    where a table points, or as rows), as its task's address."""
    from engine.kernels.gemm_int8_fused_ir import FusedInt8Kernel

    return _task_address(lambda: FusedInt8Kernel(dict(TILES)[vectors], vectors, table).module)


def _compile_fused_runs(vectors: int) -> int:
    """`fused_job`'s run tiles over panels of ``vectors``, as their task's address."""
    from engine.kernels.gemm_int8_fused_ir import RunsFusedInt8Kernel

    return _task_address(lambda: RunsFusedInt8Kernel(vectors).module)


def taps_job(entries: np.ndarray, m: int, weights: PackedWeights, out: np.ndarray,
             keep: tuple[Any, ...]) -> Any:
    """The product of ``m`` rows each listed with its own K steps: ``entries`` (int64, a
    row of `gemm_int8_avx2_ir.TAP_ENTRY`, whole row blocks) holds each row's window
    address, the row of ``out`` its sums go to, and the address and count of its K steps
    (int64 pairs: the group's byte offset in the window, its weights' byte offset in a
    panel, `weight_offset`), every row of a block taking its first row's steps. So a
    convolution's tiles at an image's border walk only the taps inside it
    (`int8_conv.FusedConv`). Unsigned rows only: a skipped tap must hold zeros. As a
    `spin_pool` job writing ``out`` as `product_job`'s; narrow weights on the AVX2 host only
    (`taps_run`). ``keep``: the arrays ``entries`` points into (windows, steps), kept
    alive with the job."""
    from engine.cpu import kernel_jobs, spin_pool

    if not taps_run(weights):
        raise RuntimeError("the taps product needs narrow weights on the vpmaddubsw kernels")
    blocks = -(-m // weights.rows)
    columns = weights.panels * weights.vectors * LANES
    if entries.dtype != np.int64 or entries.ndim != 2 or entries.shape[1] != 4 or \
            len(entries) < blocks * weights.rows or not entries.flags.c_contiguous:
        raise ValueError(f"int8 taps product: entries {entries.dtype} {entries.shape} do not "
                         f"list {blocks} blocks of {weights.rows} rows")
    if out.dtype != np.int32 or out.ndim != 2 or out.shape[1] != columns or \
            not out.flags.c_contiguous or not 0 <= entries[:m, 1].min() <= \
            entries[:m, 1].max() < out.shape[0]:
        raise ValueError(f"int8 taps product: result {out.dtype} {out.shape} does not hold "
                         f"the rows of {columns} columns its entries name")
    packed, no_offsets, _ = weights.addresses
    context = np.array([entries.ctypes.data, 0, packed, weights.groups, out.ctypes.data,
                        columns, no_offsets, blocks, weights.panels,
                        *_edge(weights, m, "edge", "taps", weights.vectors)], np.int64)
    task = _narrow_kernels()["task", "taps", weights.vectors]
    parts = min(blocks * weights.panels, kernel_jobs.parts_for(
        blocks * weights.panels, m * weights.k * weights.n // 64))
    return spin_pool.job(task, context, parts, keep=(entries, out, weights, *keep))


def weight_offset(weights: PackedWeights, group: Any) -> Any:
    """The byte offset of K group ``group``'s weights within a panel of ``weights``, as the
    taps product's steps give it."""
    return group * weights.vectors * LANES * 4


def direct_tile_rows(width: int) -> int:
    """Rows of a direct product's tiles for an output ``width`` wide: its largest divisor up
    to 16, so that a tile never crosses an output row (0 where that is under 7: tiles that
    short would waste most of each product)."""
    rows = max(rows for rows in range(1, 17) if width % rows == 0)
    return rows if rows >= 7 else 0


def direct_job(image: np.ndarray, row_stride: int, steps: np.ndarray, starts: np.ndarray,
               m: int, weights: PackedWeights, signed: bool, tile_rows: int,
               out: np.ndarray, requantize: tuple[Any, ...] | None = None) -> Any:
    """The product of ``m`` rows, each tile of ``tile_rows`` rows read from ``image`` (uint8,
    padded channels-last) at ``starts`` (a byte offset per tile, two a block of
    ``2 · tile_rows`` rows) plus ``steps`` (a byte offset per 64 values of K), its rows
    ``row_stride`` bytes apart (`gemm_int8_direct_ir`), as a `spin_pool` job writing ``out``
    (int32, rows of the padded columns); AMX-packed weights only. ``requantize``: the
    terms and factors of `int8_epilogue_ir`'s ``requantize`` (then anything the job
    keeps alive, the arrays ``terms`` holds the addresses of), run on each block's sums as
    soon as they are made (the bytes written channels-last where ``terms`` says); ``out``
    is then not written."""
    from engine.cpu import kernel_jobs, spin_pool
    from engine.kernels.gemm_int8_direct_ir import tile_configuration

    kernels = _compiled()
    if kernels is None or ("task", "direct") not in kernels or not weights.amx:
        raise RuntimeError("the direct int8 product needs AMX-INT8 and AMX-packed weights")
    blocks = -(-m // (2 * tile_rows))
    columns = weights.panels * weights.vectors * LANES
    if (steps.dtype != np.int64 or len(steps) != weights.groups * 4 // 64
            or starts.dtype != np.int64 or len(starts) < 2 * blocks):
        raise ValueError(f"direct int8 product: {len(steps)} K steps and {len(starts)} tile "
                         f"starts do not fit K = {weights.groups * 4} and {blocks} blocks")
    # requantized in the epilogue, the sums never reach ``out`` (any rows will do)
    rows = 0 if requantize is not None else blocks * 2 * tile_rows
    if out.dtype != np.int32 or out.ndim != 2 or out.shape[1] != columns or \
            out.shape[0] < rows or not out.flags.c_contiguous:
        raise ValueError(f"direct int8 product: result {out.dtype} {out.shape} does not hold "
                         f"{rows} rows of {columns} columns")
    config = np.array(tile_configuration(tile_rows), np.uint8)
    packed, no_offsets, signed_offsets = weights.addresses
    context = np.array([image.ctypes.data, row_stride, steps.ctypes.data, packed,
                        weights.groups, out.ctypes.data, columns,
                        signed_offsets if signed else no_offsets, starts.ctypes.data, blocks,
                        weights.panels, config.ctypes.data, tile_rows,
                        0 if requantize is None else requantize[0].ctypes.data,
                        0 if requantize is None else requantize[1].ctypes.data], np.int64)
    parts = min(blocks * weights.panels, kernel_jobs.parts_for(
        blocks * weights.panels, m * weights.k * weights.n // 64))
    return spin_pool.job(kernels["task", "direct"], context, parts,
                         keep=(image, steps, starts, out, weights, config, requantize))


def amx_available() -> bool:
    """Whether the AMX-INT8 kernel compiled too (the host has AMX and Linux granted it)."""
    kernels = _compiled()
    return kernels is not None and "amx" in kernels


def _compiled() -> dict[Any, Any] | None:
    return compiled.made_once(_state, "kernels", _compile_or_say)


def _compile_or_say() -> dict[Any, Any] | None:
    kernels = _compile()
    if kernels is None:
        log.info("int8 products run as float64 BLAS: no AVX-512 VNNI or AVX2 JIT here")
    elif "amx" in kernels:
        log.info("int8 products run on the AVX-512 VNNI and AMX-INT8 kernels")
    elif _has_vnni():
        log.info("int8 products run on the AVX-512 VNNI kernel")
    else:
        log.info("int8 products run on the AVX2 kernel (vpmaddwd)")
    return kernels


def _compile() -> dict[Any, Any] | None:
    try:
        import llvmlite.binding as llvm

        from engine.cpu.llvm_jit import compile_ir
        from engine.kernels.gemm_int8_ir import Int8Kernel, define_task
    except ImportError:
        return None
    try:
        if not _has_vnni():
            return _compile_avx2() if host_features.has("avx2") else None
        llvm.initialize_native_target()
        host = llvm.get_host_cpu_features()
        kernels: dict[Any, Any] = {}
        engines = []
        for vectors, rows in TILES:
            kernel = Int8Kernel(rows, vectors)
            define_task(kernel.module, kernel.define("panels"), rows)
            single = Int8Kernel(1, vectors)
            define_task(single.module, single.define("panels"), 1)
            for built in (kernel, single):
                engines.append(compile_ir(str(built.module), llvm.get_host_cpu_name(),
                                          host.flatten(), level=3, optimise=True, kept=True))
            kernels[vectors] = _SIGNATURE(engines[-2].get_function_address("panels"))
            kernels["task", vectors] = engines[-2].get_function_address("task")
            kernels["row", vectors] = _SIGNATURE(engines[-1].get_function_address("panels"))
            kernels["task", "row", vectors] = engines[-1].get_function_address("task")
        if host_features.has("amx_int8") and host_features.amx_permitted():
            from engine.kernels.gemm_int8_amx_ir import AmxInt8Kernel

            kernel = AmxInt8Kernel()
            define_task(kernel.module, kernel.define("panels"), kernel.rows)
            engine = compile_ir(str(kernel.module), llvm.get_host_cpu_name(), host.flatten(),
                                level=3, optimise=True, kept=True)
            engines.append(engine)
            kernels["amx"] = _SIGNATURE(engine.get_function_address("panels"))
            kernels["task", "amx"] = engine.get_function_address("task")
            from engine.kernels.gemm_int8_direct_ir import DirectInt8Kernel

            engine = compile_ir(str(DirectInt8Kernel().module), llvm.get_host_cpu_name(),
                                host.flatten(), level=3, optimise=True, kept=True)
            engines.append(engine)
            kernels["task", "direct"] = engine.get_function_address("task")
    except (RuntimeError, OSError):  # no JIT for this target
        return None
    _state["engines"] = engines  # the engines own the machine code
    return kernels


def _compile_avx2() -> dict[Any, Any]:
    """The AVX2 kernels under the keys `_compile` gives VNNI's (no AMX, no direct product):
    each panel width's tile and its one-row tile, each with its `spin_pool` task. Raises
    RuntimeError or OSError where there is no JIT for this target."""
    kernels, engines = _compiled_avx2(narrow=False)
    _state["engines"] = engines  # the engines own the machine code
    return kernels


def _compile_narrow() -> dict[Any, Any] | None:
    """The ``vpmaddubsw`` kernels for narrow weights, under the keys `_kernel` asks with
    (each panel width's tile and one-row tile, their tasks, and the table and taps
    products'), each width's kernels of a kind compiled at the first key asked of them
    (`NarrowKernels`); None where they do not compile (tried on the widest panels' tiles)."""
    kernels = NarrowKernels()
    try:
        kernels[NARROW_FIRST]
    except (RuntimeError, OSError):
        return None
    return kernels


# the kernels `_compile_narrow` compiles first: the widest panels' tiles, which most layers
# take (N of 64 and more)
NARROW_FIRST = 4


class NarrowKernels(dict):
    """The narrow-weight kernels by key, compiled a group at a time at the first key asked of
    the group: a panel width's tiles (``vectors``, ``("task", vectors)``, its one-row tile
    ``("row", vectors)`` with its task, and ``("edge", vectors)``), its table product's tasks
    (``("task", "table", vectors)``, ``("edge", "table", vectors)``) or its taps product's.
    All of them at once took 2.6–3.0 s of a Zen 3 core where ResNets use one panel width in
    most of their layers."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()

    def __missing__(self, key: Any) -> Any:
        vectors = key if isinstance(key, int) else key[-1]
        kind = next((kind for kind in ("table", "taps") if kind in key), "tiles") \
            if isinstance(key, tuple) else "tiles"
        with self._lock:
            if key not in self:
                kernels, engines = _compiled_avx2(narrow=True, groups=((kind, vectors),))
                _state.setdefault("narrow engines", []).extend(engines)  # own the code
                self.update(kernels)
        return dict.__getitem__(self, key)


def _compiled_avx2(narrow: bool, groups: Any = None) -> tuple[dict[Any, Any], list[Any]]:
    """The AVX2 kernels (``narrow``: the ``vpmaddubsw`` ones) by key, and the engines that
    own their machine code: ``groups`` (kind, vectors) of them, a kind ``"tiles"`` (a panel
    width's tile and one-row tile), ``"table"`` or ``"taps"`` (narrow only); by default every
    panel width's tiles."""
    import llvmlite.binding as llvm

    from engine.cpu.llvm_jit import compile_ir
    from engine.kernels.gemm_int8_avx2_ir import (
        STRIP,
        TAP_ENTRY,
        Avx2Int8Kernel,
        NarrowInt8Kernel,
    )
    from engine.kernels.gemm_int8_ir import define_task

    llvm.initialize_native_target()
    features = llvm.get_host_cpu_features().flatten()
    engines = []

    def compiled_tile(rows: int, vectors: int, table: bool = False,
                      taps: bool = False) -> tuple[Any, int, int]:
        """(``panels`` callable, its task's address, the address of ``panels`` itself)."""
        # one row streams its weights once: a strip of the whole panel walks them in the
        # order they lie, each step asking for all its lines ahead (`NarrowInt8Kernel`)
        strip = vectors * LANES if rows == 1 else STRIP
        kernel = NarrowInt8Kernel(rows, vectors, strip, table=table, taps=taps) if narrow \
            else Avx2Int8Kernel(rows, vectors, buffered=False if rows == 1 else None,
                                strip=strip)
        # the narrow tiles' tasks finish a short last block on the one-row tile
        define_task(kernel.module, kernel.define("panels"), rows,
                    row_bytes=8 if table else TAP_ENTRY * 8 if taps else None,
                    edge=narrow and rows > 1, rows_placed=taps)
        engines.append(compile_ir(str(kernel.module), llvm.get_host_cpu_name(), features,
                                  level=3, optimise=True, kept=True))
        panels = engines[-1].get_function_address("panels")
        return _SIGNATURE(panels), engines[-1].get_function_address("task"), panels

    kernels: dict[Any, Any] = {}
    rows_of = dict(tiles())
    for kind, vectors in groups or (("tiles", vectors) for vectors, _ in TILES):
        rows = NARROW_ROWS if narrow else rows_of[vectors]
        if kind == "tiles":
            kernels[vectors], kernels["task", vectors], _ = compiled_tile(rows, vectors)
            kernels["row", vectors], kernels["task", "row", vectors], \
                kernels["edge", vectors] = compiled_tile(1, vectors)
        else:  # rows read where a table points (`table_job`), or each listing its own taps
            # (`taps_job`), and the one-row tile finishing a short last block
            flag = {kind: True}
            _, kernels["task", kind, vectors], _ = compiled_tile(rows, vectors, **flag)
            *_, kernels["edge", kind, vectors] = compiled_tile(1, vectors, **flag)
    return kernels, engines
