"""Stride-1 3×3 convolution bound into a plan as Winograd F(2×2, 3×3), or F(4×4, 3×3) compiled.

The im2col + sgemm path already runs 3×3 convolutions near the GEMM's own speed, so only fewer
flops can make them faster. F(2×2, 3×3) computes each 2×2 output tile from a 4×4 input tile ``d``
as ``Y = Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A``: 16 multiplies per tile and (input, output) channel pair
instead of 36. Summed over input channels, the 16 elementwise products become 16 GEMMs
``M[ξ] = V[ξ] @ U[ξ]`` of the transformed tiles V (tiles, C) and transformed weights U (C, F).

U is computed once, when the first plan binds the layer, and shared by the model's plans (see
`Workspace.derived`); that is only valid for weights that never change: plans hand out their
constants read-only, and only read-only weights qualify. The transforms are ufuncs over
strided views (rows, then columns) into the plan's scratch, so a run allocates nothing. They run
channels-last, after one transposing copy in and one out: channels-first, their innermost runs
would be half a row of tiles (4 to 28 cells) and cost as much as the GEMMs save.

Where numba is installed, `winograd_kernel`'s compiled transforms run instead, channels-first,
one call per layer whose epilogue takes the bias, a residual sum and the clamp (the NumPy
transforms stay for hosts without numba); with tiles enough (`F4_MIN_TILES`) as F(4×4, 3×3):
36 products per 4×4 output tile from 6×6 input tiles, U = G₄ g G₄ᵀ. Its larger coefficients
(up to 8) did not cost float32 accuracy that shows (ResNet-18 at 224² against the reference
interpreter: max |diff| 4.6e-4 of outputs up to 688, F(2×2) 5.8e-4; MXNet's own BasicBlockV1
export within its tolerance). A NaN input reaches every output of the 4×4 tiles whose 6×6
input tiles hold it, not only its 3×3 neighbours.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from engine.cpu import compiled, host_features
from engine.kernels import conv_bind, gemm_bind, gemm_kernel, winograd_kernel
from engine.kernels.conv_bind import Geometry
from engine.kernels.im2col import Ints
from engine.kernels.workspace import aligned

G = np.array(  # the weight transform of F(2×2, 3×3) (Lavin and Gray, 2015)
    [[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])
G_4 = np.array(  # and of F(4×4, 3×3), interpolating at 0, ±1, ±2 (ibid.)
    [[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
     [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]])

# Where Winograd measured faster (bench/winograd.py, one thread). The transforms cost per
# channel and the GEMMs per channel pair: below 64 channels the saving hardly pays for them
# (32: ≤ 1.12×, 16: 0.88×). With few tiles (GEMM rows) the GEMMs are bound by reading U,
# 16/9 the size of the weights. At 32 tiles: 256×4 1.34×, 128×8 1.22×, 256×7 1.05×, 512×7
# 0.97×; at 16: 256×4 1.01×, 512×7 1.0×, 256×7 0.8× (ResNet-18 at 64×64, batch 8: +8%).
# Measured again inside a network (weights evicted from the cache between calls, as a run
# leaves them; Zen 4, one thread, 2026-11-25), 16 tiles pay: 512×7 1.17×, 256×8 1.18×,
# 128×7 1.14×, 256×7 1.02×; ResNet-18 at 224², batch 1, 36.8 → 36.0 ms (its three 512×7).
MIN_CHANNELS = 64
MIN_TILES = 16
# Samples are taken enough at a time for this many tiles (GEMM rows): fewer re-read U (16/9 of
# the weights) too often, more spill the cache; measured on ResNet-18's layers at batch 8.
CHUNK_TILES = 128
# The compiled transforms run F(4×4, 3×3) from this many 4×4 tiles (over the batch): 36
# products per tile of 16 outputs against F(2×2)'s 16 per 4, 1.8× fewer multiply-adds and
# intermediates, though U is 36/9 of the weights and read for fewer tiles. ResNet-18, whole
# networks A/B in one process (Zen 4): batch 1 one thread 28.8 → 26.2 ms, two 16.6 → 15.4; batch
# 4 one thread 110 → 101, two 58.7 → 52.4 (from 49 tiles); from 16 (adds 256 × 14² at batch 1,
# 512 × 7² at 4) 2–5% more; from 4 (512 × 7² at batch 1, U 38 MB) 17% slower.
F4_MIN_TILES = 16
# The input transform writes its α² ξ rows of tiles side by side. On a host with an 8-way L1
# (AMD Zen 3, AVX2), rows a multiple of 1 KiB apart fall into 4 or fewer of the L1's 64 sets
# and evict each other. There the rows lie an odd number of lines apart, every row in a set of
# its own (`tiles_row`). ResNet-50 v2 at batch 1, one thread, one process, interleaved (best of
# 30): F(4×4) input transform of 256 × 14² (rows 4096 cells, one set) 0.36 → 0.27 ms, F(2×2)
# of 512 × 7² 0.21 → 0.15, 64 × 56² 0.59-0.68 → 0.55-0.57 (its GEMM and output transform
# 0.02-0.06 slower: even), 128 × 28² (8 sets) unchanged. AVX-512 hosts keep the rows unpadded
# (Zen 4, 12-way L1: the input transform measured 0.40 ms unpadded and 0.47 padded).
LINE_CELLS = 16  # float32 cells in a 64-byte cache line


@dataclass(frozen=True)
class _Layout:
    """Scratch regions, channels-last, for a chunk of ``chunk`` samples (T = th·tw tiles each).

    Three regions, each reused by the output side once the input side is done with it: row
    combinations (4, n, th, Wp, C) then (2, 4, n, th, tw, F); tiles V (16, n, th, tw, C) then
    the output Y (n, 2th, 2tw, F); products M (16, n, th, tw, F).
    """

    chunk: int
    sizes: Ints  # elements of each region

    def offsets(self, itemsize: int) -> tuple[int, int, int]:
        """Byte offsets of the second and third regions, and the total bytes."""
        second = aligned(self.sizes[0] * itemsize)
        third = second + aligned(self.sizes[1] * itemsize)
        return second, third, third + self.sizes[2] * itemsize


def _tile_counts(data_shape: Ints, pad: Ints, m: int = 2) -> Ints:
    """(th, tw): m×m output tiles down and across, the last ones cropped where m does not
    divide the output."""
    return tuple(-(-(size + 2 * p - 2) // m) for size, p in zip(data_shape[2:], pad))


def _layout(data_shape: Ints, filters: int, pad: Ints) -> _Layout:
    batch, channels = data_shape[:2]
    th, tw = _tile_counts(data_shape, pad)
    tiles = th * tw
    per_sample = (max(4 * th * (2 * tw + 2) * channels, 8 * tiles * filters),
                  max(16 * tiles * channels, 4 * tiles * filters), 16 * tiles * filters)
    chunk = max(1, min(batch, -(-CHUNK_TILES // tiles)))
    return _Layout(chunk, tuple(chunk * size for size in per_sample))


def fits(data_shape: Ints, filters: int, geometry: Geometry) -> bool:
    """A stride-1, undilated 3×3 2-D convolution of a shape where Winograd measured faster."""
    kernel, stride, dilate, pad = geometry
    if kernel != (3, 3) or stride != (1, 1) or dilate != (1, 1):
        return False
    return (min(data_shape[1], filters) >= MIN_CHANNELS
            and data_shape[0] * math.prod(_tile_counts(data_shape, pad)) >= MIN_TILES)


def applies(data_shape: Ints, weight: Any, geometry: Geometry) -> bool:
    """`fits`, with a float32 weight that is a read-only plan constant (U is computed once)."""
    # Exactly numpy's array: a device array has no ``writeable`` flag (and no Winograd here).
    return (type(weight) is np.ndarray and weight.dtype == np.float32
            and not weight.flags.writeable and fits(data_shape, weight.shape[0], geometry))


def scratch_bytes(data_shape: Ints, filters: int, geometry: Geometry, itemsize: int) -> int:
    """Bytes of plan scratch the bound Winograd convolution needs (either binding)."""
    pad = geometry[3]
    return max(_layout(data_shape, filters, pad).offsets(itemsize)[2],
               _compiled_bytes(data_shape, filters, pad, itemsize))


def bind(xp: Any, data: Any, weight: Any, bias: Any, out: Any, geometry: Geometry,
         workspace: Any) -> list[Callable[[], Any]]:
    """Calls computing ``out = conv(data, weight) + bias`` (3×3, stride 1, float32). A bf16
    plan runs our bf16 GEMM over the patches instead (`conv_bind`) where that GEMM is faster
    than Winograd's fewer multiplications in float32: on AMX, and on AVX-512 BF16 where its
    tile runs at twice float32's rate (`gemm_kernel.bf16_tile_pays`: ResNet-18 at batch 1 on
    one Zen 5 core 10.9 ms against 14.0 with Winograd). Where it issues at a third of the
    FMA's rate (the Intel Xeon measured), Winograd stays."""
    kernel = gemm_bind.bf16_kernel(workspace, out.shape[1])
    if kernel == gemm_kernel.AMX or (kernel == gemm_kernel.BF16
                                     and gemm_kernel.bf16_tile_pays()):
        return conv_bind.bind(xp, data, weight, bias, out, geometry, workspace)
    # Compiled whatever the layer's width: on narrow layers too its three jobs beat NumPy's 44
    # passes of views (a job each while armed), and its output transform adds the residual the
    # NumPy one leaves to a pass of its own. One thread, weights cold, F(2×2): 512 × 7² at
    # batch 1 2.09 against 2.85 ms, batch 3 4.09 against 5.11; 64 × 7² 0.14 against 0.29.
    if compiled.available():
        return [_bind_compiled(data, weight, bias, out, geometry, workspace)]
    batch, channels, height, width = data.shape
    filters = out.shape[1]
    pad = geometry[3]
    th, tw = _tile_counts(data.shape, pad)
    # Tagged with the input size too: 7 and 8 rows padded by 1 both take 10 (whole tiles), and
    # an 8-row input writes the row that a 7-row one needs zero.
    padded = workspace.zeroed((batch, 2 * th + 2, 2 * tw + 2, channels), data.dtype,
                              ("winograd", pad, (height, width)))
    interior = padded[:, pad[0]:pad[0] + height, pad[1]:pad[1] + width]
    calls: list[Callable[[], Any]] = [partial(xp.copyto, interior, data.transpose(0, 2, 3, 1))]
    layout = _layout(data.shape, filters, pad)
    for start in range(0, batch, layout.chunk):
        samples = slice(start, min(start + layout.chunk, batch))
        calls += _bind_chunk(xp, padded[samples], weight, bias, out[samples], layout,
                             workspace)
    return calls


