"""Compiled (numba) kernels for 2-D depthwise convolution.

`depthwise_bind` lays each channel's padded input out so that tap ``k`` of every output reads
the contiguous run ``flat[offset_k : offset_k + L]`` (the phase layout). Compiled, the nine taps
of a 3×3 layer are summed per output in a register (one store per output, not one per tap), and
the valid outputs written straight from that run, clamped where a ReLU6 follows. Three kernels:

- `depthwise_rows` reads a phase grid NumPy filled for the whole layer;
- `depthwise_planes` fills one plane's phase grid itself, in cache, then sums (large strided
  layers, whose NumPy fill is four strided copies);
- `depthwise_same_3x3` reads the input itself (3×3, stride 1, pad 1): the rows between the
  first and last as one flat run whose first and last columns leave out the taps across a
  row's end (selected per cell), the first and last rows as runs of six taps, the corners
  with bounds.

Measured on MobileNet v2's 17 depthwise layers at batch 1, one thread, each interleaved with the
binding before (one kernel adding tap by tap; best of 40, NumPy's phase fill and ReLU6
included): 32 × 112² 0.38 → 0.20 ms, 96 × 112² stride 2 0.66 → 0.44, 144 × 56² 0.35 → 0.25,
384 × 14² 0.105 → 0.082, 960 × 7² 0.115 → 0.097; all 17 layers 3.15 → 2.35 ms (medians 3.78 →
2.69; load average 9 on 2 cores).

numba is imported on first use (`engine.cpu.compiled`); where it is not installed, the NumPy
binding runs instead. A bound call of these kernels is a `DepthwiseCall`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.cpu import kernel_jobs
from engine.cpu.compiled import compile_kernel, compiled_once
from engine.kernels.epilogue import ClampingCall

_kernels: dict[str, Any] = {}  # the compiled functions, once made


def depthwise_rows(flat: Any, offsets: Any, weights: Any, bias: Any, out: Any,
                   grid_width: int, low: Any, high: Any) -> None:
    """``out[p, y, x] = bias[c] + Σₖ weights[c, k] · flat[p, offsets[k] + y·grid_width + x]``
    for every plane ``p`` (sample-major, ``c = p % channels``), clamped to [low, high] as
    ``clip`` does (NaN stays NaN); ±inf bounds leave it as it is.

    ``flat`` (planes, cells) holds each plane's input on the phase grid; ``weights``
    (channels, taps), ``bias`` (channels,) and the bounds have the data's dtype; ``out`` is
    (planes, H, W).
    """
    _compiled()["rows"](flat, offsets, weights, bias, out, grid_width, low, high, 0,
                        out.shape[0])


def depthwise_planes(data: Any, grid: Any, offsets: Any, weights: Any, bias: Any, out: Any,
                     pad_y: int, pad_x: int, low: Any, high: Any) -> None:
    """`depthwise_rows`, reading the input ``data`` (planes, H, W) itself: each plane is first
    copied into ``grid`` (sy, sx, QH, QW), one plane's phase grid, zero outside the cells the
    input fills (the caller zeroes it once; only those cells are written), while it is in cache.
    """
    _compiled()["planes"](data, grid, offsets, weights, bias, out, pad_y, pad_x, low, high, 0,
                          data.shape[0])


def depthwise_same_3x3(data: Any, inner: Any, weights: Any, bias: Any, out: Any, low: Any,
                       high: Any) -> None:
    """`depthwise_rows` for a 3×3, stride-1, pad-1 convolution, reading ``data`` (planes, H, W)
    itself: no phase grid at all. ``inner`` (`inner_columns`) marks each cell of a plane that
    is not in the first column (bit 0) and not in the last (bit 1)."""
    _compiled()["same_3x3"](data, inner, weights, bias, out, low, high, 0, data.shape[0])


def inner_columns(height: int, width: int) -> np.ndarray:
    """`depthwise_same_3x3`'s ``inner`` for planes of ``height`` × ``width``."""
    column = np.arange(height * width) % width
    return ((column != 0) | (column != width - 1) << 1).astype(np.uint8)


def compiled_kernels() -> dict[str, Any]:
    """The kernels by name (`engine.cpu.kernel_jobs` runs them as jobs), compiled on first
    use."""
    return _compiled()


def _compiled() -> dict[str, Any]:
    """The kernels, compiled on first use. The helpers (`_rows` among them) are compiled first
    and put in this module's namespace, where numba resolves the kernels' calls to them."""
    return compiled_once(_kernels, _compile)


