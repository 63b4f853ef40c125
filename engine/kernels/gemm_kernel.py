"""A float32 GEMM of our own: register-tile micro-kernels in LLVM IR, run as `spin_pool` jobs.

Why not OpenBLAS for everything: at a network's shapes at small batches (few columns, weights
read once per call) numpy's OpenBLAS packs both operands on every call, and its kernels run
below ONNX Runtime's MLAS at the same shapes (one thread, Zen 4, warm: 64×512×256 1.11× MLAS's
time, 784×576×128 1.10×, 49×4608×512 1.29×; `bench/gemm.py`). Here the weights are packed once,
when a plan binds, into the order the micro-kernel reads them (`pack`), and the activations are
read where they lie: the micro-kernel keeps an ``MR × NR`` tile of C in vector registers for
the whole K loop, reading ``MR`` scalars of A (broadcast) and ``NR`` contiguous floats of B per
step, prefetching the packed operand it streams (B's panels, or A's blocks) ahead of the
loop (`gemm_ir.AHEAD_STEPS`). numba cannot be made to keep such a tile in registers (it
spills it to memory, 7 GFLOP/s against OpenBLAS's 100), so the kernels are LLVM IR
(`gemm_ir`) compiled with `llvmlite`, numba's own dependency, for the host CPU once per process
(about 0.1 s), with the loop that walks a part of the tiles (``part``): a product is a
`spin_pool` job whose parts are runs of tiles, on every core while a run is armed. Measured
at the benchmark networks' products (`bench/gemm.py`, one thread, Zen 4, warm): ours
1.00–1.05× MLAS's time, OpenBLAS 1.00–1.39×.

Tiles by vector ISA (registers: accumulators + a row of B + the broadcast):
AVX-512 12 × 32 (24 + 2 + 1 of 32 zmm), AVX2 with FMA 6 × 16 (12 + 2 + 1 of 16 ymm, its parts
`gemm_avx2_ir`'s), 64-bit ARM's NEON 6 × 16 (24 + 4 + 1 of 32), else 4 × 8.

`available()` is False where llvmlite cannot be imported or the JIT fails: callers then keep
NumPy's matmul.
"""

from __future__ import annotations

import platform
import time
from functools import partial
from typing import Any, NamedTuple

import numpy as np

from engine.cpu import compiled, host_features, spin_pool
from engine.kernels.workspace import empty_aligned

_state: dict[str, Any] = {}


class Tile(NamedTuple):
    """The register tile: ``rows`` of A by ``vectors`` SIMD vectors of ``width`` floats."""

    rows: int
    width: int
    vectors: int

    @property
    def columns(self) -> int:
        return self.width * self.vectors


# The kernels by the operands they read: float32; bf16 pairs on AVX-512 BF16 (`gemm_bf16_ir`);
# bf16 pairs on AMX tiles (`gemm_amx_ir`).
FP32, BF16, AMX = 0, 1, 2
AMX_TILE = Tile(32, 16, 2)
AVX2_TILE = Tile(6, 8, 2)  # its parts are `gemm_avx2_ir`'s


def available(kernel: int = FP32) -> bool:
    """Whether ``kernel`` compiled for this CPU (compiled on the first call): the bf16 ones
    need AVX-512 BF16, AMX also Linux's grant of the tile state."""
    return _compiled(kernel) is not None


# `bf16_tile_pays`: runs timed each way, and how much faster the bf16 tile must be.
BF16_TIMING_RUNS = 7
BF16_TILE_MARGIN = 1.3


def bf16_tile_pays() -> bool:
    """Whether the AVX-512 BF16 tile multiplies clearly faster than the float32 tile here,
    timed once per process on a product in cache (96 × 256 × 256, both operands packed, the
    quickest of `BF16_TIMING_RUNS` runs each way, in turn): by `BF16_TILE_MARGIN` or more.
    ``vdpbf16ps`` does two multiply-adds a lane, but at what rate depends on the core: on
    the Intel Xeon of docs/benchmarks.md the bf16 tile ran at 112 GFLOP/s against 186, on
    AMD Zen 5 at 510 against 255. Where it pays, a bf16 plan runs its 3×3 convolutions as
    bf16 products rather than float32 Winograd (`winograd_bind.bind`)."""
    return compiled.made_once(_state, "bf16 tile pays", _time_bf16_tile)


