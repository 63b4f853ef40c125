"""Compiled (numba) input and output transforms of Winograd F(2×2, 3×3) and F(4×4, 3×3),
channels-first.

`winograd_bind`'s NumPy transforms are 44 ufunc passes over strided views per layer, plus a
transposing copy in and one out (ResNet-18 at batch 1: 3.7 ms of add/subtract passes and 2.2 ms
of copies against 22.8 ms of GEMMs). Here each transform is one pass, a tile row at a time:

- the input transform reads the input (N, C, H, W) itself, padding included, and writes the
  transformed tiles ``V[ξ]`` as rows (C, tiles): each tile row's four input rows combined once
  (``Bᵀ`` down), then the four columns of every tile (``B`` across);
- the output transform reads the GEMM's products ``M[ξ]`` as rows (F, tiles) and writes
  ``Y = Aᵀ M A`` straight into the output (N, F, H, W), adding the bias, a residual operand and
  clamping as it writes (the epilogue of a fused chain, see `epilogue.absorb`).

F(4×4, 3×3) (`_input_transform_4`, `_output_transform_4`) does the same with six rows and
columns in, four out, and 36 products.

Channels-first, the GEMM is ``M[ξ] = U[ξ] (F, C) @ V[ξ] (C, tiles)``; OpenBLAS runs it as fast
as the channels-last ``V @ U`` (ResNet-18's shapes, one thread: within 3% either way).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from functools import partial
from typing import Any

import numpy as np

from engine.cpu import kernel_jobs
from engine.cpu.compiled import compile_kernel, compiled_once
from engine.kernels import gemm_kernel
from engine.kernels.epilogue import ClampingCall

_kernels: dict[str, Any] = {}
OTHER, OUT = 8, 9  # positions of the residual operand and the output in `convolve`'s arguments

# Cells between consecutive ξ rows of the products beyond their own. Unpadded, a 56×56
# layer's rows are 64 · 784 floats apart, a multiple of 4 KiB: the 16 rows the output
# transform reads side by side fall into one set of the L1 cache and evict each other (64 ×
# 56², one thread: 0.65 ms unpadded, 0.25 padded; the GEMMs do not notice). The tiles are
# left unpadded: the input transform measured 0.40 ms unpadded and 0.47 padded.
PRODUCTS_PAD = 16
# The compiled transforms of each variant by its products' count: F(2×2, 3×3), F(4×4, 3×3).
TRANSFORMS = {16: ("input", "output"), 36: ("input_4", "output_4")}


def convolve(data: Any, pad_y: int, pad_x: int, columns: int, tiles: Any, weights: Any,
             products: Any, bias: Any, other: Any, out: Any, chunk: int, low: Any,
             high: Any) -> None:
    """``out = clip(conv3x3(data) + bias + other, low, high)`` for a stride-1 3×3 convolution
    padded by (pad_y, pad_x): per ``chunk`` samples, the input transform into ``tiles``, the
    α² GEMMs ``weights[ξ] (F, C) @ V[ξ]`` into ``products`` in BLAS, and the output transform.

    ``tiles`` and ``products`` are (α², pitch) scratch, row ξ holding V[ξ] (C, chunk·T) and
    M[ξ] (F, chunk·T) from its start: 16 rows for F(2×2, 3×3), 36 for F(4×4, 3×3) (`tile`).
    ``columns`` (m·tw + 2) is the width of the input transform's rows (it keeps them itself);
    ``bias`` (F,). ``other`` has out's shape, or no samples at all (no residual). NaN stays NaN,
    as ``clip`` keeps it. One call per layer, so that an epilogue folds into it whatever the
    batch: its last two arguments are the bounds (``epilogue.absorb`` narrows them), and
    `OTHER` and `OUT` say where the residual and the output are.
    """
    kernels = _compiled()
    channels, filters, xis = data.shape[1], out.shape[1], len(tiles)
    names = TRANSFORMS[xis]
    if weights.ndim == 4:  # packed for our GEMM (`products_packed`), whose job runs it
        weights = unpacked(weights, filters)
    for samples, used, residual in _chunks(columns, xis, other, out, chunk):
        kernels[names[0]](data[samples], pad_y, pad_x, columns, tiles, 0, channels)
        np.matmul(weights, tiles[:, :channels * used].reshape(xis, channels, used),
                  products[:, :filters * used].reshape(xis, filters, used))
        kernels[names[1]](products, bias, residual, out[samples], low, high, 0, filters)


def products_packed(dtype: Any) -> bool:
    """Whether a layer of ``dtype`` runs its α² products on our GEMM (`WinogradCall.as_job`),
    so that U is bound as that GEMM reads it (`gemm_kernel.pack_each`)."""
    return gemm_kernel.available() and np.dtype(dtype) == np.float32


def unpacked(packed: Any, filters: int) -> np.ndarray:
    """U (α², F, C) from its form packed for our GEMM (α², blocks, C, MR): a copy, for a call
    run whole in place of its job."""
    xis, blocks, channels, rows = packed.shape
    return np.ascontiguousarray(
        packed.transpose(0, 1, 3, 2).reshape(xis, blocks * rows, channels)[:, :filters])


def tile(xis: int) -> int:
    """m, the output tile's side, of the variant with ``xis`` (α² = (m + 2)²) products."""
    return math.isqrt(xis) - 2