def _bind_compiled(data: Any, weight: Any, bias: Any, out: Any, geometry: Geometry,
                   workspace: Any) -> Callable[[], Any]:
    """One call to `winograd_kernel.convolve`: the transforms compiled, channels-first."""
    filters = out.shape[1]
    pad = geometry[3]
    m = compiled_tile(data.shape, filters, pad)
    tw = _tile_counts(data.shape, pad, m)[1]
    chunk, tiles_cells, products_cells = _compiled_layout(data.shape, filters, pad, m)
    xis = (m + 2) ** 2
    tiles = workspace.region(0, (xis, tiles_cells), data.dtype)
    products = workspace.region(aligned(tiles.nbytes), (xis, products_cells), data.dtype)
    # Where our GEMM runs the products (`WinogradCall.as_job`), U is kept only as it reads
    # it: the filters-first form, kept too as the packed one's source, would hold as much
    # again that no run reads (ResNet-18 in fp32: 84 MB a model).
    if winograd_kernel.products_packed(data.dtype):
        weights = workspace.derived(weight, f"winograd F({m}×{m}), packed for our GEMM",
                                    partial(_packed_weight_rows, m=m))
    else:
        weights = workspace.derived(weight, f"winograd F({m}×{m}), filters first",
                                    partial(_transform_weight_rows, m=m))
    shifts = np.zeros(filters, data.dtype) if bias is None else bias.reshape(filters)
    no_residual = np.empty((0, *out.shape[1:]), out.dtype)
    bounds = (out.dtype.type(-np.inf), out.dtype.type(np.inf))
    return winograd_kernel.WinogradCall(
        winograd_kernel.convolve, data, pad[0], pad[1], m * tw + 2, tiles, weights, products,
        shifts, no_residual, out, chunk, *bounds)


