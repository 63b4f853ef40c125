"""A float32 GEMM of our own: register-tile micro-kernels in LLVM IR, driven by numba.

Why not OpenBLAS for everything: at a network's shapes at small batches (few columns, weights
read once per call) numpy's OpenBLAS packs both operands on every call, and its kernels run
below ONNX Runtime's MLAS at the same shapes (one thread, Zen 4, warm: 64×512×256 1.11× MLAS's
time, 784×576×128 1.10×, 49×4608×512 1.29×; `bench/gemm.py`). Here the weights are packed once,
when a plan binds, into the order the micro-kernel reads them (`pack`), and the activations are
read where they lie: the micro-kernel keeps an ``MR × NR`` tile of C in vector registers for
the whole K loop, reading ``MR`` scalars of A (broadcast) and ``NR`` contiguous floats of B per
step. numba cannot be made to keep such a tile in registers (it spills it to memory, 7 GFLOP/s
against OpenBLAS's 100), so the kernels are LLVM IR (`gemm_ir`) compiled with `llvmlite`,
numba's own dependency, for the host CPU once per process; a driver compiled by numba without
the GIL walks the tiles (`_driver`). Measured at the benchmark networks' products
(`bench/gemm.py`, one thread, Zen 4, warm): ours 1.00–1.05× MLAS's time, OpenBLAS 1.00–1.39×.

Tiles by vector ISA (registers: accumulators + a row of B + the broadcast):
AVX-512 12 × 32 (24 + 2 + 1 of 32 zmm), AVX2 with FMA 6 × 16 (12 + 2 + 1 of 16 ymm), 64-bit
ARM's NEON 6 × 16 (24 + 4 + 1 of 32), else 4 × 8.

`available()` is False where llvmlite or numba cannot be imported or the JIT fails: callers
then keep NumPy's matmul.
"""

from __future__ import annotations

import ctypes
import platform
import threading
from functools import partial
from typing import Any, NamedTuple

import numpy as np

_state: dict[str, Any] = {}
_compiling = threading.Lock()


class Tile(NamedTuple):
    """The register tile: ``rows`` of A by ``vectors`` SIMD vectors of ``width`` floats."""

    rows: int
    width: int
    vectors: int

    @property
    def columns(self) -> int:
        return self.width * self.vectors


def available() -> bool:
    """Whether the kernels compiled for this CPU (compiled on the first call)."""
    return _compiled() is not None


def tile() -> Tile:
    """The tile the kernels were compiled for."""
    kernels = _compiled()
    if kernels is None:
        raise RuntimeError("the GEMM kernels are not available on this machine")
    return kernels["tile"]