def _chunks(columns: int, xis: int, other: Any, out: Any,
            chunk: int) -> Iterator[tuple[slice, int, Any]]:
    """For each chunk of ``chunk`` samples: their slice, their tiles (``columns`` being
    `convolve`'s row width, ``xis`` its products), and their residual operand (``other``
    itself where it has no samples)."""
    m = tile(xis)
    per_sample = (columns - 2) // m * -(-out.shape[2] // m)
    for start in range(0, out.shape[0], chunk):
        samples = slice(start, min(start + chunk, out.shape[0]))
        yield (samples, (samples.stop - start) * per_sample,
               other[samples] if other.shape[0] else other)


class WinogradCall(ClampingCall):
    """A bound `convolve`, ``WinogradCall(convolve, *args)``: run as jobs of parts, clamped by
    narrowing its last two arguments, and given a residual operand to add as its output
    transform writes (`engine.kernels.epilogue`)."""

    def as_job(self, workspace: Any) -> Any:
        """The same steps, each a `spin_pool` job: per chunk, the input transform by channels,
        the α² products as one job of our GEMM (weights packed once per model), the output
        transform by filters. None where the arrays cannot be passed so."""
        (data, pad_y, pad_x, columns, tiles, weights, products, bias, other, out, chunk, low,
         high) = self.args
        if weights.ndim != 4:  # bound filters first: no GEMM of ours here (`products_packed`)
            return None
        channels, filters, xis = data.shape[1], out.shape[1], len(tiles)
        names = TRANSFORMS[xis]
        steps = []
        for samples, used, residual in _chunks(columns, xis, other, out, chunk):
            source, target = data[samples], out[samples]
            transforms = (
                kernel_jobs.bind((__name__, names[0]), (source, pad_y, pad_x, columns, tiles),
                                 channels, kernel_jobs.parts_for(channels, source.size)),
                kernel_jobs.bind((__name__, names[1]), (products, bias, residual, target, low,
                                                         high),
                                 filters, kernel_jobs.parts_for(filters, target.size)))
            if None in transforms:
                return None
            product = gemm_kernel.bind_packed_batch(
                weights, tiles[:, :channels * used].reshape(xis, channels, used),
                products[:, :filters * used].reshape(xis, filters, used))
            steps += [transforms[0], product, transforms[1]]
        return partial(_in_turn, tuple(steps))

    def adds_residual_to(self, out: Any) -> bool:
        """Whether this call writes ``out`` and adds no residual operand yet."""
        return self.args[OUT] is out and self.args[OTHER].shape[0] == 0

    def with_residual(self, other: Any, bounds: tuple[float, float] | None) -> WinogradCall:
        """This call adding ``other`` as its output transform writes, clamped to ``bounds``."""
        args = list(self.args)
        args[OTHER] = other
        adding = type(self)(self.func, *args)
        if bounds is None:
            return adding
        return adding.clamped(*(other.dtype.type(bound) for bound in bounds))


