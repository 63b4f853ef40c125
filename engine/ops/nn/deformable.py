"""Deformable convolutions: ``_contrib_DeformableConvolution`` (DCN v1) and
``_contrib_ModulatedDeformableConvolution`` (DCN v2, with a mask).

Each output position samples the input at its kernel taps moved by a learned ``offset``
(``(N, 2 * G * kh * kw, Ho, Wo)``: for deformable group ``g`` and tap ``k``, channel
``2 * (g * K + k)`` moves the row and the next one the column), bilinearly; DCN v2 also scales
each sample by ``mask`` (``(N, G * K, Ho, Wo)``). The samples form the im2col matrix, and a
grouped matrix product with the weights gives the output, as in MXNet.

The two ops sample differently in MXNet 1.9.1 (CPU): DCN v1 reads a position only when it lies
in ``[0, H) x [0, W)`` and clamps the far neighbour to the last row or column; DCN v2 reads
positions in ``(-1, H) x (-1, W)`` with neighbours outside the map counting as 0. Every
gather runs on the device; nothing is read back to the host.
"""

from __future__ import annotations

from typing import Any

from engine.errors import ShapeError
from engine.kernels.im2col import conv_out_sizes, spatial_param
from engine.ops.attrs import parse_bool, parse_int, parse_int_tuple
from engine.ops.nn.conv import parse_conv_layout
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, default_dtype, register
from engine.ops.shapes import Inferred, merge

Ints = tuple[int, ...]


def _geometry(attrs: Attrs, op: str) -> tuple[Ints, Ints, Ints, Ints]:
    """(kernel, stride, dilate, pad) of a 2-D deformable convolution."""
    kernel = tuple(attrs.kernel)
    if len(kernel) != 2 or min(kernel) < 1:
        raise ShapeError(f"{op}: kernel={kernel} must be two positive sizes (only 2-D "
                         "deformable convolution exists)")
    stride = spatial_param(attrs.stride, 2, 1, "stride", op)
    dilate = spatial_param(attrs.dilate, 2, 1, "dilate", op)
    pad = spatial_param(attrs.pad, 2, 0, "pad", op)
    return kernel, stride, dilate, pad


def _inputs(modulated: bool) -> Any:
    def names(attrs: Attrs) -> tuple[str, ...]:
        head = ("data", "offset", "mask", "weight") if modulated else ("data", "offset", "weight")
        return head if attrs.no_bias else (*head, "bias")

    return names