def _compile() -> dict[str, Any]:
    for helper in (_fill_phases, _sum_taps, _bounded_sum, _clamped, _rows):
        globals()[helper.__name__] = compile_kernel(helper, fastmath={"contract"})
    return {"rows": globals()["_rows"],
            "planes": compile_kernel(_planes, fastmath={"contract"}),
            "same_3x3": compile_kernel(_same_3x3, fastmath={"contract"})}


def _rows(flat: Any, offsets: Any, weights: Any, bias: Any, out: Any, grid_width: int,
          low: Any, high: Any, first: int, last: int) -> None:  # pragma: no cover - runs compiled
    planes, height, width = out.shape
    channels = weights.shape[0]
    length = (height - 1) * grid_width + width
    row = np.empty(length, dtype=flat.dtype)
    for plane in range(first, last):  # the kernels' last two arguments: planes [first, last)
        channel = plane % channels
        if offsets.shape[0] == 9:
            # 3×3: each output summed in a register, one store per output instead of one per
            # tap (1.3–1.8× faster). Written out here, not in a helper: around a call, LLVM
            # does not vectorise it (1.6× slower). Each tap a slice, so that the loop index
            # stays non-negative and numba tests no wrap-around per element.
            source, taps, shift = flat[plane], weights[channel], bias[channel]
            w0, w1, w2, w3, w4 = taps[0], taps[1], taps[2], taps[3], taps[4]
            w5, w6, w7, w8 = taps[5], taps[6], taps[7], taps[8]
            f0, f1, f2 = source[offsets[0]:], source[offsets[1]:], source[offsets[2]:]
            f3, f4, f5 = source[offsets[3]:], source[offsets[4]:], source[offsets[5]:]
            f6, f7, f8 = source[offsets[6]:], source[offsets[7]:], source[offsets[8]:]
            for j in range(length):
                row[j] = (shift + w0 * f0[j] + w1 * f1[j] + w2 * f2[j] + w3 * f3[j] + w4 * f4[j]
                          + w5 * f5[j] + w6 * f6[j] + w7 * f7[j] + w8 * f8[j])
        else:
            _sum_taps(flat[plane], offsets, weights[channel], bias[channel], row)
        target = out[plane]
        for y in range(height):
            line, written = row[y * grid_width:], target[y]
            for x in range(width):
                value = line[x]
                value = low if value < low else value  # not min/max: NaN stays NaN
                written[x] = high if value > high else value


def _planes(data: Any, grid: Any, offsets: Any, weights: Any, bias: Any, out: Any,
            pad_y: int, pad_x: int, low: Any, high: Any, first: int,
            last: int) -> None:  # pragma: no cover
    channels = weights.shape[0]
    flat = grid.reshape(1, -1)
    for plane in range(first, last):
        channel = plane % channels
        _fill_phases(data[plane], grid, pad_y, pad_x)
        # One plane at a time through `_rows` (a call per plane; its loops stay vectorised).
        _rows(flat, offsets, weights[channel:channel + 1], bias[channel:channel + 1],
              out[plane:plane + 1], grid.shape[3], low, high, 0, 1)


