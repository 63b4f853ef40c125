"""A bf16 convolution on AMX that reads its input once: no im2col matrix.

The im2col form (`gemm_bind.bf16_patch_product`) pairs a K = C·kh·kw row matrix on every
run: for a 3×3 convolution nine copies of the input. Here the input is paired once
(`bf16.patch_pairing`) into a grid of words (channel pairs × images × bordered rows × ``Wp``),
whose borders are zeroed once, when the plan binds: the padding. Tap (kh, kw) of output
column ``y·Wp + x`` reads the grid ``kh·Wp + kw`` words on, so the product (`conv_amx_ir`)
walks the taps over the one grid, the weights packed with K in that order (tap, channel)
once per model. It computes ``Wp`` columns per output row of ``W`` and drops the rest as it
stores.

Stride 1, any padding and dilation, group 1; `DirectProduct` takes a bias per filter and a
clamp as `gemm_kernel.Product` does (`gemm_bind.with_bias`, `gemm_bind.clamped`).
"""

from __future__ import annotations

import math
import threading
from functools import partial
from typing import Any

import numpy as np

from engine.cpu import host_features, spin_pool
from engine.kernels import bf16, gemm_bind, gemm_kernel

_state: dict[str, Any] = {}
_compiling = threading.Lock()
# The context's int64s (addresses in bytes, strides in words or floats): the packed weights,
# the grid and its plane stride, the output and its row stride, the biases, the bounds (two
# float64s), the filters, the grid columns per image, words per tap, the taps and their
# offsets' address, the grid's and the output's widths, the images and the bytes from one
# image's grid and output to the next.
_FIELD = {name: index for index, name in enumerate((
    "a", "b", "ldb", "c", "ldc", "rows_bias", "columns_bias", "low", "high", "m", "n",
    "words", "taps", "offsets", "grid_width", "width", "batch", "b_batch", "c_batch"))}
TILE = 32  # filters and grid columns per AMX tile (`gemm_amx_ir`)
WORDS = 16  # channel pairs per step of K
# Work per part at least, in tiles: a tile over a 64-channel 3×3 layer is about 1 µs.
PART_TILES = 8
_enabled = [True]  # bench and tests turn the direct form off to compare (`enabled`)


def available() -> bool:
    """Whether the direct kernel compiled for this host (AMX permitted, llvmlite present)."""
    return _compiled() is not None


def enabled(on: bool) -> None:
    """Let `applies` take convolutions (the default) or send them all to im2col."""
    _enabled[0] = on


def applies(data: Any, weight: Any, out: Any, geometry: Any, workspace: Any) -> bool:
    """Whether `bind` takes this convolution: a bf16 plan on AMX, float32 NumPy arrays, the
    input C-contiguous, the weight a read-only constant, a 2-D kernel at stride 1."""
    kernel, stride, dilate, pad = geometry
    return (all(type(x) is np.ndarray and x.dtype == np.float32 for x in (data, weight, out))
            and data.ndim == 4 and out.ndim == 4 and data.flags.c_contiguous
            and out.flags.c_contiguous and not weight.flags.writeable
            and weight.nbytes <= gemm_bind.PACK_LIMIT_BYTES and len(kernel) == 2
            and math.prod(kernel) > 1 and tuple(stride) == (1, 1) and _enabled[0]
            and weight.shape[1] == data.shape[1]
            and not np.may_share_memory(out, data)
            and gemm_bind.bf16_kernel(workspace, out.shape[1]) == gemm_kernel.AMX
            and available())