def compiled_tile(data_shape: Ints, filters: int, pad: Ints) -> int:
    """m of the compiled F(m×m, 3×3) for this layer: 4 where it has tiles enough (4 × 4
    outputs each) by `F4_MIN_TILES`, else 2."""
    return 4 if data_shape[0] * math.prod(_tile_counts(data_shape, pad, 4)) >= F4_MIN_TILES else 2


def _compiled_layout(data_shape: Ints, filters: int, pad: Ints,
                     m: int) -> tuple[int, int, int]:
    """(samples per chunk, cells per ξ row of the tiles, of the products) when compiled."""
    chunk = _layout(data_shape, filters, pad).chunk
    cells = chunk * math.prod(_tile_counts(data_shape, pad, m))
    return (chunk, tiles_row(cells * data_shape[1]),
            cells * filters + winograd_kernel.PRODUCTS_PAD)


def tiles_row(cells: int) -> int:
    """The cells from one ξ row of the compiled transforms' tiles to the next, for ``cells``
    a row: on an AVX2 host, ``cells`` rounded up to an odd number of cache lines
    (`LINE_CELLS` cells each); else ``cells`` (AVX-512 hosts keep the layout measured there)."""
    if host_features.has("avx512f"):
        return cells
    lines = -(-cells // LINE_CELLS)
    return (lines + 1 - lines % 2) * LINE_CELLS


def _compiled_bytes(data_shape: Ints, filters: int, pad: Ints, itemsize: int) -> int:
    m = compiled_tile(data_shape, filters, pad)
    _, tiles, products = _compiled_layout(data_shape, filters, pad, m)
    xis = (m + 2) ** 2
    return aligned(xis * tiles * itemsize) + xis * products * itemsize


def _transform_weight_rows(weight: Any, m: int = 2) -> np.ndarray:
    """U as (α², F, C), the left operand of the channels-first GEMMs of F(m×m, 3×3)."""
    return np.ascontiguousarray(_transform_weight(weight, m).transpose(0, 2, 1))


def _packed_weight_rows(weight: Any, m: int = 2) -> np.ndarray:
    """`_transform_weight_rows` as our GEMM reads each of its α² matrices
    (`gemm_kernel.pack_each`: (α², blocks, C, MR))."""
    return gemm_kernel.pack_each(_transform_weight_rows(weight, m))


def _transform_weight(weight: Any, m: int = 2) -> np.ndarray:
    """U = G g Gᵀ for every (filter, channel) pair, as (α², C, F): computed in float64."""
    filters, channels = weight.shape[:2]
    g = G if m == 2 else G_4
    transformed = np.einsum("ri,fcij,sj->rscf", g, weight.astype(np.float64), g)
    return np.ascontiguousarray(transformed.reshape(len(g) ** 2, channels, filters),
                                dtype=weight.dtype)


def _bind_chunk(xp: Any, padded: Any, weight: Any, bias: Any, out: Any, layout: _Layout,
                workspace: Any) -> list[Callable[[], Any]]:
    """Input transform, 16 GEMMs and output transform for the samples of one chunk."""
    samples, rows, columns, channels = padded.shape
    filters = out.shape[1]
    th, tw = (rows - 2) // 2, (columns - 2) // 2
    second, third, _ = layout.offsets(padded.itemsize)
    region = partial(workspace.region, dtype=padded.dtype)
    tiles = region(second, (16, samples, th, tw, channels))
    calls = _bind_input(xp, padded, region(0, (4, samples, th, columns, channels)), tiles)
    products = region(third, (16, samples, th, tw, filters))
    calls += _products(xp, tiles.reshape(16, -1, channels), weight,
                       products.reshape(16, -1, filters), workspace)
    if bias is not None:
        # Aᵀ e₅ A is all ones (ξ = 5 is (1, 1)): the bias added to M[5] reaches every output of
        # a tile, in a quarter of the cells.
        calls.append(partial(xp.add, products[5], bias, products[5]))
    result = region(second, (samples, 2 * th, 2 * tw, filters))
    calls += _bind_output(xp, products, region(0, (2, 4, samples, th, tw, filters)), result)
    height, width = out.shape[2:]
    calls.append(partial(xp.copyto, out, result[:, :height, :width].transpose(0, 3, 1, 2)))
    return calls


def _products(xp: Any, tiles: Any, weight: Any, products: Any,
              workspace: Any) -> list[Callable[[], Any]]:
    """The 16 GEMMs ``M[ξ] = V[ξ] @ U[ξ]``: by our kernel as one call where it beats BLAS,
    U made straight into its column panels (512 channels at 7×7, 16 tiles, weights cold: 1.6
    against 2.6 ms for the 16), else one stacked matmul on U (computed once, either way)."""
    if (xp is np and gemm_bind.worthwhile(tiles.shape[1], products.shape[2])
            and weight.nbytes <= gemm_bind.PACK_LIMIT_BYTES):
        panels = workspace.derived(weight, "winograd panels", _transformed_panels)
        return [gemm_kernel.bind_packed_columns_batch(tiles, panels, products)]
    weights = workspace.derived(weight, "winograd", _transform_weight)
    return [partial(xp.matmul, tiles, weights, products)]


def _transformed_panels(weight: Any) -> np.ndarray:
    """U[ξ] for every ξ as `gemm_kernel.pack_columns` lays it out (U itself is not kept)."""
    return np.stack([gemm_kernel.pack_columns(u) for u in _transform_weight(weight)])


def _bind_input(xp: Any, padded: Any, rows: Any, tiles: Any) -> list[Callable[[], Any]]:
    """``V = Bᵀ d B`` for every tile: row combinations into ``rows``, then column ones."""
    th, tw = tiles.shape[2:4]
    calls = _b_transposed(xp, [padded[:, k:k + 2 * th:2] for k in range(4)], rows)
    for r in range(4):
        columns = [rows[r][:, :, k:k + 2 * tw:2] for k in range(4)]
        calls += _b_transposed(xp, columns, tiles[4 * r:4 * r + 4])
    return calls


def _bind_output(xp: Any, products: Any, halves: Any, result: Any) -> list[Callable[[], Any]]:
    """``Y = Aᵀ M A`` into ``result``'s interleaved 2×2 positions: rows, then columns."""
    calls = []
    for s in range(4):
        calls += _a_transposed(xp, products[s::4], halves[:, s])
    for a in range(2):
        calls += _a_transposed(xp, halves[a], [result[:, a::2, b::2] for b in range(2)])
    return calls


def _b_transposed(xp: Any, d: Sequence[Any], out: Sequence[Any]) -> list[Callable[[], Any]]:
    """Bᵀ along one axis: ``(d0 - d2, d1 + d2, d2 - d1, d1 - d3)``."""
    return [partial(xp.subtract, d[0], d[2], out[0]), partial(xp.add, d[1], d[2], out[1]),
            partial(xp.subtract, d[2], d[1], out[2]), partial(xp.subtract, d[1], d[3], out[3])]


def _a_transposed(xp: Any, m: Sequence[Any], out: Sequence[Any]) -> list[Callable[[], Any]]:
    """Aᵀ along one axis: ``(m0 + m1 + m2, m1 - m2 - m3)``."""
    return [partial(xp.add, m[0], m[1], out[0]), partial(xp.add, out[0], m[2], out[0]),
            partial(xp.subtract, m[1], m[2], out[1]), partial(xp.subtract, out[1], m[3], out[1])]
