"""``_contrib_fft``, ``_contrib_ifft`` and ``_contrib_count_sketch`` (compact bilinear pooling).

MXNet 1.9.1 runs these on the GPU only (cuFFT and a CUDA kernel); the semantics follow its
sources. ``fft`` takes real vectors along the last axis and returns each spectrum interleaved
as ``re0, im0, re1, im1, ...`` (twice the length), unnormalised. ``ifft`` reads that layout and
returns the real part of the unnormalised inverse (no division by the length, as MXNet leaves it
out). ``count_sketch`` adds ``s[i] * data[..., i]`` into output column ``h[i]``.

Transforms use ``xp.fft`` (NumPy's, or CuPy's cuFFT); the sketch is a product with a signed
one-hot matrix built on the device, so nothing is read back to the host.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.ops.attrs import parse_int
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred, merge


def _last_axis_infer(op: str, factor: float) -> Any:
    def infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
        data = shapes[0]
        if data is None:
            return shapes, [None]
        if not data:
            raise ShapeError(f"{op}: data must have at least one axis; got a scalar")
        if factor < 1 and data[-1] % 2:
            raise ShapeError(f"{op}: the last axis holds (real, imaginary) pairs, so its length "
                             f"must be even; got {data}")
        return shapes, [(*data[:-1], int(data[-1] * factor))]

    return infer


def _fft(xp: Any, attrs: Attrs, data: Any) -> Any:
    spectrum = xp.fft.fft(data, axis=-1)
    pairs = xp.stack([spectrum.real, spectrum.imag], axis=-1)
    return pairs.reshape(*data.shape[:-1], 2 * data.shape[-1]).astype(data.dtype)


def _ifft(xp: Any, attrs: Attrs, data: Any) -> Any:
    pairs = data.reshape(*data.shape[:-1], data.shape[-1] // 2, 2)
    spectrum = pairs[..., 0] + 1j * pairs[..., 1]
    # norm="forward" puts the 1/n on the forward transform: the inverse is unscaled, as MXNet's.
    return xp.fft.ifft(spectrum, axis=-1, norm="forward").real.astype(data.dtype)


_COMPUTE_SIZE = (Param("compute_size", parse_int, 128),)

register(OpDef(
    name="_contrib_fft",
    params=_COMPUTE_SIZE,
    infer_shape=_last_axis_infer("fft", 2),
    kernel=_fft,
    doc="Unnormalised FFT of real vectors (last axis), as interleaved (real, imaginary) pairs.",
))
register(OpDef(
    name="_contrib_ifft",
    params=_COMPUTE_SIZE,
    infer_shape=_last_axis_infer("ifft", 0.5),
    kernel=_ifft,
    doc="Real part of the unnormalised inverse FFT of interleaved (real, imaginary) pairs.",
))


def _sketch_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data, hashes, signs = shapes
    if data is not None and len(data) not in (2, 4):
        raise ShapeError(f"count_sketch: data must be 2-D (N, in_dim) or 4-D; got {data}")
    if attrs.out_dim < 1:
        raise ShapeError(f"count_sketch: out_dim must be positive; got {attrs.out_dim}")
    width = (data[-1],) if data is not None else (0,)
    hashes = merge(hashes, (1, *width), "count_sketch h (1, in_dim)")
    signs = merge(signs, hashes, "count_sketch s and h")
    out = None if data is None else (*data[:-1], attrs.out_dim)
    return [data, signs, signs], [out]


def _count_sketch(xp: Any, attrs: Attrs, data: Any, hashes: Any, signs: Any) -> Any:
    columns = xp.arange(attrs.out_dim)
    chosen = hashes.reshape(-1).astype(np.int64)[:, None] == columns[None, :]
    sketch = chosen.astype(data.dtype) * signs.reshape(-1, 1).astype(data.dtype)
    flat = data.reshape(-1, data.shape[-1])
    return xp.matmul(flat, sketch).reshape(*data.shape[:-1], attrs.out_dim)


register(OpDef(
    name="_contrib_count_sketch",
    params=(Param("out_dim", parse_int), Param("processing_batch_size", parse_int, 32)),
    inputs=("data", "h", "s"),
    infer_shape=_sketch_infer,
    kernel=_count_sketch,
    doc="Count sketch of the last axis: s[i] * data[..., i] summed into column h[i] of out_dim.",
))