def _in_turn(steps: tuple[Any, ...]) -> None:
    for step in steps:
        step()


def compiled_kernels() -> dict[str, Any]:
    """The transforms by name (`kernel_jobs` runs them as jobs), compiled on first use."""
    return _compiled()


def _compiled() -> dict[str, Any]:
    return compiled_once(_kernels, _compile)


def _compile() -> dict[str, Any]:
    # The row store first, in this module's namespace, where numba resolves the output
    # transforms' calls to it (as `depthwise_kernel` does its helpers); inlined by numba, as a
    # call it slowed F(2×2)'s output transform by a third (64 × 56², one thread: 0.29 against
    # 0.21 ms; inlined 0.21).
    globals()["_store"] = compile_kernel(_store, inline="always")
    return {"input": compile_kernel(_input_transform), "output": compile_kernel(_output_transform),
            "input_4": compile_kernel(_input_transform_4),
            "output_4": compile_kernel(_output_transform_4)}


def _input_transform(data: Any, pad_y: int, pad_x: int, columns: int, tiles: Any, first: int,
                     last: int) -> None:  # pragma: no cover - runs compiled
    # Channels [first, last), in rows of ``columns`` cells (2·tiles across + 2). Written out
    # in one function: around a call, LLVM may not vectorise a loop (see depthwise_kernel), so
    # the helpers are loops in place, not functions.
    samples, channels, height, width = data.shape
    tw = (columns - 2) // 2
    th = (height + 2 * pad_y - 1) // 2
    per_channel = samples * th * tw
    stop = min(width, columns - pad_x)
    rows = np.zeros((8, columns), data.dtype)  # 4..7: the four input rows, zero in the padding
    d0, d1, d2, d3 = rows[4], rows[5], rows[6], rows[7]
    r0, r1, r2, r3 = rows[0], rows[1], rows[2], rows[3]
    for c in range(first, last):
        for n in range(samples):
            plane = data[n, c]
            for i in range(th):
                for k in range(4):
                    y, line = 2 * i - pad_y + k, rows[4 + k]
                    if 0 <= y < height:
                        source = plane[y]
                        for x in range(stop):
                            line[pad_x + x] = source[x]
                    else:
                        line[:] = 0
                for x in range(columns):  # Bᵀ down the four rows
                    r0[x] = d0[x] - d2[x]
                    r1[x] = d1[x] + d2[x]
                    r2[x] = d2[x] - d1[x]
                    r3[x] = d1[x] - d3[x]
                first = c * per_channel + (n * th + i) * tw
                for r in range(4):  # B across each tile's four columns
                    combined = rows[r]
                    v0 = tiles[4 * r, first:first + tw]
                    v1 = tiles[4 * r + 1, first:first + tw]
                    v2 = tiles[4 * r + 2, first:first + tw]
                    v3 = tiles[4 * r + 3, first:first + tw]
                    for j in range(tw):
                        a, b = combined[2 * j], combined[2 * j + 1]
                        e, g = combined[2 * j + 2], combined[2 * j + 3]
                        v0[j] = a - e
                        v1[j] = b + e
                        v2[j] = e - b
                        v3[j] = b - g


def _output_transform(products: Any, bias: Any, other: Any, out: Any, low: Any, high: Any,
                      first: int, last: int) -> None:  # pragma: no cover - runs compiled
    # Filters [first, last).
    samples, filters, height, width = out.shape
    tw, th = (width + 1) // 2, (height + 1) // 2
    per_filter = samples * th * tw
    residual = other.shape[0] != 0
    pair = np.empty((2, 2 * tw), dtype=out.dtype)  # a tile row's two output rows, uncropped
    top, bottom = pair[0], pair[1]
    for f in range(first, last):
        shift = bias[f]
        for n in range(samples):
            for i in range(th):
                first = f * per_filter + (n * th + i) * tw
                m = products[:, first:first + tw]
                for j in range(tw):  # Aᵀ down (u: first row, l: second), then A across
                    u0 = m[0, j] + m[4, j] + m[8, j]
                    u1 = m[1, j] + m[5, j] + m[9, j]
                    u2 = m[2, j] + m[6, j] + m[10, j]
                    u3 = m[3, j] + m[7, j] + m[11, j]
                    l0 = m[4, j] - m[8, j] - m[12, j]
                    l1 = m[5, j] - m[9, j] - m[13, j]
                    l2 = m[6, j] - m[10, j] - m[14, j]
                    l3 = m[7, j] - m[11, j] - m[15, j]
                    top[2 * j] = u0 + u1 + u2 + shift
                    top[2 * j + 1] = u1 - u2 - u3 + shift
                    bottom[2 * j] = l0 + l1 + l2 + shift
                    bottom[2 * j + 1] = l1 - l2 - l3 + shift
                for a in range(min(2, height - 2 * i)):
                    _store(pair[a], other, out, n, f, 2 * i + a, residual, low, high)


