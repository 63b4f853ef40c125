"""``_contrib_AdaptiveAvgPooling2D``: average pooling to a fixed output size.

Output cell ``i`` of an axis of length ``n`` pooled to ``m`` averages input rows
``[floor(i * n / m), ceil((i + 1) * n / m))``, so neighbouring cells may overlap. The kernel
writes that as two small averaging matrices, ``rows @ data @ cols.T``, which runs unchanged on
numpy and cupy; the matrices depend on the shape only, so a device gets them uploaded once.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.kernels.workspace import uploaded
from engine.ops.attrs import parse_int_tuple
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred


def output_size(attrs: Attrs) -> tuple[int, int]:
    """(height, width) of the output: empty means 1x1, one value means a square."""
    size = attrs.output_size
    if len(size) == 0:
        return 1, 1
    if len(size) == 1:
        return size[0], size[0]
    if len(size) == 2 and min(size) > 0:
        return size[0], size[1]
    raise ShapeError(f"AdaptiveAvgPooling2D: output_size {size} must be empty, one positive "
                     "value or two")


def averaging_matrix(length: int, cells: int, dtype: Any = np.float64) -> np.ndarray:
    """``(cells, length)`` weights: row i averages its input span uniformly."""
    weights = np.zeros((cells, length), np.float64)
    for cell in range(cells):
        begin = (cell * length) // cells
        end = -((-(cell + 1) * length) // cells)  # ceil division
        weights[cell, begin:end] = 1.0 / (end - begin)
    return weights.astype(dtype, copy=False)


def _infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data = shapes[0]
    if data is None:
        return shapes, [None]
    if len(data) != 4:
        raise ShapeError(f"AdaptiveAvgPooling2D: data must be 4-D (N, C, H, W); got {data}")
    return shapes, [(data[0], data[1], *output_size(attrs))]


def _matrix(xp: Any, length: int, cells: int, dtype: Any) -> Any:
    key = ("adaptive_avg", length, cells, np.dtype(dtype).str)
    return uploaded(xp, key, partial(averaging_matrix, length, cells, dtype))


def _kernel(xp: Any, attrs: Attrs, data: Any) -> Any:
    height, width = output_size(attrs)
    rows = _matrix(xp, data.shape[2], height, data.dtype)
    cols = _matrix(xp, data.shape[3], width, data.dtype)
    return xp.matmul(xp.matmul(rows, data), cols.T)


register(OpDef(
    name="_contrib_AdaptiveAvgPooling2D",
    params=(Param("output_size", parse_int_tuple, ()),),
    infer_shape=_infer,
    kernel=_kernel,
    doc="Average pooling of (N, C, H, W) data to output_size, with adaptive, overlapping bins.",
))