def _time_bf16_tile() -> bool:
    if not available(BF16):
        return False
    # The values do not change the time: ones, and words holding two bf16 ones (0x3F80).
    a, b = np.ones((96, 256), np.float32), np.ones((256, 256), np.float32)
    pairs = np.full((96, 128), 0x3F803F80, np.uint32).view(np.float32)
    paired = np.full((128, 256), 0x3F803F80, np.uint32).view(np.float32)
    out = np.zeros((96, 256), np.float32)
    products = (bind_both_packed(pack(a), pack_columns(b), out),
                bind_both_packed(pack(pairs), pack_columns(paired), out, kernel=BF16))
    best = [float("inf"), float("inf")]
    for _ in range(BF16_TIMING_RUNS):
        for way, product in enumerate(products):
            start = time.perf_counter()
            product()
            best[way] = min(best[way], time.perf_counter() - start)
    return best[0] >= BF16_TILE_MARGIN * best[1]


def tile() -> Tile:
    """The tile the kernels were compiled for."""
    kernels = _compiled()
    if kernels is None:
        raise RuntimeError("the GEMM kernels are not available on this machine")
    return kernels["tile"]


def side_columns() -> int:
    """Up to how many columns past an edge's whole vectors the float32 kernel sums a column
    to a vector (`gemm_ir.TileKernel.side_columns`)."""
    kernels = _compiled()
    if kernels is None:
        raise RuntimeError("the GEMM kernels are not available on this machine")
    return kernels["side_columns"]


def pack_each(a: Any) -> np.ndarray:
    """`pack` of each matrix of ``a`` (batch, M, K), as one array (batch, blocks, K, MR)."""
    packed = [pack(matrix) for matrix in a]
    batch = empty_aligned(np, (len(packed), *packed[0].shape), np.float32)
    np.stack(packed, out=batch)
    return batch


