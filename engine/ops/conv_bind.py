"""Convolution bound into a plan: im2col and GEMM over memory fixed at compile time.

The interpreter's kernel pads the input and builds the patch array afresh on every call, and
fresh multi-megabyte arrays cost page faults on every run. A plan knows every shape in advance:
here the patch array lives in the plan's shared scratch buffer and the padded input in a
zero-bordered buffer of the plan's `Workspace`, the strided views over them are made once, and
a run is a copy in, then a patch copy and one BLAS call per sample.

Samples run one at a time, each as one GEMM ``(F, CK) @ (CK, P)`` straight into its output.
Taking several samples as one wide GEMM was measured too: the copy of its result back into
the (N, F, P) output cost more than the wider GEMM saved (ResNet-18 and MobileNet v2 at batch
8: 4–7% slower; the stem and the stride-2 layers 15–20% slower, the others the same).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

from engine.ops.im2col import Ints

Geometry = tuple[Ints, Ints, Ints, Ints]  # kernel, stride, dilate, pad


def is_direct(data_shape: Ints, geometry: Geometry) -> bool:
    """A 1×1, stride-1, unpadded convolution: a plain GEMM on the input, no patch array."""
    kernel, stride, _, pad = geometry
    return max(kernel) == 1 and max(stride) == 1 and not any(pad)


def scratch_bytes(data_shape: Ints, filters: int, size: Ints, geometry: Geometry,
                  itemsize: int) -> int:
    """Bytes of plan scratch the bound convolution needs: one sample's patch array."""
    if is_direct(data_shape, geometry):
        return 0
    return math.prod(_patch_shape(data_shape, geometry[0], size)) * itemsize


def bind(xp: Any, data: Any, weight: Any, bias: Any, out: Any, geometry: Geometry,
         workspace: Any) -> list[Callable[[], Any]]:
    """Calls computing ``out = conv(data, weight) + bias`` (group 1, channels-first)."""
    batch, filters, size = out.shape[0], out.shape[1], out.shape[2:]
    matrix = weight.reshape(filters, -1)
    positions = math.prod(size)
    if is_direct(data.shape, geometry) and data.flags.c_contiguous:
        calls = [partial(xp.matmul, matrix, data.reshape(batch, -1, positions),
                         out.reshape(batch, filters, positions))]
    else:
        source = _padded(xp, data, geometry[3], workspace)
        calls = [] if source is data else [partial(xp.copyto, _interior(source, geometry[3]),
                                                   data)]
        patches = workspace.region(0, _patch_shape(data.shape, geometry[0], size), data.dtype)
        for sample in range(batch):
            calls += [partial(xp.copyto, patches, _patch_view(xp, source[sample], geometry,
                                                              size)),
                      partial(xp.matmul, matrix, patches.reshape(matrix.shape[1], -1),
                              out[sample].reshape(filters, positions))]
    if bias is not None:
        calls.append(partial(xp.add, out, bias.reshape(1, filters, *(1,) * len(size)), out))
    return calls


def _padded(xp: Any, data: Any, pad: Ints, workspace: Any) -> Any:
    """``data`` itself, or a zero-bordered buffer of its padded shape (interior copied in)."""
    if not any(pad):
        return data
    shape = (*data.shape[:2], *(n + 2 * p for n, p in zip(data.shape[2:], pad)))
    return workspace.zeroed(shape, data.dtype, ("padding", pad))


def _interior(padded: Any, pad: Ints) -> Any:
    return padded[(slice(None), slice(None),
                   *(slice(p, n - p) for p, n in zip(pad, padded.shape[2:])))]


def _patch_shape(data_shape: Ints, kernel: Ints, size: Ints) -> Ints:
    return (data_shape[1], *kernel, *size)


def _patch_view(xp: Any, padded: Any, geometry: Geometry, size: Ints) -> Any:
    """The strided view ``(C, *kernel, *size)`` over one padded sample (C, *spatial)."""
    kernel, stride, dilate, _ = geometry
    channel, *spatial = padded.strides
    strides = (channel, *(s * d for s, d in zip(spatial, dilate)),
               *(s * t for s, t in zip(spatial, stride)))
    shape = (padded.shape[0], *kernel, *size)
    return xp.lib.stride_tricks.as_strided(padded, shape=shape, strides=strides)