def _fill_phases(source: Any, grid: Any, pad_y: int, pad_x: int) -> None:  # pragma: no cover
    """Input rows ``source`` (H, W) into the interior of the phase grid (sy, sx, QH, QW). Each
    stride across gets a loop LLVM vectorises: a plain copy, or both phases of 2 at once (an
    interleaved access); other strides take the general one, phase by phase."""
    stride_y, stride_x = grid.shape[0], grid.shape[1]
    width = source.shape[1]
    for y in range(source.shape[0]):
        line = source[y]
        # Indexed in one go, not through a (sx, QW) view: numba knows these rows contiguous.
        phase_y, cell_y = (y + pad_y) % stride_y, (y + pad_y) // stride_y
        if stride_x == 1:
            inside = grid[phase_y, 0, cell_y, pad_x:]
            for x in range(width):
                inside[x] = line[x]
        elif stride_x == 2:
            even = grid[phase_y, pad_x % 2, cell_y, pad_x // 2:]  # input columns 0, 2, 4…
            odd = grid[phase_y, 1 - pad_x % 2, cell_y, (pad_x + 1) // 2:]
            for x in range(width // 2):
                even[x] = line[2 * x]
                odd[x] = line[2 * x + 1]
            if width % 2:
                even[width // 2] = line[width - 1]
        else:
            for phase in range(stride_x):
                first = (phase - pad_x) % stride_x  # the first input column in this phase
                inside = grid[phase_y, phase, cell_y, (first + pad_x) // stride_x:]
                for x in range((width - first + stride_x - 1) // stride_x):
                    inside[x] = line[first + x * stride_x]


def _sum_taps(flat: Any, offsets: Any, weights: Any, shift: Any,
              row: Any) -> None:  # pragma: no cover - runs compiled
    """``row[j] = shift + Σₖ weights[k] · flat[offsets[k] + j]``: one multiply-add pass over
    ``row`` per tap (3×3's nine are summed in registers, in `_rows` itself)."""
    row[:] = shift
    for tap in range(offsets.shape[0]):
        weight = weights[tap]
        source = flat[offsets[tap]:]
        for j in range(row.shape[0]):
            row[j] += weight * source[j]


def _same_3x3(data: Any, inner: Any, weights: Any, bias: Any, out: Any, low: Any,
              high: Any, first: int, last: int) -> None:  # pragma: no cover - runs compiled
    planes, height, width = data.shape
    channels = weights.shape[0]
    size = height * width
    for plane in range(first, last):
        channel = plane % channels
        source, target = data[plane].reshape(-1), out[plane].reshape(-1)
        taps, shift = weights[channel], bias[channel]
        if height < 3 or width < 3:  # too small to have an inside: every output bounded
            for cell in range(size):
                target[cell] = _clamped(_bounded_sum(data[plane], taps, shift, cell // width,
                                                     cell % width), low, high)
            continue
        # From (1, 1) to (H-2, W-2) as one flat run: tap (ky, kx) of the output at `start + j`
        # is source[j + ky·W + kx]. In the first and last columns the left and right taps
        # would read across a row's end: `inner` (bit 0: not the first column, bit 1: not the
        # last) leaves them out by selection, not by a multiply (NaN · 0 is NaN).
        w0, w1, w2, w3, w4 = taps[0], taps[1], taps[2], taps[3], taps[4]
        w5, w6, w7, w8 = taps[5], taps[6], taps[7], taps[8]
        start, stop = width + 1, size - width - 1
        a0, a1, a2 = source[0:], source[1:], source[2:]
        b0, b1, b2 = source[width:], source[width + 1:], source[width + 2:]
        c0, c1, c2 = source[2 * width:], source[2 * width + 1:], source[2 * width + 2:]
        run, keep = target[start:], inner[start:]
        for j in range(stop - start):
            left = w0 * a0[j] + w3 * b0[j] + w6 * c0[j]
            right = w2 * a2[j] + w5 * b2[j] + w8 * c2[j]
            value = shift + w1 * a1[j] + w4 * b1[j] + w7 * c1[j]
            value = value + left if keep[j] & 1 else value  # no 0.0: it would make float32
            value = value + right if keep[j] & 2 else value  # sums float64 ones
            value = low if value < low else value  # not min/max: NaN stays NaN
            run[j] = high if value > high else value
        # The first and last rows between their corners: two input rows each (taps 3-8 for
        # the top row, 0-5 for the bottom one).
        for row, above, tap in ((0, 0, 3), (height - 1, height - 2, 0)):
            line = target[row * width + 1:]
            u0, u1, u2 = taps[tap], taps[tap + 1], taps[tap + 2]
            v0, v1, v2 = taps[tap + 3], taps[tap + 4], taps[tap + 5]
            p0, p1, p2 = source[above * width:], source[above * width + 1:], \
                source[above * width + 2:]
            q0, q1, q2 = source[(above + 1) * width:], source[(above + 1) * width + 1:], \
                source[(above + 1) * width + 2:]
            for x in range(width - 2):
                value = (shift + u0 * p0[x] + u1 * p1[x] + u2 * p2[x]
                         + v0 * q0[x] + v1 * q1[x] + v2 * q2[x])
                value = low if value < low else value
                line[x] = high if value > high else value
        # The four corners (2 × 2 taps), and the run's two ends (3 × 2), which it leaves out
        # because their taps across a row's end would read a cell outside the plane.
        below, end = (height - 2) * width, (height - 3) * width + width - 2
        for first, rows, tap, cell in ((0, 2, 4, 0), (width - 2, 2, 3, width - 1),
                                       (below, 2, 1, below + width),
                                       (below + width - 2, 2, 0, size - 1),
                                       (0, 3, 1, width), (end, 3, 0, stop)):
            value = shift
            for row in range(rows):
                at = first + row * width
                value += taps[tap + 3 * row] * source[at] + taps[tap + 3 * row + 1] * source[at + 1]
            target[cell] = _clamped(value, low, high)


def _clamped(value: Any, low: Any, high: Any) -> Any:  # pragma: no cover - runs compiled
    """``value`` clamped to [low, high] as ``clip`` does: not min/max, so NaN stays NaN."""
    value = low if value < low else value
    return high if value > high else value


def _bounded_sum(plane: Any, weights: Any, shift: Any, y: int,
                 x: int) -> Any:  # pragma: no cover - runs compiled
    """One output of a 3×3 pad-1 convolution at (y, x), taps outside the plane left out."""
    value = shift
    for ky in range(3):
        for kx in range(3):
            row, column = y + ky - 1, x + kx - 1
            if 0 <= row < plane.shape[0] and 0 <= column < plane.shape[1]:
                value += weights[3 * ky + kx] * plane[row, column]
    return value


# Where each kernel's operands sit in its bound call: the (planes, …) arrays, the per-channel
# arrays, and the phase grid a call writes (None: it has none).
_OPERANDS = {"depthwise_rows": ((0, 4), (2, 3), None),
             "depthwise_planes": ((0, 5), (3, 4), 1),
             "depthwise_same_3x3": ((0, 4), (2, 3), None)}
# Below this many bytes of input and output, handing planes to other threads costs more than
# it saves: the kernels do ~9 multiply-adds per output, and MobileNet v2's smallest layer
# (960 × 7², 0.38 MB in and out) takes ~0.13 ms on one thread.
SLAB_MIN_BYTES = 64 << 10


class DepthwiseCall(ClampingCall):
    """A bound call of one of this module's kernels, ``DepthwiseCall(kernel, *args)``: cut by
    planes into jobs of parts or slabs of threads; its last two arguments are its clamp."""

    def operands(self) -> tuple[tuple[int, ...], tuple[int, ...], int | None]:
        """Where the kernel's operands sit in this call: the (planes, …) arrays, the
        per-channel arrays, and the phase grid it writes (None: it has none)."""
        return _OPERANDS[self.func.__name__]

    def extent(self) -> tuple[int, int, int]:
        """(planes, channels, bytes of the planar arrays: input and output)."""
        planar, per_channel, _ = self.operands()
        arrays = [self.args[index] for index in planar]
        return (arrays[0].shape[0], self.args[per_channel[0]].shape[0],
                sum(array.nbytes for array in arrays))

    def slab(self, start: int, stop: int) -> DepthwiseCall:
        """This call restricted to planes [start, stop), which must be whole samples or lie
        within one sample: a call of its own, with its own phase grid, that can run beside
        the others."""
        planar, per_channel, grid = self.operands()
        args = list(self.args)
        channels = args[per_channel[0]].shape[0]
        for index in planar:
            args[index] = args[index][start:stop]
        if (stop - start) % channels or start % channels:  # within one sample: its channels
            first = start % channels
            for index in per_channel:
                args[index] = args[index][first:first + stop - start]
        if grid is not None:
            args[grid] = np.zeros_like(args[grid])
        return type(self)(self.func, *args)

    def slabs(self, count: int) -> list[DepthwiseCall] | None:
        """Runs of planes for ``count`` threads: whole samples where there are several (at
        most ``count`` slabs), else the channels of the single sample."""
        planes, channels, nbytes = self.extent()
        if nbytes < SLAB_MIN_BYTES:
            return None
        samples = planes // channels
        if samples > 1:
            bounds = np.linspace(0, samples, min(count, samples) + 1).astype(int) * channels
        elif channels >= count:
            bounds = np.linspace(0, channels, count + 1).astype(int)
        else:
            return None
        return [self.slab(int(low), int(high))
                for low, high in zip(bounds[:-1], bounds[1:], strict=True)]

    def as_job(self, workspace: Any) -> Any:
        """A `spin_pool` job over the planes, each part with its own phase grid; None where the
        kernels are not compiled for these arguments."""
        planar, _, grid = _OPERANDS[self.func.__name__]
        planes = self.args[planar[0]].shape[0]
        elements = sum(self.args[index].size for index in planar)
        parts = kernel_jobs.parts_for(planes, elements)
        args = list(self.args)
        if grid is not None:
            args[grid] = np.zeros((parts, *args[grid].shape), args[grid].dtype)
        kernel = (__name__, self.func.__name__.removeprefix("depthwise_"))
        return kernel_jobs.bind(kernel, tuple(args), planes, parts,
                                frozenset() if grid is None else frozenset({grid}))