def bind(data: Any, weight: Any, out: Any, geometry: Any, workspace: Any) -> bf16.PairedProduct:
    """``out = conv(data, weight)`` (N, C, H, W) → (N, F, Ho, Wo): the input paired into
    its grid, then the direct product, as one call (see `applies`)."""
    kernel, _, dilate, pad = geometry
    batch, channels, height, width = data.shape
    filters, out_height, out_width = out.shape[1:]
    grid_height, grid_width = height + 2 * pad[0], width + 2 * pad[1]
    if (out_height, out_width) != (grid_height - dilate[0] * (kernel[0] - 1),
                                   grid_width - dilate[1] * (kernel[1] - 1)):
        raise ValueError(f"convolution output {out.shape} does not match input {data.shape} "
                         f"with kernel {kernel}, dilation {dilate} and padding {pad}")
    pairs = -(-channels // 2)
    words = -(-pairs // WORDS) * WORDS  # channel pairs, padded to a step of K
    offsets = np.array([row * dilate[0] * grid_width + column * dilate[1]
                        for row in range(kernel[0]) for column in range(kernel[1])], np.int64)
    columns = (out_height - 1) * grid_width + out_width  # the flattened grid's last pixel + 1
    image = grid_height * grid_width
    # Reads run a tile past the last column, the largest tap on.
    plane = _plane_stride((batch - 1) * image + -(-columns // TILE) * TILE + int(offsets[-1]))
    grid = workspace.zeroed((words, plane), np.float32, ("bf16 grid", data.shape, tuple(pad)))
    into = (np.arange(batch)[:, None] * image + (np.arange(height)[None, :] + pad[0])
            * grid_width + pad[1]).reshape(-1)
    pair = bf16.patch_pairing(data.transpose(1, 0, 2, 3), 1, grid, into)
    if pair is None:
        raise ValueError("the bf16 pairing pass did not compile")
    tiles = workspace.derived(weight, ("amx direct", words),
                              partial(_weight_tiles, words=words))
    zeros = np.zeros(-(-max(filters, columns) // TILE) * TILE + TILE, np.float32)
    context = np.zeros(len(_FIELD), np.int64)
    values = {"a": tiles.ctypes.data, "b": grid.ctypes.data, "ldb": plane,
              "c": out.ctypes.data, "ldc": out_height * out_width,
              "rows_bias": zeros.ctypes.data, "columns_bias": zeros.ctypes.data,
              "m": filters, "n": columns, "words": words, "taps": offsets.size,
              "offsets": offsets.ctypes.data, "grid_width": grid_width, "width": out_width,
              "batch": batch, "b_batch": image * 4, "c_batch": out.strides[0]}
    for name, value in values.items():
        context[_FIELD[name]] = value
    context[_FIELD["low"]:_FIELD["high"] + 1].view(np.float64)[:] = -np.inf, np.inf
    product = _as_product(context, (tiles, grid, out, zeros, offsets))
    return bf16.paired_product(pair, product)


def _plane_stride(words: int) -> int:
    """A plane's words: ``words`` rounded up to a cache line, and an odd number of lines,
    so that a tile's 16 rows of B do not all fall in one cache set."""
    lines = -(-words // WORDS)
    return (lines + 1 - lines % 2) * WORDS


def _weight_tiles(weight: Any, words: int) -> np.ndarray:
    """The weight (F, C, kh, kw) as AMX's packed A with K ordered (tap, channel), each tap's
    channels padded to ``words`` pairs with zeros."""
    filters, channels = weight.shape[:2]
    taps = math.prod(weight.shape[2:])
    ordered = np.zeros((filters, taps, 2 * words), np.float32)
    ordered[:, :, :channels] = weight.reshape(filters, channels, taps).transpose(0, 2, 1)
    return bf16.amx_pack_rows(bf16.amx_weight_rows(ordered.reshape(filters, -1)))


class DirectProduct(partial):
    """The direct product bound once: a `spin_pool.Job` over its tiles. Like a
    `gemm_kernel.Product` it takes a bias per filter and a clamp (`with_epilogue`)."""

    context: np.ndarray
    operands: tuple[Any, ...]
    leaves_blas_alone = True  # its tiles run on the spin pool, never in BLAS

    def with_epilogue(self, bias_rows: Any = None, bias_columns: Any = None,
                      low: float = -np.inf, high: float = np.inf) -> DirectProduct:
        """This product adding ``bias_rows`` (one per filter: float32, contiguous) and
        clamped to [low, high] (narrowing the bounds it has). A bias per column has no
        place in a convolution."""
        if bias_columns is not None:
            raise ValueError("a direct convolution takes a bias per filter, not per column")
        context = self.context.copy()
        kept = list(self.operands)
        if bias_rows is not None:
            if not gemm_kernel.takes_bias(bias_rows) or bias_rows.size < context[_FIELD["m"]]:
                raise ValueError(f"a fused bias must be float32, contiguous and hold "
                                 f"{context[_FIELD['m']]} values")
            context[_FIELD["rows_bias"]] = bias_rows.ctypes.data
            kept.append(bias_rows)
        bounds = context[_FIELD["low"]:_FIELD["high"] + 1].view(np.float64)
        bounds[:] = max(bounds[0], float(low)), min(bounds[1], float(high))
        return _as_product(context, tuple(kept))


def _as_product(context: np.ndarray, operands: tuple[Any, ...]) -> DirectProduct:
    batch, filters, columns = (int(context[_FIELD[name]]) for name in ("batch", "m", "n"))
    tiles = batch * -(-filters // TILE) * -(-columns // TILE)
    parts = min(max(1, tiles // PART_TILES), spin_pool.PARTS_PER_CORE * spin_pool.cores())
    job = spin_pool.job(_compiled()["part"], context, parts)
    product = DirectProduct(job.func, *job.args)
    product.context, product.operands = context, (*operands, *job.keep)
    return product


def _compiled() -> dict[str, Any] | None:
    if "kernel" not in _state:
        with _compiling:  # plans may bind on several threads at once: compile once
            if "kernel" not in _state:
                _state["kernel"] = _compile()
    return _state["kernel"]


def _compile() -> dict[str, Any] | None:
    """The direct kernel for the host, or None without AMX (or Linux's grant) or llvmlite."""
    if not host_features.amx_permitted():
        return None
    try:
        import llvmlite.binding as llvm

        from engine.cpu.llvm_jit import compile_ir
        from engine.kernels.conv_amx_ir import module
    except ImportError:
        return None
    try:
        llvm.initialize_native_target()
        engine = compile_ir(str(module(_FIELD)), llvm.get_host_cpu_name(),
                            llvm.get_host_cpu_features().flatten(), level=3, optimise=True)
    except (RuntimeError, OSError):
        return None
    # The execution engine owns the machine code: it lives as long as the kernel.
    return {"engine": engine, "part": engine.get_function_address("part")}