def _infer(modulated: bool) -> Any:
    op = "ModulatedDeformableConvolution" if modulated else "DeformableConvolution"

    def infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
        kernel, stride, dilate, pad = _geometry(attrs, op)
        taps = kernel[0] * kernel[1]
        data, offset, *rest = shapes
        if data is not None and len(data) != 4:
            raise ShapeError(f"{op}: data must be (N, C, H, W); got {data}")
        groups, deformable = attrs.num_group, attrs.num_deformable_group
        filters = attrs.num_filter
        channels = data[1] if data is not None else 0
        if groups < 1 or deformable < 1 or filters % groups or (
                channels and (channels % groups or channels % deformable)):
            raise ShapeError(f"{op}: num_group={groups} must divide num_filter ({filters}) and, "
                             f"with num_deformable_group={deformable}, the channels ({channels})")
        if modulated and filters % deformable:
            raise ShapeError(f"{op}: num_deformable_group={deformable} must divide num_filter "
                             f"({filters})")
        out: MaybeShape = None
        if data is not None:
            out = (data[0], filters, *conv_out_sizes(data[2:], kernel, stride, dilate, pad))
            if min(out[2:]) <= 0 and all(data[2:]):
                raise ShapeError(f"{op}: data {data} is too small for the kernel; the output "
                                 f"would be {out}")
        batch, spatial = (out[0], out[2:]) if out is not None else (0, (0, 0))
        filled = [data, merge(offset, (batch, 2 * deformable * taps, *spatial), f"{op} offset")]
        if modulated:
            filled.append(merge(rest.pop(0), (batch, deformable * taps, *spatial), f"{op} mask"))
        filled.append(merge(rest[0], (filters, channels // groups, *kernel), f"{op} weight"))
        if not attrs.no_bias:
            filled.append(merge(rest[1], (filters,), f"{op} bias"))
        return filled, [out]

    return infer


def _corners(xp: Any, rows: Any, cols: Any, height: int, width: int,
             modulated: bool) -> list[tuple[Any, Any]]:
    """``(flat index, weight)`` of the four bilinear neighbours of every sample position;
    weights are 0 for samples outside the readable area and for neighbours off the map."""
    if modulated:
        inside = (rows > -1) & (cols > -1) & (rows < height) & (cols < width)
    else:
        inside = (rows >= 0) & (cols >= 0) & (rows < height) & (cols < width)
    row_low, col_low = xp.floor(rows), xp.floor(cols)
    if not modulated:  # DCN v1 clamps: at the last row/column the sample snaps onto it
        rows = xp.where(row_low >= height - 1, row_low, rows)
        cols = xp.where(col_low >= width - 1, col_low, cols)
    row_frac, col_frac = rows - row_low, cols - col_low
    corners = []
    for row, row_weight in ((row_low, 1 - row_frac), (row_low + 1, row_frac)):
        for col, col_weight in ((col_low, 1 - col_frac), (col_low + 1, col_frac)):
            valid = inside & (row >= 0) & (row <= height - 1) & (col >= 0) & (col <= width - 1)
            if not modulated:
                row, col = xp.minimum(row, height - 1), xp.minimum(col, width - 1)
                valid = inside
            index = (xp.clip(row, 0, height - 1) * width + xp.clip(col, 0, width - 1))
            corners.append((index.astype("int64"), xp.where(valid, row_weight * col_weight, 0)))
    return corners


def sample_columns(xp: Any, attrs: Attrs, data: Any, offset: Any, mask: Any,
                   modulated: bool) -> Any:
    """The deformable im2col matrix ``(N, C * kh * kw, Ho * Wo)`` (rows channel-major)."""
    kernel, stride, dilate, pad = _geometry(attrs, "deformable convolution")
    batch, channels, height, width = data.shape
    out_h, out_w = offset.shape[2:]
    groups, taps = attrs.num_deformable_group, kernel[0] * kernel[1]
    # Base sampling grid per tap: (K, Ho, Wo) rows and columns before the offsets.
    tap_rows = (xp.arange(kernel[0]) * dilate[0]).repeat(kernel[1])
    tap_cols = xp.tile(xp.arange(kernel[1]) * dilate[1], kernel[0])
    base_rows = tap_rows[:, None, None] + (xp.arange(out_h) * stride[0] - pad[0])[None, :, None]
    base_cols = tap_cols[:, None, None] + (xp.arange(out_w) * stride[1] - pad[1])[None, None, :]
    moves = offset.reshape(batch, groups, taps, 2, out_h, out_w)
    rows = (base_rows.astype(data.dtype) + moves[:, :, :, 0]).reshape(batch, groups, 1, -1)
    cols = (base_cols.astype(data.dtype) + moves[:, :, :, 1]).reshape(batch, groups, 1, -1)
    flat = data.reshape(batch, groups, channels // groups, height * width)
    target = (batch, groups, channels // groups, rows.shape[-1])
    columns = xp.zeros(target, data.dtype)
    for index, weight in _corners(xp, rows, cols, height, width, modulated):
        picked = xp.take_along_axis(flat, xp.broadcast_to(index, target), axis=-1)
        columns += picked * weight.astype(data.dtype)
    if mask is not None:
        columns *= mask.reshape(batch, groups, 1, -1)
    return columns.reshape(batch, channels * taps, out_h * out_w)


def _kernel(modulated: bool) -> Any:
    def kernel(xp: Any, attrs: Attrs, data: Any, offset: Any, *rest: Any) -> Any:
        mask, (weight, *bias) = (rest[0], rest[1:]) if modulated else (None, rest)
        columns = sample_columns(xp, attrs, data, offset, mask, modulated)
        groups, filters = attrs.num_group, attrs.num_filter
        batch, rows, positions = columns.shape
        grouped = columns.reshape(batch, groups, rows // groups, positions)
        weights = weight.reshape(groups, filters // groups, -1)
        out = xp.matmul(weights[None], grouped).reshape(batch, filters, *offset.shape[2:])
        if bias:
            out += bias[0].reshape(1, filters, 1, 1)
        return out

    return kernel


def _params(modulated: bool) -> tuple[Param, ...]:
    params = (
        Param("kernel", parse_int_tuple),
        Param("stride", parse_int_tuple, ()),
        Param("dilate", parse_int_tuple, ()),
        Param("pad", parse_int_tuple, ()),
        Param("num_filter", parse_int),
        Param("num_group", parse_int, 1),
        Param("num_deformable_group", parse_int, 1),
        Param("workspace", parse_int, 1024),
        Param("no_bias", parse_bool, False),
        Param("layout", parse_conv_layout, None),
    )
    return (*params, Param("im2col_step", parse_int, 64)) if modulated else params


for _modulated, _name, _doc in (
        (False, "_contrib_DeformableConvolution",
         "Convolution whose kernel taps sample the input at learned offsets (DCN v1)."),
        (True, "_contrib_ModulatedDeformableConvolution",
         "Deformable convolution whose samples are also scaled by a learned mask (DCN v2).")):
    register(OpDef(
        name=_name,
        params=_params(_modulated),
        inputs=_inputs(_modulated),
        infer_shape=_infer(_modulated),
        infer_dtype=default_dtype,
        kernel=_kernel(_modulated),
        doc=_doc,
    ))
