"""Sliding-window helpers shared by convolution, deconvolution and pooling.

Arrays are channels-first, ``(N, C, *spatial)``. Helpers build strided views rather than copies
wherever they can; the only copies are the padded input and the patch matrix of `im2col`.
"""

from __future__ import annotations

import itertools
from typing import Any

from engine.errors import ShapeError

Ints = tuple[int, ...]


def spatial_param(value: Ints, ndim: int, default: int, name: str, where: str) -> Ints:
    """``value`` for ``ndim`` spatial axes; an empty tuple means ``default`` on every axis."""
    if not value:
        return (default,) * ndim
    if len(value) != ndim:
        raise ShapeError(f"{where}: {name}={value} has {len(value)} values; expected {ndim}, "
                         f"one per spatial axis of the kernel")
    return tuple(value)


def conv_out_size(size: int, kernel: int, stride: int, dilate: int, pad: int) -> int:
    """Output length of a convolution along one axis; 0 when ``size`` is unknown (0)."""
    if not size:
        return 0
    return (size + 2 * pad - dilate * (kernel - 1) - 1) // stride + 1


def conv_out_sizes(sizes: Ints, kernel: Ints, stride: Ints, dilate: Ints, pad: Ints) -> Ints:
    """`conv_out_size` on every spatial axis."""
    return tuple(map(conv_out_size, sizes, kernel, stride, dilate, pad))


def kernel_offsets(kernel: Ints, dilate: Ints) -> list[Ints]:
    """Input offsets of every kernel position, in row-major kernel order."""
    ranges = (range(0, k * d, d) for k, d in zip(kernel, dilate, strict=True))
    return list(itertools.product(*ranges))


def pad_spatial(xp: Any, data: Any, before: Ints, after: Ints, value: float = 0) -> Any:
    """``data`` with ``before``/``after`` cells of ``value`` around each spatial axis."""
    if not any(before) and not any(after):
        return data
    spatial = data.shape[2:]
    shape = (*data.shape[:2], *(s + b + a for s, b, a in zip(spatial, before, after, strict=True)))
    padded = xp.full(shape, value, dtype=data.dtype)
    inner = (slice(b, b + s) for b, s in zip(before, spatial, strict=True))
    padded[(slice(None), slice(None), *inner)] = data
    return padded


def window(data: Any, offset: Ints, stride: Ints, size: Ints) -> Any:
    """The view ``data[:, :, offset + stride * i]`` for ``i`` in ``range(size)`` on each axis."""
    index = (slice(o, o + s * (n - 1) + 1, s) for o, s, n in zip(offset, stride, size, strict=True))
    return data[(slice(None), slice(None), *index)]


def patches(xp: Any, padded: Any, kernel: Ints, stride: Ints, dilate: Ints, size: Ints) -> Any:
    """A strided (no-copy) view of shape ``(N, C, *kernel, *size)`` over ``padded``."""
    strides = padded.strides
    spatial = strides[2:]
    view_strides = (strides[0], strides[1],
                    *(st * d for st, d in zip(spatial, dilate, strict=True)),
                    *(st * s for st, s in zip(spatial, stride, strict=True)))
    return xp.lib.stride_tricks.as_strided(padded, shape=(*padded.shape[:2], *kernel, *size),
                                           strides=view_strides)


def im2col(xp: Any, padded: Any, kernel: Ints, stride: Ints, dilate: Ints, size: Ints) -> Any:
    """The contiguous patch array ``(N, C, *kernel, *size)``: row ``(c, k)`` of the GEMM operand."""
    return xp.ascontiguousarray(patches(xp, padded, kernel, stride, dilate, size))


def split_view(xp: Any, target: Any, factors: Ints) -> Any:
    """View ``target`` (N, C, *spatial) as (N, C, s0, f0, s1, f1, ...) with ``s * f`` = spatial."""
    shape: list[int] = list(target.shape[:2])
    strides: list[int] = list(target.strides[:2])
    for size, stride, factor in zip(target.shape[2:], target.strides[2:], factors, strict=True):
        shape += [size // factor, factor]
        strides += [stride * factor, stride]
    return xp.lib.stride_tricks.as_strided(target, shape=tuple(shape), strides=tuple(strides))


def output_buffer(xp: Any, out: Any, shape: Ints, dtype: Any) -> Any:
    """``out`` if it is C-contiguous with ``shape`` (kernels reshape it), else a new array."""
    if out is not None and tuple(out.shape) == tuple(shape) and out.flags.c_contiguous:
        return out
    return xp.empty(shape, dtype=dtype)


def finish(xp: Any, out: Any, result: Any) -> Any:
    """Copy ``result`` into ``out`` when a kernel had to compute elsewhere; return the output."""
    if out is None or out is result:
        return result
    xp.copyto(out, result, casting="unsafe")
    return out
