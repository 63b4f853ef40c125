"""Loss heads and gradient markers saved with trained networks: SVMOutput, MakeLoss, make_loss,
softmax_cross_entropy and _contrib_gradientmultiplier.

Their forward is what MXNet's forward returns. SVMOutput, MakeLoss, make_loss and the gradient
multiplier only shape the backward pass, so their forward passes the data through; their
attributes (margin, grad_scale, normalization, scalar...) are kept and have no effect here.
softmax_cross_entropy returns the summed loss itself. (SoftmaxOutput and the regression heads
live in `activation`.)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.ops.attrs import choice, parse_bool, parse_float
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, default_dtype, emit, register
from engine.ops.shapes import Inferred, merge

DTypes = list["np.dtype | None"]


def _pass_through(xp: Any, attrs: Attrs, data: Any, *ignored: Any, out: Any = None) -> Any:
    return emit(xp, data, out)


def _same_shape(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    return shapes, [shapes[0]]


# --- SVMOutput --------------------------------------------------------------------------------

def _svm_shape(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data, label = shapes
    if data is not None:
        # One class score vector per label: the label drops the data's last axis.
        label = merge(label, tuple(data[:-1]), "SVMOutput label (data without its last axis)")
    return [data, label], [data]


def _label_dtype(attrs: Attrs, dtypes: DTypes) -> tuple[DTypes, DTypes]:
    data, label = dtypes
    data = label if data is None else data
    return [data, data if label is None else label], [data]


register(OpDef(
    name="SVMOutput",
    params=(
        Param("margin", parse_float, 1.0),
        Param("regularization_coefficient", parse_float, 1.0),
        Param("use_linear", parse_bool, False),
    ),
    inputs=("data", "label"),
    infer_shape=_svm_shape,
    infer_dtype=_label_dtype,
    kernel=_pass_through,
    writes_out=True,
    doc="SVM loss head: the scores pass through at inference; the label is not read.",
))


# --- MakeLoss, make_loss, _contrib_gradientmultiplier -----------------------------------------

def _floating_only(attrs: Attrs, dtypes: DTypes) -> tuple[DTypes, DTypes]:
    data = dtypes[0]
    if data is not None and np.dtype(data).kind != "f":
        raise ShapeError(f"MakeLoss takes floating-point data only (as MXNet); "
                               f"got {np.dtype(data).name}")
    return dtypes, [data]


register(OpDef(
    name="MakeLoss",
    params=(
        Param("grad_scale", parse_float, 1.0),
        Param("valid_thresh", parse_float, 0.0),
        Param("normalization", choice("null", "batch", "valid"), "null"),
    ),
    infer_shape=_same_shape,
    infer_dtype=_floating_only,
    kernel=_pass_through,
    writes_out=True,
    doc="Marks its input as a loss for training; the data passes through at inference.",
))

register(OpDef(
    name="make_loss",
    infer_shape=_same_shape,
    kernel=_pass_through,
    writes_out=True,
    doc="Marks its input as a loss for training (no attributes); the data passes through.",
))

register(OpDef(
    name="_contrib_gradientmultiplier",
    params=(
        Param("scalar", parse_float, 1.0),
        Param("is_int", parse_bool, True),
    ),
    infer_shape=_same_shape,
    kernel=_pass_through,
    writes_out=True,
    doc="Scales the gradient flowing back by scalar; the forward is the identity.",
))


# --- softmax_cross_entropy --------------------------------------------------------------------

def _cross_entropy_shape(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data, label = shapes
    if data is not None:
        if len(data) != 2:
            raise ShapeError(f"softmax_cross_entropy takes 2-D data (batch, classes); "
                             f"got shape {data}")
        label = merge(label, (data[0],), "softmax_cross_entropy label (one class per row)")
    return [data, label], [(1,)]


def _cross_entropy_kernel(xp: Any, attrs: Attrs, data: Any, label: Any) -> Any:
    # Half precision accumulates in float32; the loss is cast back to the data's dtype.
    x = data.astype(np.result_type(data.dtype, np.float32), copy=False)
    shifted = x - x.max(axis=1, keepdims=True)
    log_probs = shifted - xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))
    # MXNet truncates a fractional label to its class index.
    classes = label.astype(np.int64)
    inside = (classes >= 0) & (classes < x.shape[1])
    picked = xp.take_along_axis(log_probs, xp.where(inside, classes, 0)[:, None], axis=1)[:, 0]
    # MXNet reads past the row for a label outside [0, classes): no defined loss, so NaN.
    losses = xp.where(inside, -picked, xp.nan)
    return losses.sum(keepdims=True).astype(data.dtype, copy=False)


register(OpDef(
    name="softmax_cross_entropy",
    inputs=("data", "label"),
    infer_shape=_cross_entropy_shape,
    infer_dtype=default_dtype,
    kernel=_cross_entropy_kernel,
    doc="Cross-entropy of softmax(data) against class labels, summed over the batch: shape (1,).",
))
