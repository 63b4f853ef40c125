"""Multi-head attention matmuls over MXNet's interleaved projections (GluonNLP BERT exports).

GluonNLP projects queries, keys and values with one FullyConnected and hands the result to these
ops in ``(length, batch, heads * k * width)`` layout, where the last axis interleaves per head:
``[head 0: q, k, v][head 1: q, k, v]...`` for self-attention (k = 3) and ``[head 0: k, v]...`` for
the encoder-decoder keys and values (k = 2). Scores are ``(batch * heads, query, key)``; queries
are scaled by ``1 / sqrt(width)`` before the product.
"""

from __future__ import annotations

import math
from typing import Any

from engine.errors import ShapeError
from engine.ops.attrs import parse_int
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, Shape, register
from engine.ops.shapes import Inferred


def head_width(shape: Shape, heads: int, parts: int, what: str) -> int:
    """Per-head width of an interleaved ``(length, batch, heads * parts * width)`` input."""
    if len(shape) != 3:
        raise ShapeError(f"{what} must be 3-D (length, batch, features); got {shape}")
    if heads <= 0 or shape[2] % (heads * parts):
        raise ShapeError(f"{what} has {shape[2]} features; expected a multiple of "
                         f"heads * {parts} = {heads * parts}")
    return shape[2] // (heads * parts)


def split_heads(xp: Any, array: Any, heads: int, parts: int, part: int) -> Any:
    """Part ``part`` of each head as ``(batch * heads, length, width)``."""
    length, batch, features = array.shape
    width = features // (heads * parts)
    chosen = array.reshape(length, batch, heads, parts, width)[:, :, :, part, :]
    return xp.ascontiguousarray(chosen.transpose(1, 2, 0, 3)).reshape(batch * heads, length,
                                                                        width)


def merge_heads(xp: Any, array: Any, heads: int) -> Any:
    """``(batch * heads, length, width)`` back to ``(length, batch, heads * width)``."""
    batch_heads, length, width = array.shape
    split = array.reshape(batch_heads // heads, heads, length, width)
    return xp.ascontiguousarray(split.transpose(2, 0, 1, 3)).reshape(
        length, batch_heads // heads, heads * width)


def _scaled_scores(xp: Any, queries: Any, keys: Any) -> Any:
    scale = queries.dtype.type(1.0 / math.sqrt(queries.shape[-1]))
    return xp.matmul(queries * scale, keys.transpose(0, 2, 1))


# --- self-attention ---------------------------------------------------------------------------

def _selfatt_qk_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    qkv = shapes[0]
    if qkv is None:
        return shapes, [None]
    head_width(qkv, attrs.heads, 3, "interleaved_matmul_selfatt_qk queries_keys_values")
    return shapes, [(qkv[1] * attrs.heads, qkv[0], qkv[0])]


def _selfatt_qk_kernel(xp: Any, attrs: Attrs, qkv: Any) -> Any:
    queries = split_heads(xp, qkv, attrs.heads, 3, 0)
    return _scaled_scores(xp, queries, split_heads(xp, qkv, attrs.heads, 3, 1))


def _selfatt_valatt_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    qkv, attention = shapes
    if qkv is None:
        return shapes, [None]
    width = head_width(qkv, attrs.heads, 3, "interleaved_matmul_selfatt_valatt "
                                            "queries_keys_values")
    expected = (qkv[1] * attrs.heads, qkv[0], qkv[0])
    if attention is not None and attention != expected:
        raise ShapeError(f"interleaved_matmul_selfatt_valatt: attention has shape {attention}; "
                         f"expected {expected}")
    return [qkv, expected], [(qkv[0], qkv[1], attrs.heads * width)]


def _selfatt_valatt_kernel(xp: Any, attrs: Attrs, qkv: Any, attention: Any) -> Any:
    values = split_heads(xp, qkv, attrs.heads, 3, 2)
    return merge_heads(xp, xp.matmul(attention, values), attrs.heads)


# --- encoder-decoder attention ----------------------------------------------------------------

def _encdec_qk_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    queries, keys_values = shapes
    if queries is None or keys_values is None:
        return shapes, [None]
    width = head_width(queries, attrs.heads, 1, "interleaved_matmul_encdec_qk queries")
    if head_width(keys_values, attrs.heads, 2, "interleaved_matmul_encdec_qk keys_values") \
            != width or keys_values[1] != queries[1]:
        raise ShapeError(f"interleaved_matmul_encdec_qk: queries {queries} and keys_values "
                         f"{keys_values} disagree on batch or per-head width")
    return shapes, [(queries[1] * attrs.heads, queries[0], keys_values[0])]


def _encdec_qk_kernel(xp: Any, attrs: Attrs, queries: Any, keys_values: Any) -> Any:
    return _scaled_scores(xp, split_heads(xp, queries, attrs.heads, 1, 0),
                          split_heads(xp, keys_values, attrs.heads, 2, 0))


def _encdec_valatt_infer(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    keys_values, attention = shapes
    if keys_values is None or attention is None:
        return shapes, [None]
    width = head_width(keys_values, attrs.heads, 2, "interleaved_matmul_encdec_valatt "
                                                    "keys_values")
    if len(attention) != 3 or attention[0] != keys_values[1] * attrs.heads \
            or attention[2] != keys_values[0]:
        raise ShapeError(f"interleaved_matmul_encdec_valatt: attention has shape {attention}; "
                         f"expected ({keys_values[1] * attrs.heads}, queries, {keys_values[0]})")
    return shapes, [(attention[1], keys_values[1], attrs.heads * width)]


def _encdec_valatt_kernel(xp: Any, attrs: Attrs, keys_values: Any, attention: Any) -> Any:
    values = split_heads(xp, keys_values, attrs.heads, 2, 1)
    return merge_heads(xp, xp.matmul(attention, values), attrs.heads)


HEADS = (Param("heads", parse_int),)
for _name, _inputs, _infer, _kernel, _doc in (
    ("_contrib_interleaved_matmul_selfatt_qk", ("queries_keys_values",), _selfatt_qk_infer,
     _selfatt_qk_kernel, "Scaled query-key scores of interleaved self-attention projections."),
    ("_contrib_interleaved_matmul_selfatt_valatt", ("queries_keys_values", "attention"),
     _selfatt_valatt_infer, _selfatt_valatt_kernel,
     "Attention-weighted values of interleaved self-attention projections."),
    ("_contrib_interleaved_matmul_encdec_qk", ("queries", "keys_values"), _encdec_qk_infer,
     _encdec_qk_kernel, "Scaled query-key scores against interleaved encoder keys/values."),
    ("_contrib_interleaved_matmul_encdec_valatt", ("keys_values", "attention"),
     _encdec_valatt_infer, _encdec_valatt_kernel,
     "Attention-weighted values of interleaved encoder keys/values."),
):
    register(OpDef(name=_name, params=HEADS, inputs=_inputs, infer_shape=_infer,
                   infer_dtype=lambda attrs, dtypes: (dtypes, [dtypes[0]]), kernel=_kernel,
                   doc=_doc))


register(OpDef(
    name="_contrib_div_sqrt_dim",
    infer_shape=lambda attrs, shapes: (shapes, [shapes[0]]),
    kernel=lambda xp, attrs, data: data / data.dtype.type(math.sqrt(data.shape[-1])),
    doc="data divided by the square root of its last dimension (attention score scaling).",
))