def _input_transform_4(data: Any, pad_y: int, pad_x: int, columns: int, tiles: Any, first: int,
                       last: int) -> None:  # pragma: no cover - runs compiled
    # `_input_transform` for F(4×4, 3×3): 6×6 input tiles 4 apart, V = Bᵀ d B with Bᵀ's rows
    # (4 0 -5 0 1 0), (0 -4 -4 1 1 0), (0 4 -4 -1 1 0), (0 -2 -1 2 1 0), (0 2 -1 -2 1 0),
    # (0 4 0 -5 0 1). The six input rows are kept split by column modulo 4 (``lines[k, q, j]``
    # holds column 4j + q), so that both passes read contiguous runs: a tile's six columns are
    # then cell j of phases 0-3 and cell j + 1 of phases 0-1. Interleaved, the pass across read
    # every fourth cell (64 × 56², one thread: 0.56 ms against 0.32).
    samples, channels, height, width = data.shape
    tw = (columns - 2) // 4
    th = (height + 2 * pad_y + 1) // 4
    per_channel = samples * th * tw
    lines = np.zeros((6, 4, tw + 1), data.dtype)  # zero where the padding is: never written
    combined = np.zeros((6, 4, tw + 1), data.dtype)
    flat_lines, flat_combined = lines.reshape(6, -1), combined.reshape(6, -1)
    d0, d1, d2, d3, d4, d5 = (flat_lines[0], flat_lines[1], flat_lines[2], flat_lines[3],
                              flat_lines[4], flat_lines[5])
    r0, r1, r2, r3, r4, r5 = (flat_combined[0], flat_combined[1], flat_combined[2],
                              flat_combined[3], flat_combined[4], flat_combined[5])
    factors = np.array([2, 4, 5], data.dtype)  # typed as the data: no float64 arithmetic
    two, four, five = factors[0], factors[1], factors[2]
    for c in range(first, last):
        for n in range(samples):
            plane = data[n, c]
            for i in range(th):
                for k in range(6):
                    y, line = 4 * i - pad_y + k, lines[k]
                    if 0 <= y < height:
                        source = plane[y]
                        for x in range(width):
                            cell = x + pad_x
                            line[cell & 3, cell >> 2] = source[x]
                    else:
                        line[:] = 0
                for x in range(d0.size):  # Bᵀ down the six rows, every phase at once
                    r0[x] = four * d0[x] - five * d2[x] + d4[x]
                    r1[x] = d3[x] + d4[x] - four * (d1[x] + d2[x])
                    r2[x] = d4[x] - d3[x] + four * (d1[x] - d2[x])
                    r3[x] = d4[x] - d2[x] + two * (d3[x] - d1[x])
                    r4[x] = d4[x] - d2[x] + two * (d1[x] - d3[x])
                    r5[x] = four * d1[x] - five * d3[x] + d5[x]
                start = c * per_channel + (n * th + i) * tw
                for r in range(6):  # B across each tile's six columns
                    p0, p1, p2, p3 = combined[r, 0], combined[r, 1], combined[r, 2], combined[r, 3]
                    v0 = tiles[6 * r, start:start + tw]
                    v1 = tiles[6 * r + 1, start:start + tw]
                    v2 = tiles[6 * r + 2, start:start + tw]
                    v3 = tiles[6 * r + 3, start:start + tw]
                    v4 = tiles[6 * r + 4, start:start + tw]
                    v5 = tiles[6 * r + 5, start:start + tw]
                    for j in range(tw):
                        a0, a1, a2, a3, a4, a5 = p0[j], p1[j], p2[j], p3[j], p0[j + 1], p1[j + 1]
                        v0[j] = four * a0 - five * a2 + a4
                        v1[j] = a3 + a4 - four * (a1 + a2)
                        v2[j] = a4 - a3 + four * (a1 - a2)
                        v3[j] = a4 - a2 + two * (a3 - a1)
                        v4[j] = a4 - a2 + two * (a1 - a3)
                        v5[j] = four * a1 - five * a3 + a5


