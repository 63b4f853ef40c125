"""CTCLoss (``ctc_loss``, ``_contrib_CTCLoss``, ``_contrib_ctc_loss``): the connectionist
temporal classification loss of each sequence in a batch, as MXNet's forward returns it.

``data`` holds unnormalised activations (time, batch, alphabet); the log-softmax over the
alphabet is taken here, as MXNet does. The loss is ``-log p(label | data)``, summed over every
alignment by the forward (alpha) recursion over the label with a blank between symbols, in log
space and vectorised over the batch: one step per time frame.

Lengths: without ``label_lengths`` a label ends at its first padding value (0 when the blank is
the first symbol, -1 when it is the last); without ``data_lengths`` every sequence spans all
frames. A label that needs more frames than its sequence has (its length plus its repeated
neighbours) gets a loss of 0, as MXNet returns. Lengths past the arrays' extent are read as the
extent, and a label symbol outside the alphabet gives NaN: MXNet reads past its buffers there.
An empty label scores the path of blanks only (MXNet 1.9.1 returns uninitialised memory when
every label of a batch is empty).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.ops.attrs import choice, parse_bool
from engine.ops.dtypes import INT64
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import Inferred, merge

DTypes = list["np.dtype | None"]


def _inputs(attrs: Attrs) -> tuple[str, ...]:
    names = ["data", "label"]
    if attrs.use_data_lengths:
        names.append("data_lengths")
    if attrs.use_label_lengths:
        names.append("label_lengths")
    return tuple(names)


def _shape(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    data, label, *lengths = shapes
    if data is None:
        return shapes, [None]
    if len(data) != 3:
        raise ShapeError(f"CTCLoss data must be (time, batch, alphabet); got shape {data}")
    frames, batch, _ = data
    if label is not None:
        if len(label) != 2:
            raise ShapeError(f"CTCLoss label must be (batch, label length); got shape {label}")
        if frames and label[1] and label[1] > frames:
            raise ShapeError(f"CTCLoss label length {label[1]} exceeds the data's "
                             f"{frames} time frames")
        label = merge(label, (batch, label[1]), "CTCLoss label (batch, label length)")
    lengths = [merge(shape, (batch,), f"CTCLoss {name} (one per sequence)")
               for shape, name in zip(lengths, _inputs(attrs)[2:], strict=True)]
    return [data, label, *lengths], [(batch,)]


def _dtype(attrs: Attrs, dtypes: DTypes) -> tuple[DTypes, DTypes]:
    data = dtypes[0]
    return [data, *(data if dtype is None else dtype for dtype in dtypes[1:])], [data]


def _log_softmax(xp: Any, x: Any) -> Any:
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - xp.log(xp.exp(shifted).sum(axis=-1, keepdims=True))


def _label_lengths(xp: Any, label: Any, given: Any, padding: int) -> Any:
    width = label.shape[1]
    if given is not None:
        return xp.clip(given.astype(INT64), 0, width)
    if width == 0:
        return xp.zeros((label.shape[0],), dtype=INT64)
    is_padding = label == padding
    first = xp.argmax(is_padding, axis=1)
    return xp.where(is_padding.any(axis=1), first, width)


def _shifted(xp: Any, alpha: Any, by: int) -> Any:
    """alpha moved ``by`` states to the right along the label, -inf flowing in."""
    by = min(by, alpha.shape[1])
    filler = xp.full((alpha.shape[0], by), -xp.inf, dtype=alpha.dtype)
    return xp.concatenate([filler, alpha[:, :-by]], axis=1)


def _ctc_kernel(xp: Any, attrs: Attrs, data: Any, label: Any, *lengths: Any) -> Any:
    given = dict(zip(_inputs(attrs)[2:], lengths, strict=True))
    frames, batch, alphabet = data.shape
    compute = np.result_type(data.dtype, np.float32)
    log_probs = _log_softmax(xp, data.astype(compute, copy=False))
    blank, padding = (0, 0) if attrs.blank_label == "first" else (alphabet - 1, -1)
    symbols = label.astype(INT64)
    width = symbols.shape[1]
    label_len = _label_lengths(xp, symbols, given.get("label_lengths"), padding)
    data_len = (xp.full((batch,), frames, dtype=INT64) if "data_lengths" not in given
                else xp.clip(given["data_lengths"].astype(INT64), 0, frames))
    in_label = xp.arange(width)[None, :] < label_len[:, None]
    in_alphabet = (symbols >= 0) & (symbols < alphabet)
    unknown = ~in_alphabet & in_label

    # The extended label: blank, l1, blank, l2, ..., blank (2 * width + 1 states).
    states = 2 * width + 1
    extended = xp.full((batch, states), blank, dtype=INT64)
    extended[:, 1::2] = xp.where(in_alphabet, symbols, blank)
    # A state may be entered from two states back when it is a symbol unlike the previous one.
    skip = xp.zeros((batch, states), dtype=bool)
    skip[:, 3::2] = extended[:, 3::2] != extended[:, 1:-2:2]
    emitted = xp.take_along_axis(log_probs, xp.broadcast_to(extended, (frames, batch, states)),
                                 axis=2)

    alpha = xp.full((batch, states), -xp.inf, dtype=compute)
    alpha[:, :2] = emitted[0, :, :2]
    for t in range(1, frames):
        entered = xp.logaddexp(alpha, _shifted(xp, alpha, 1))
        entered = xp.logaddexp(entered, xp.where(skip, _shifted(xp, alpha, 2), -xp.inf))
        # A sequence past its own length keeps the alpha of its last frame.
        alpha = xp.where((t < data_len)[:, None], entered + emitted[t], alpha)

    # A path ends on the last symbol or on the blank after it.
    last = 2 * label_len
    ends = xp.take_along_axis(alpha, last[:, None], axis=1)[:, 0]
    before = xp.take_along_axis(alpha, xp.maximum(last - 1, 0)[:, None], axis=1)[:, 0]
    log_likelihood = xp.where(label_len > 0, xp.logaddexp(ends, before), ends)

    repeats = ((symbols[:, 1:] == symbols[:, :-1]) & in_label[:, 1:]).sum(axis=1)
    feasible = (label_len + repeats <= data_len) & (data_len > 0)
    loss = xp.where(feasible, -log_likelihood, 0)
    return xp.where(unknown.any(axis=1), xp.nan, loss).astype(data.dtype, copy=False)


register(OpDef(
    name="CTCLoss",
    aliases=("ctc_loss", "_contrib_CTCLoss", "_contrib_ctc_loss"),
    params=(
        Param("use_data_lengths", parse_bool, False),
        Param("use_label_lengths", parse_bool, False),
        Param("blank_label", choice("first", "last"), "first"),
    ),
    inputs=_inputs,
    hidden_outputs=1,
    batch_positions="reads axis 0 as time (its data is time, batch, alphabet)",
    infer_shape=_shape,
    infer_dtype=_dtype,
    kernel=_ctc_kernel,
    doc="CTC loss per sequence of (time, batch, alphabet) activations against padded labels.",
))