def pack(a: Any) -> np.ndarray:
    """``a`` (M, K) float32 as the micro-kernel reads A: blocks of MR rows, each (K, MR)
    (row block-major, then k, then row), the last block padded with zero rows."""
    rows = tile().rows
    m, k = a.shape
    blocks = -(-m // rows)
    packed = np.zeros((blocks * rows, k), a.dtype)
    packed[:m] = a
    return _aligned_copy(packed.reshape(blocks, rows, k).transpose(0, 2, 1))


def pack_columns(b: Any, columns: int | None = None) -> np.ndarray:
    """``b`` (K, N) float32 as the micro-kernel reads B: panels of NR columns (``columns``,
    else the host's tile's), each (K, NR) contiguous, the last padded with zero columns. A
    panel streams from memory in order, where an unpacked one is NR floats from each of K rows
    far apart (the 16 products of ResNet-18's 512-channel Winograd layer, weights cold: 3.67
    ms unpacked, 1.60 packed, BLAS 2.62)."""
    columns = columns or tile().columns
    k, n = b.shape
    panels = -(-n // columns)
    packed = np.zeros((k, panels * columns), b.dtype)
    packed[:, :n] = b
    return _aligned_copy(packed.reshape(k, panels, columns).transpose(1, 0, 2))


def _aligned_copy(array: np.ndarray) -> np.ndarray:
    """``array`` copied C-contiguous from a cache line's start (`empty_aligned`): the kernels
    stream packed panels, and a panel straddling lines costs a line more per pass."""
    copy = empty_aligned(np, array.shape, array.dtype)
    copy[...] = array
    return copy


def applies(a: Any, b: Any, c: Any) -> bool:
    """Whether `multiply` takes these operands: float32 NumPy matrices of matching shapes,
    B and C with contiguous rows, C overlapping neither, and the kernels compiled."""
    if not all(type(x) is np.ndarray and x.dtype == np.float32 and x.ndim == 2
               for x in (a, b, c)):
        return False
    if a.shape[1] != b.shape[0] or c.shape != (a.shape[0], b.shape[1]) or not a.shape[1]:
        return False
    if (b.strides[1] != 4 and b.shape[1] > 1) or (c.strides[1] != 4 and c.shape[1] > 1):
        return False
    if np.may_share_memory(c, a) or np.may_share_memory(c, b):
        return False
    return available()


class Product(partial):
    """``c = clip(a @ b + bias, low, high)`` bound once: a `spin_pool.Job` over the tiles of C,
    its context (the operands' addresses, strides and sizes, `_context`) worked out here (a
    call costs under a microsecond, against 7 µs reading them from the arrays each time).
    ``operands`` keeps the arrays, and so the addresses, alive."""

    operands: tuple[Any, ...]
    context: np.ndarray
    leaves_blas_alone = True  # its tiles run on the spin pool, never in BLAS (`cpu.parts`)

    @property
    def columns_outside(self) -> bool:
        """Whether column panels are the outer loop (B packed), else row blocks."""
        return int(self.context[_COLUMNS_OUTSIDE]) == 1

    @property
    def columns_when_split(self) -> bool:
        """Whether column panels are the outer loop only where the job runs in several parts
        (`bind_packed`'s ``columns_when_split``)."""
        from engine.kernels.gemm_ir import COLUMNS_WHEN_SPLIT

        return int(self.context[_COLUMNS_OUTSIDE]) == COLUMNS_WHEN_SPLIT

    def with_epilogue(self, bias_rows: Any = None, bias_columns: Any = None,
                      low: float = -np.inf, high: float = np.inf) -> Product:
        """This product adding a bias per row of C and/or per column, and clamped to
        [low, high] (narrowing the bounds it has). A bias is read where it lies at every
        run (it may be an input's buffer): float32 and contiguous (`takes_bias`)."""
        context = self.context.copy()
        kept = list(self.operands)
        for position, bias, size in ((_ROWS_BIAS, bias_rows, context[_M]),
                                     (_COLUMNS_BIAS, bias_columns, context[_N])):
            if bias is not None:
                if not takes_bias(bias) or bias.size < size:
                    raise ValueError(f"a fused bias must be float32, contiguous and hold "
                                     f"{size} values")
                context[position] = bias.ctypes.data
                kept.append(bias)
        bounds = context[_BOUNDS].view(np.float64)
        bounds[:] = max(bounds[0], float(low)), min(bounds[1], float(high))
        return _as_product(context, tuple(kept))

    def writes_within(self, out: Any) -> bool:
        """Whether every element of C this product writes lies inside ``out`` (a
        C-contiguous array), so that a residual laid out as ``out`` lies as C does."""
        c = self.context
        last = ((int(c[_BATCH]) - 1) * int(c[_C_BATCH])
                + 4 * ((int(c[_M]) - 1) * int(c[_LDC]) + int(c[_N])))
        return residual_fits(int(c[_C]), last, out)

    def with_residual(self, out: Any, other: Any) -> Product:
        """This product adding ``other`` (an array of ``out``'s shape, float32,
        C-contiguous) to C before its clamp (after its biases), element for element of
        ``out``, which C must lie in (`writes_within`)."""
        return _as_product(*residual_context(self.context, _C, _RESIDUAL, out, other,
                                             self.operands))

    def writing(self, c: Any) -> Product:
        """This product, its epilogue included, storing C into ``c`` in place of its own: a
        float32 (m, n) array with contiguous rows. One product of one C, adding no residual
        (laid out as the C it replaces)."""
        context = self.context.copy()
        shape = (int(context[_M]), int(context[_N]))
        if (type(c) is not np.ndarray or c.dtype != np.float32 or c.shape != shape
                or c.strides[1] != c.itemsize or c.strides[0] % c.itemsize
                or int(context[_BATCH]) != 1 or int(context[_RESIDUAL]) != 0):
            raise ValueError(f"a product's C moves to a float32 array of its shape {shape} "
                             f"with contiguous rows, for one product adding no residual; got "
                             f"{getattr(c, 'dtype', type(c))} {getattr(c, 'shape', '')}")
        context[_C], context[_LDC] = c.ctypes.data, c.strides[0] // c.itemsize
        return _as_product(context, (*self.operands, c))


def residual_fits(start: int, extent: int, out: Any) -> bool:
    """Whether ``extent`` bytes from address ``start`` lie inside ``out``."""
    first = out.ctypes.data
    return first <= start and start + extent <= first + out.nbytes


def residual_context(context: np.ndarray, c_field: int, residual_field: int, out: Any,
                     other: Any, operands: tuple[Any, ...]) -> tuple[np.ndarray, tuple]:
    """A product's context with the residual's start set where C's element lies in
    ``other`` (C inside ``out``, ``other`` laid out as ``out``), and its operands with
    ``other`` kept alive."""
    if (type(other) is not np.ndarray or other.dtype != np.float32 or other.shape != out.shape
            or not other.flags.c_contiguous or not out.flags.c_contiguous):
        raise ValueError(f"a fused residual must be float32, C-contiguous and of the output's "
                         f"shape {out.shape}; got {getattr(other, 'dtype', type(other))} "
                         f"{getattr(other, 'shape', '')}")
    context = context.copy()
    context[residual_field] = other.ctypes.data + int(context[c_field]) - out.ctypes.data
    return context, (*operands, other)


def takes_bias(bias: Any) -> bool:
    """Whether `Product.with_epilogue` can read this bias where it lies."""
    return (type(bias) is np.ndarray and bias.dtype == np.float32
            and bias.flags.c_contiguous)


# A product's context, the int64s the compiled ``part`` reads (addresses in bytes, strides in
# floats): the tile, A (start, step from one row to the next, row stride, column stride), B
# (start, step between columns, row stride), C (start, row stride), the biases' starts, the
# bounds (two float64s), m, n, k, whether column panels are the outer loop, for a batch of
# products (Winograd's 16) their count and the bytes from one's A, B and C to the next's, the
# kernel, and where the residual added to C starts (laid out as C; 0 for none).
CONTEXT_FIELDS = {name: index for index, name in enumerate((
    "mr", "nr", "a", "row_step", "lda", "acs", "b", "column_step", "ldb", "c", "ldc",
    "rows_bias", "columns_bias", "low", "high", "m", "n", "k", "columns_outside", "batch",
    "a_batch", "b_batch", "c_batch", "kernel", "residual"))}
(_MR, _NR, _A, _ROW_STEP, _LDA, _ACS, _B, _COLUMN_STEP, _LDB, _C, _LDC, _ROWS_BIAS,
 _COLUMNS_BIAS, _LOW, _HIGH, _M, _N, _K, _COLUMNS_OUTSIDE, _BATCH, _A_BATCH, _B_BATCH,
 _C_BATCH, _KERNEL, _RESIDUAL) = CONTEXT_FIELDS.values()
_BOUNDS = slice(_LOW, _HIGH + 1)

# Multiply-adds per part of a job at least (about 2 µs at 50 GMAC/s: the hand-off costs well
# under 1 µs).
PART_MACS = 1 << 17


def row_share(context: np.ndarray, first: int, last: int) -> np.ndarray:
    """A copy of a product's ``context`` narrowed to its rows [first, last) (``first`` at a
    whole row block): A's block, C's and the row bias's (and a residual's) starts moved on, M
    cut."""
    share = context.copy()
    share[_A] += first * int(context[_ROW_STEP]) * 4
    share[_C] += first * int(context[_LDC]) * 4
    share[_ROWS_BIAS] += first * 4
    if int(context[_RESIDUAL]):
        share[_RESIDUAL] += first * int(context[_LDC]) * 4
    share[_M] = last - first
    return share


def bind(a: Any, b: Any, c: Any) -> Product:
    """``c = a @ b``: ``a`` (M, K) with any strides (see `applies`)."""
    item = 4
    return _product((a, b, c), a.ctypes.data, a.strides[0] // item, a.strides[0] // item,
                    a.strides[1] // item, b.ctypes.data, 1, b.strides[0] // item, c,
                    a.shape[1], False)


def bind_packed(packed: Any, b: Any, c: Any, kernel: int = FP32,
                columns_outside: bool = False, columns_when_split: bool = False) -> Product:
    """``c = a @ b`` with ``packed = pack(a)``: row blocks outside (each block of A, read
    once, meets every column of B in cache), or with ``columns_outside`` B's column panels,
    read where they lie (each panel of B, read once, meets every block of A, which stays in
    L2): for a B too large to stay in L2 while each block of A walks all of it. With
    ``columns_when_split``, column panels outside only where the job runs in several parts
    (each thread then reads its own share of B rather than all of it), row blocks where it
    runs whole. With ``kernel`` `BF16`, A and B hold bf16 pairs along K (32-bit words, viewed
    as float32: `bf16.pair_rows`, `bf16.pair_columns`)."""
    from engine.kernels.gemm_ir import COLUMNS_WHEN_SPLIT  # bound only where it compiled

    k = packed.shape[1]
    walk = 1 if columns_outside else COLUMNS_WHEN_SPLIT if columns_when_split else 0
    return _product((packed, b, c), packed.ctypes.data, k, 1, packed.shape[2], b.ctypes.data,
                    1, b.strides[0] // 4, c, k, walk, kernel=kernel)


def bind_packed_columns(a: Any, packed: Any, c: Any, kernel: int = FP32,
                        depths: tuple[int, int] | None = None) -> Product:
    """``c = a @ b`` with ``packed = pack_columns(b)`` (``c`` has b's true width): column
    panels outside (each panel of B, read once, meets every row of A in cache). ``kernel``:
    as in `bind_packed`. ``depths`` (first, end): the product over that run of K alone,
    ``c = a[:, first:end] @ b[first:end]`` (`depth_split`)."""
    item = 4
    k = packed.shape[1]
    first, end = (0, k) if depths is None else depths
    if not 0 <= first < end <= k:
        raise ValueError(f"a run of K must lie within 0..{k}; got {first}..{end}")
    return _product((a, packed, c), a.ctypes.data + first * a.strides[1],
                    a.strides[0] // item, a.strides[0] // item, a.strides[1] // item,
                    packed.ctypes.data + first * packed.strides[1], k, packed.shape[2], c,
                    end - first, True, kernel=kernel)


def bind_both_packed(packed: Any, panels: Any, c: Any, kernel: int = FP32) -> Product:
    """``c = a @ b`` with ``packed = pack(a)`` and ``panels = pack_columns(b)``: column
    panels outside (a panel of B stays in cache while it meets every block of A, read from
    L2). For the bf16 kernel's activations, paired into panels as they are rounded
    (`bf16.pairing`): B read with rows far apart ran at half the speed (64×576×3136)."""
    k = packed.shape[1]
    return _product((packed, panels, c), packed.ctypes.data, k, 1, packed.shape[2],
                    panels.ctypes.data, k, panels.shape[2], c, k, True, kernel=kernel)


def bind_tiles(a: Any, b: Any, c: Any, columns_outside: bool = True,
               packed: bool = False) -> Product:
    """``c = a @ b`` on AMX: ``a`` bf16 pairs along rows, ``b`` pairs down columns (both
    float32-viewed words, C-contiguous), zero-padded a tile past their edges
    (`bf16.amx_rows`, `bf16.amx_depth`): ``a`` (rows to 32, K words to 16), ``b`` (the same
    K words, columns to 32); with ``packed``, ``a`` is `bf16.amx_pack_rows`'s tiles."""
    rows, depth = a.shape
    m, n = c.shape
    whole = AMX_TILE.rows
    if (depth % 16 or b.shape[0] != depth or rows < -(-m // whole) * whole
            or b.shape[1] < -(-n // whole) * whole):
        raise ValueError(f"AMX operands must be padded to whole tiles; got A {a.shape}, "
                         f"B {b.shape} for C {c.shape}")
    lda, acs = (16, 32) if packed else (depth, 1)
    return _product((a, b, c), a.ctypes.data, depth, lda, acs, b.ctypes.data, 1, b.shape[1],
                    c, depth, columns_outside, kernel=AMX)


def bind_tiles_batch(a: Any, b: Any, c: Any, count: int, b_rows_step: int,
                     c_step: int) -> Product:
    """``count`` AMX products ``c_i = a @ b_i`` as one job: ``a`` packed as for `bind_tiles`,
    ``b_i`` the K word rows of ``b`` from row ``i · b_rows_step`` (products may share rows),
    ``c_i`` the matrix ``c`` (the first product's) moved ``c_step`` bytes on. ``b``'s columns
    padded to 32, as `bind_tiles` reads them."""
    rows, depth = a.shape
    m, n = c.shape
    whole = AMX_TILE.rows
    if (depth % 16 or rows < -(-m // whole) * whole or b.shape[1] < -(-n // whole) * whole
            or count < 1 or (count - 1) * b_rows_step + depth > b.shape[0]
            or not b.flags.c_contiguous):
        raise ValueError(f"AMX batch operands must be padded to whole tiles and hold every "
                         f"product's rows; got A {a.shape}, B {b.shape} for {count} products "
                         f"of C {c.shape}, {b_rows_step} rows apart")
    step = b_rows_step * b.strides[0]
    return _product((a, b, c), a.ctypes.data, depth, 16, 32, b.ctypes.data, 1, b.shape[1], c,
                    depth, True, (count, 0, step, c_step), kernel=AMX)


def bind_packed_batch(packed: Any, b: Any, c: Any) -> Product:
    """``c[i] = a[i] @ b[i]`` for each i, one job over every product's tiles, with
    ``packed[i] = pack(a[i])`` (one contiguous array); ``b`` and ``c`` (batch, rows, columns)
    with contiguous rows and any step from one product to the next."""
    k = packed.shape[2]
    return _product((packed, b, c), packed.ctypes.data, k, 1, packed.shape[3], b.ctypes.data,
                    1, b.strides[1] // 4, c[0], k, False,
                    (len(c), packed.strides[0], b.strides[0], c.strides[0]))


def bind_packed_columns_batch(a: Any, panels: Any, c: Any) -> Product:
    """``c[i] = a[i] @ b[i]`` for each i, one job over every product's tiles, with
    ``panels[i] = pack_columns(b[i])`` (one contiguous array); ``a`` and ``c`` (batch, rows,
    columns) with contiguous rows of C, any strides in A and any step from one product to
    the next. Winograd's 16 products of a layer as one call: the panels stream in one pass,
    product after product, in the order they lie."""
    item = 4
    k = panels.shape[2]
    if (panels.shape[0] != len(a) or len(c) != len(a) or a.shape[2] != k
            or c.shape[1] != a.shape[1] or c.shape[2] > panels.shape[1] * panels.shape[3]):
        raise ValueError(f"a batch of products needs A (batch, M, K), panels (batch, panels, "
                         f"K, NR) and C (batch, M, N); got A {a.shape}, panels {panels.shape}, "
                         f"C {c.shape}")
    return _product((a, panels, c), a.ctypes.data, a.strides[1] // item, a.strides[1] // item,
                    a.strides[2] // item, panels.ctypes.data, k, panels.shape[3], c[0], k,
                    True, (len(c), a.strides[0], panels.strides[0], c.strides[0]))


def multiply(a: Any, b: Any, c: Any) -> None:
    """`bind` and run once."""
    bind(a, b, c)()


def _product(operands: tuple[Any, ...], a: int, row_step: int, lda: int, acs: int, b: int,
             column_step: int, ldb: int, c: Any, k: int, columns_outside: bool,
             batch: tuple[int, int, int, int] = (1, 0, 0, 0), kernel: int = FP32) -> Product:
    """A Product of one matrix ``c``, or of a ``batch`` of them (count, then the bytes from
    one's A, B and C to the next's), by ``kernel`` (the bf16 ones: K counts pairs)."""
    shape = _compiled(kernel)["tile"]
    # No bias yet: zeros enough for C's rows and columns, rounded up to whole tiles.
    zeros = np.zeros(max(-(-c.shape[0] // shape.rows) * shape.rows,
                         -(-c.shape[1] // shape.columns) * shape.columns), np.float32)
    context = _context(shape, a, row_step, lda, acs, b, column_step, ldb, c, k,
                       columns_outside, zeros.ctypes.data)
    context[_BATCH:_C_BATCH + 1] = batch
    context[_KERNEL] = kernel
    return _as_product(context, (*operands, zeros))


def _context(shape: Tile, a: int, row_step: int, lda: int, acs: int, b: int,
             column_step: int, ldb: int, c: Any, k: int, columns_outside: bool,
             zeros: int) -> np.ndarray:
    """A product's context (the fields above), no bias (``zeros``: the address of enough zeros)."""
    context = np.array([shape.rows, shape.columns, a, row_step, lda, acs, b, column_step, ldb,
                        c.ctypes.data, c.strides[0] // 4, zeros, zeros, 0, 0, c.shape[0],
                        c.shape[1], k, columns_outside, 1, 0, 0, 0, 0, 0], np.int64)
    context[_BOUNDS].view(np.float64)[:] = -np.inf, np.inf
    return context


def _as_product(context: np.ndarray, operands: tuple[Any, ...]) -> Product:
    m, n, k, batch = (int(context[i]) for i in (_M, _N, _K, _BATCH))
    rows = -(-m // int(context[_MR])) * int(context[_MR])
    tiles = batch * rows // int(context[_MR]) * -(-n // int(context[_NR]))
    # Work counted over whole tiles: a tile of one row takes about as long as a full one (its
    # multiply-adds wait on each other), so a batch-1 product is cut as finely.
    parts = min(tiles, max(1, batch * rows * n * k // PART_MACS),
                spin_pool.PARTS_PER_CORE * spin_pool.cores())
    job = spin_pool.job(_compiled(int(context[_KERNEL]))["part"], context, parts)
    product = Product(job.func, *job.args)
    product.context, product.operands = context, (*operands, *job.keep)
    return product


def _compiled(kernel: int = FP32) -> dict[str, Any] | None:
    return compiled.made_once(_state, kernel, partial(_compile, kernel=kernel))


def _compile(cpu: str | None = None, features: str | None = None,
             kernel: int = FP32) -> dict[str, Any] | None:
    """The kernels for the host CPU, or for ``cpu`` with ``features`` (LLVM's names: a test
    compiles the AVX2 and SSE tiles on a host that runs them); the bf16 kernels are None
    where the host lacks AVX-512 BF16, AMX's where it lacks AMX or Linux's grant."""
    try:
        import llvmlite.binding as llvm

        from engine.cpu.llvm_jit import compile_ir
        from engine.kernels.gemm_amx_ir import AmxTileKernel
        from engine.kernels.gemm_avx2_ir import Avx2TileKernel
        from engine.kernels.gemm_bf16_ir import PairTileKernel
        from engine.kernels.gemm_ir import NarrowEdgeTileKernel
    except ImportError:
        return None
    if kernel != FP32 and not host_features.bf16_dot_product():
        return None
    if kernel == AMX and not host_features.amx_permitted():
        return None
    try:
        llvm.initialize_native_target()
        if cpu is None:
            cpu, host = llvm.get_host_cpu_name(), llvm.get_host_cpu_features()
            shape, features = _tile_for(host), host.flatten()
        else:
            shape = _tile_for({name[1:]: True for name in features.split(",")
                               if name.startswith("+")})
        if kernel == AMX:
            shape = AMX_TILE
        kernels = {FP32: Avx2TileKernel if shape == AVX2_TILE else NarrowEdgeTileKernel,
                   BF16: PairTileKernel, AMX: AmxTileKernel}
        tiles = kernels[kernel](shape)
        tiles.define_part("part", tiles.define_full("tile_full"), tiles.define_edge("tile_edge"),
                          CONTEXT_FIELDS)
        engine = compile_ir(str(tiles.module), cpu, features, level=3, optimise=True,
                            kept=True)
    except (RuntimeError, OSError, ValueError):  # no JIT for this target, or no bf16 tile
        return None
    # The execution engine owns the machine code: it lives as long as the kernels.
    return {"tile": shape, "side_columns": tiles.sides(), "engine": engine,
            "part": engine.get_function_address("part")}


def _tile_for(features: Any) -> Tile:
    """The register tile for the host's widest float SIMD (see the module docstring)."""
    if features.get("avx512f"):
        return Tile(12, 16, 2)
    if features.get("avx2") and features.get("fma"):
        return AVX2_TILE
    if platform.machine().lower() in ("arm64", "aarch64"):
        return Tile(6, 4, 4)
    return Tile(4, 4, 2)