def _output_transform_4(products: Any, bias: Any, other: Any, out: Any, low: Any, high: Any,
                        first: int, last: int) -> None:  # pragma: no cover - runs compiled
    # `_output_transform` for F(4×4, 3×3): Y = Aᵀ M A with Aᵀ's rows (1 1 1 1 1 0),
    # (0 1 -1 2 -2 0), (0 1 1 4 4 0), (0 1 -1 8 -8 1); down a tile row's 36 product rows
    # into 24 (four output rows × six columns), then across into the four output rows.
    samples, filters, height, width = out.shape
    tw, th = (width + 3) // 4, (height + 3) // 4
    per_filter = samples * th * tw
    residual = other.shape[0] != 0
    half = np.empty((24, tw), dtype=out.dtype)
    quad = np.empty((4, 4 * tw), dtype=out.dtype)  # a tile row's four output rows, uncropped
    factors = np.array([2, 4, 8], out.dtype)
    two, four, eight = factors[0], factors[1], factors[2]
    for f in range(first, last):
        shift = bias[f]
        for n in range(samples):
            for i in range(th):
                start = f * per_filter + (n * th + i) * tw
                m = products[:, start:start + tw]
                for s in range(6):  # Aᵀ down column s of every tile
                    m0, m1, m2, m3, m4, m5 = m[s], m[6 + s], m[12 + s], m[18 + s], m[24 + s], \
                        m[30 + s]
                    h0, h1, h2, h3 = half[s], half[6 + s], half[12 + s], half[18 + s]
                    for j in range(tw):
                        p, q = m1[j] + m2[j], m1[j] - m2[j]
                        r, t = m3[j] + m4[j], m3[j] - m4[j]
                        h0[j] = m0[j] + p + r
                        h1[j] = q + two * t
                        h2[j] = p + four * r
                        h3[j] = q + eight * t + m5[j]
                for a in range(4):  # A across, the bias added
                    t0, t1, t2 = half[6 * a], half[6 * a + 1], half[6 * a + 2]
                    t3, t4, t5 = half[6 * a + 3], half[6 * a + 4], half[6 * a + 5]
                    line = quad[a]
                    for j in range(tw):
                        p, q = t1[j] + t2[j], t1[j] - t2[j]
                        r, t = t3[j] + t4[j], t3[j] - t4[j]
                        line[4 * j] = t0[j] + p + r + shift
                        line[4 * j + 1] = q + two * t + shift
                        line[4 * j + 2] = p + four * r + shift
                        line[4 * j + 3] = q + eight * t + t5[j] + shift
                for a in range(min(4, height - 4 * i)):
                    _store(quad[a], other, out, n, f, 4 * i + a, residual, low, high)


def _store(source: Any, other: Any, out: Any, n: int, f: int, y: int, residual: bool, low: Any,
           high: Any) -> None:  # pragma: no cover - runs compiled
    # Row y of output plane (n, f) from an uncropped transformed row: the residual operand
    # added, clamped (not min/max: NaN stays).
    target = out[n, f, y]
    if residual:
        added = other[n, f, y]
        for x in range(target.size):
            value = source[x] + added[x]
            value = low if value < low else value
            target[x] = high if value > high else value
    else:
        for x in range(target.size):
            value = source[x]
            value = low if value < low else value
            target[x] = high if value > high else value