def pack(a: Any) -> np.ndarray:
    """``a`` (M, K) float32 as the micro-kernel reads A: blocks of MR rows, each (K, MR)
    (row block-major, then k, then row), the last block padded with zero rows."""
    rows = tile().rows
    m, k = a.shape
    blocks = -(-m // rows)
    packed = np.zeros((blocks * rows, k), np.float32)
    packed[:m] = a
    return np.ascontiguousarray(packed.reshape(blocks, rows, k).transpose(0, 2, 1))


def pack_columns(b: Any) -> np.ndarray:
    """``b`` (K, N) float32 as the micro-kernel reads B: panels of NR columns, each (K, NR)
    contiguous, the last padded with zero columns. A panel streams from memory in order, where
    an unpacked one is NR floats from each of K rows far apart (the 16 products of ResNet-18's
    512-channel Winograd layer, weights cold: 3.67 ms unpacked, 1.60 packed, BLAS 2.62)."""
    columns = tile().columns
    k, n = b.shape
    panels = -(-n // columns)
    packed = np.zeros((k, panels * columns), np.float32)
    packed[:, :n] = b
    return np.ascontiguousarray(packed.reshape(k, panels, columns).transpose(1, 0, 2))


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
    """``c = clip(a @ b + bias, low, high)`` bound once: the compiled driver with the operands'
    addresses and strides worked out (a call costs 0.5 µs, against 7 µs reading them from the
    arrays each time). ``operands`` keeps the arrays, and so the addresses, alive."""

    operands: tuple[Any, ...]

    def with_epilogue(self, bias_rows: Any = None, bias_columns: Any = None,
                      low: float = -np.inf, high: float = np.inf) -> Product:
        """This product adding a bias per row of C and/or per column, and clamped to
        [low, high] (narrowing the bounds it has). A bias is read where it lies at every
        run (it may be an input's buffer): float32 and contiguous (`takes_bias`)."""
        args = list(self.args)
        kept = list(self.operands)
        for position, bias, size in ((_ROWS_BIAS, bias_rows, args[_M]),
                                     (_COLUMNS_BIAS, bias_columns, args[_N])):
            if bias is not None:
                if not takes_bias(bias) or bias.size < size:
                    raise ValueError(f"a fused bias must be float32, contiguous and hold "
                                     f"{size} values")
                args[position] = bias.ctypes.data
                kept.append(bias)
        args[_LOW] = max(args[_LOW], float(low))
        args[_HIGH] = min(args[_HIGH], float(high))
        product = Product(self.func, *args)
        product.operands = tuple(kept)
        return product


def takes_bias(bias: Any) -> bool:
    """Whether `Product.with_epilogue` can read this bias where it lies."""
    return (type(bias) is np.ndarray and bias.dtype == np.float32
            and bias.flags.c_contiguous)


# Positions in a Product's arguments (see `_driver`).
_ROWS_BIAS, _COLUMNS_BIAS, _LOW, _HIGH, _M, _N = 11, 12, 13, 14, 15, 16


def bind(a: Any, b: Any, c: Any) -> Product:
    """``c = a @ b``: ``a`` (M, K) with any strides (see `applies`)."""
    item = 4
    return _product((a, b, c), a.ctypes.data, a.strides[0] // item, a.strides[0] // item,
                    a.strides[1] // item, b.ctypes.data, 1, b.strides[0] // item, c,
                    a.shape[1], False)


def bind_packed(packed: Any, b: Any, c: Any) -> Product:
    """``c = a @ b`` with ``packed = pack(a)``: row blocks outside (each block of A, read
    once, meets every column of B in cache)."""
    k = packed.shape[1]
    return _product((packed, b, c), packed.ctypes.data, k, 1, packed.shape[2], b.ctypes.data,
                    1, b.strides[0] // 4, c, k, False)


def bind_packed_columns(a: Any, packed: Any, c: Any) -> Product:
    """``c = a @ b`` with ``packed = pack_columns(b)`` (``c`` has b's true width): column
    panels outside (each panel of B, read once, meets every row of A in cache)."""
    item = 4
    k = packed.shape[1]
    return _product((a, packed, c), a.ctypes.data, a.strides[0] // item, a.strides[0] // item,
                    a.strides[1] // item, packed.ctypes.data, k, packed.shape[2], c, k, True)


def multiply(a: Any, b: Any, c: Any) -> None:
    """`bind` and run once."""
    bind(a, b, c)()


def _product(operands: tuple[Any, ...], a: int, row_step: int, lda: int, acs: int, b: int,
             column_step: int, ldb: int, c: Any, k: int, columns_outside: bool) -> Product:
    kernels = _compiled()
    shape = kernels["tile"]
    # No bias yet: zeros enough for C's rows and columns, rounded up to whole tiles.
    zeros = np.zeros(max(-(-c.shape[0] // shape.rows) * shape.rows,
                         -(-c.shape[1] // shape.columns) * shape.columns), np.float32)
    product = Product(kernels["drive"], shape.rows, shape.columns, a, row_step, lda, acs, b,
                      column_step, ldb, c.ctypes.data, c.strides[0] // 4, zeros.ctypes.data,
                      zeros.ctypes.data, -np.inf, np.inf, c.shape[0], c.shape[1], k,
                      columns_outside)
    product.operands = (*operands, zeros)
    return product


def _compiled() -> dict[str, Any] | None:
    if "kernels" not in _state:
        with _compiling:  # plans may bind on several threads at once: compile once
            if "kernels" not in _state:
                _state["kernels"] = _compile()
    return _state["kernels"]


def _compile(cpu: str | None = None, features: str | None = None) -> dict[str, Any] | None:
    """The kernels for the host CPU, or for ``cpu`` with ``features`` (LLVM's names: a test
    compiles the AVX2 and SSE tiles on a host that runs them)."""
    try:
        import llvmlite.binding as llvm
        from numba import njit

        from engine.ops.gemm_ir import TileKernel
    except ImportError:
        return None
    try:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        if cpu is None:
            cpu, host = llvm.get_host_cpu_name(), llvm.get_host_cpu_features()
            shape, features = _tile_for(host), host.flatten()
        else:
            shape = _tile_for({name[1:]: True for name in features.split(",")
                               if name.startswith("+")})
        machine = llvm.Target.from_default_triple().create_target_machine(
            cpu=cpu, features=features, opt=3)
        kernel = TileKernel(shape)
        kernel.define_full("tile_full")
        kernel.define_edge("tile_edge")
        module = llvm.parse_assembly(str(kernel.module))
        module.verify()
        builder = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(3))
        builder.getModulePassManager().run(module, builder)
        engine = llvm.create_mcjit_compiler(module, machine)
        engine.finalize_object()
    except (RuntimeError, OSError):  # no JIT for this target
        return None
    pointer = ctypes.c_void_p
    signature = [ctypes.c_int64, pointer, ctypes.c_int64, ctypes.c_int64, pointer,
                 ctypes.c_int64, pointer, ctypes.c_int64, pointer, pointer, ctypes.c_float,
                 ctypes.c_float]
    full = ctypes.CFUNCTYPE(None, *signature)(engine.get_function_address("tile_full"))
    edge = ctypes.CFUNCTYPE(None, *signature, ctypes.c_int64, ctypes.c_int64)(
        engine.get_function_address("tile_edge"))
    # The execution engine owns the machine code: it lives as long as the functions.
    return {"tile": shape, "full": full, "edge": edge, "engine": engine,
            "drive": _driver(njit, full, edge)}


def _tile_for(features: Any) -> Tile:
    """The register tile for the host's widest float SIMD (see the module docstring)."""
    if features.get("avx512f"):
        return Tile(12, 16, 2)
    if features.get("avx2") and features.get("fma"):
        return Tile(6, 8, 2)
    if platform.machine().lower() in ("arm64", "aarch64"):
        return Tile(6, 4, 4)
    return Tile(4, 4, 2)


def _driver(njit: Any, full: Any, edge: Any) -> Any:
    """`_tile`'s loops compiled by numba without the GIL, the tile kernels bound in (a
    ctypes function passed as an argument costs microseconds to unbox at every call)."""
    tile = njit(nogil=True, inline="always")(_tile)

    def drive(mr: int, nr: int, a: int, row_step: int, lda: int, acs: int, b: int,
              column_step: int, ldb: int, c: int, ldc: int, bias_rows: int, bias_columns: int,
              low: float, high: float, m: int, n: int, k: int,
              columns_outside: bool) -> None:  # pragma: no cover - runs compiled
        # Addresses in bytes, strides in floats. Row r of A starts at a + r·row_step
        # (unpacked: its row stride; packed: K, a block of MR rows being K·MR floats),
        # column j of B at b + j·column_step (unpacked: 1; packed: K, likewise).
        if columns_outside:
            for column in range(0, n, nr):
                for row in range(0, m, mr):
                    tile(full, edge, mr, nr, a, row_step, lda, acs, b, column_step, ldb, c,
                         ldc, bias_rows, bias_columns, low, high, m, n, k, row, column)
        else:
            for row in range(0, m, mr):
                for column in range(0, n, nr):
                    tile(full, edge, mr, nr, a, row_step, lda, acs, b, column_step, ldb, c,
                         ldc, bias_rows, bias_columns, low, high, m, n, k, row, column)

    return njit(nogil=True)(drive)


def _tile(full: Any, edge: Any, mr: int, nr: int, a: int, row_step: int, lda: int, acs: int,
          b: int, column_step: int, ldb: int, c: int, ldc: int, bias_rows: int,
          bias_columns: int, low: float, high: float, m: int, n: int, k: int, row: int,
          column: int) -> None:  # pragma: no cover - runs compiled
    """One tile at (row, column) of C: the whole-tile kernel, or the edge kernel."""
    a_row, b_column = a + row * row_step * 4, b + column * column_step * 4
    c_corner = c + (row * ldc + column) * 4
    rows_bias, columns_bias = bias_rows + row * 4, bias_columns + column * 4
    rows, columns = min(mr, m - row), min(nr, n - column)
    if rows == mr and columns == nr:
        full(k, a_row, lda, acs, b_column, ldb, c_corner, ldc, rows_bias, columns_bias, low,
             high)
    else:
        edge(k, a_row, lda, acs, b_column, ldb, c_corner, ldc, rows_bias, columns_bias, low,
             high, rows, columns)
