"""The fused ``RNN`` operator (LSTM, GRU, vanilla RNN; TNC layout) and ``_rnn_param_concat``.

The flat ``parameters`` vector holds every weight matrix, then every bias: layer by layer, with
the direction inside each layer, ``W_i2h`` before ``W_h2h`` (and ``b_i2h`` before ``b_h2h``).
Gates are ordered i, f, g, o (LSTM) and r, z, n (GRU). States are indexed ``layer * dirs + dir``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.errors import ShapeError
from engine.ops.attrs import choice, optional, parse_bool, parse_float, parse_int
from engine.ops.math.stable_functions import sigmoid
from engine.ops.registry import Attrs, MaybeShape, OpDef, Param, register
from engine.ops.shapes import merge

ShapeResult = tuple[list[MaybeShape], list[MaybeShape]]
DTypeResult = tuple[list["np.dtype | None"], list["np.dtype | None"]]

GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


def _no_projection(value: Any) -> None:
    if value is None or (isinstance(value, str) and value.strip() == "None"):
        return None
    raise ValueError(f"LSTM projection (projection_size={value}) is not supported; "
                     "export the model without projection_size")


def _directions(attrs: Attrs) -> int:
    return 2 if attrs.bidirectional else 1


def _inputs(attrs: Attrs) -> tuple[str, ...]:
    names = ("data", "parameters", "state")
    if attrs.mode == "lstm":
        names += ("state_cell",)
    if attrs.use_sequence_length:
        names += ("sequence_length",)
    return names


def _outputs(attrs: Attrs) -> tuple[str, ...]:
    if not attrs.state_outputs:
        return ("output",)
    return ("output", "state_output", "statecell_output") if attrs.mode == "lstm" else (
        "output", "state_output")


def param_size(attrs: Attrs, input_size: int) -> int:
    """Length of the flat parameter vector for data of width ``input_size``."""
    gates, hidden, dirs = GATES[attrs.mode], attrs.state_size, _directions(attrs)
    first = dirs * gates * hidden * (input_size + hidden + 2)
    rest = (attrs.num_layers - 1) * dirs * gates * hidden * (dirs * hidden + hidden + 2)
    return first + rest


def _input_size_from(attrs: Attrs, size: int) -> int:
    """The data width that a flat parameter vector of ``size`` implies (0 if none fits)."""
    per_unit = _directions(attrs) * GATES[attrs.mode] * attrs.state_size
    remainder = size - param_size(attrs, 0)
    if remainder <= 0 or remainder % per_unit:
        return 0
    return remainder // per_unit


def _infer_shape(attrs: Attrs, shapes: list[MaybeShape]) -> ShapeResult:
    names = _inputs(attrs)
    hidden, dirs = attrs.state_size, _directions(attrs)
    data = merge(shapes[0], (0, 0, 0), "RNN data (seq_len, batch, input_size)")
    seq_len, batch, width = data if data is not None else (0, 0, 0)
    for name, shape in zip(names[2:], shapes[2:], strict=True):
        if name == "sequence_length":
            batch = merge(shape, (batch,), "RNN sequence_length (batch,)")[0]
        else:
            batch = merge(shape, (attrs.num_layers * dirs, batch, hidden),
                          f"RNN {name} (layers*directions, batch, state_size)")[1]
    params = shapes[1]
    if params is not None and params[0] and not width:
        width = _input_size_from(attrs, params[0])
        if not width:
            raise ShapeError(f"RNN parameters: length {params[0]} fits no input width for "
                             f"mode={attrs.mode}, state_size={hidden}, "
                             f"num_layers={attrs.num_layers}, directions={dirs}")
    expected = (param_size(attrs, width),) if width else (0,)
    params = merge(params, expected, f"RNN parameters (input width {width or 'unknown'})")
    data = (seq_len, batch, width)
    state = (attrs.num_layers * dirs, batch, hidden)
    inputs: list[MaybeShape] = [data, params]
    for name in names[2:]:
        inputs.append((batch,) if name == "sequence_length" else state)
    outputs: list[MaybeShape] = [(seq_len, batch, dirs * hidden)]
    outputs += [state] * (len(_outputs(attrs)) - 1)
    return inputs, outputs


def _infer_dtype(attrs: Attrs, dtypes: list[np.dtype | None]) -> DTypeResult:
    names = _inputs(attrs)
    known = next((dtype for name, dtype in zip(names, dtypes, strict=True)
                  if dtype is not None and name != "sequence_length"), None)
    inputs = [dtype if dtype is not None else (
        np.dtype(np.int32) if name == "sequence_length" else known)
        for name, dtype in zip(names, dtypes, strict=True)]
    return inputs, [known] * len(_outputs(attrs))


@dataclass(frozen=True)
class _Cell:
    """The weights of one layer and direction, sliced from the flat vector."""

    w_i2h: Any
    w_h2h: Any
    b_i2h: Any
    b_h2h: Any


def _unpack(attrs: Attrs, flat: Any, input_size: int) -> list[list[_Cell]]:
    """Cells indexed ``[layer][direction]`` as views into ``flat``."""
    gates, hidden, dirs = GATES[attrs.mode], attrs.state_size, _directions(attrs)
    rows = gates * hidden
    matrices, offset = [], 0
    for layer in range(attrs.num_layers):
        width = input_size if layer == 0 else dirs * hidden
        for _ in range(dirs):
            w_i2h = flat[offset:offset + rows * width].reshape(rows, width)
            offset += rows * width
            w_h2h = flat[offset:offset + rows * hidden].reshape(rows, hidden)
            offset += rows * hidden
            matrices.append((w_i2h, w_h2h))
    cells = []
    for w_i2h, w_h2h in matrices:
        b_i2h, b_h2h = flat[offset:offset + rows], flat[offset + rows:offset + 2 * rows]
        offset += 2 * rows
        cells.append(_Cell(w_i2h, w_h2h, b_i2h, b_h2h))
    if offset != flat.shape[0]:
        raise ShapeError(f"RNN parameters: expected {offset} values for input width "
                         f"{input_size}; got {flat.shape[0]}")
    return [cells[layer * dirs:(layer + 1) * dirs] for layer in range(attrs.num_layers)]


def _step(xp: Any, attrs: Attrs, projected: Any, recurrent: Any, h: Any, c: Any) -> tuple[Any,
                                                                                         Any]:
    """One time step: ``projected`` = x·W_i2hᵀ + b_i2h and ``recurrent`` = h·W_h2hᵀ + b_h2h."""
    hidden = attrs.state_size
    if attrs.mode == "lstm":
        gates = projected + recurrent
        i = sigmoid(xp, gates[:, :hidden])
        f = sigmoid(xp, gates[:, hidden:2 * hidden])
        g = xp.tanh(gates[:, 2 * hidden:3 * hidden])
        o = sigmoid(xp, gates[:, 3 * hidden:])
        c = f * c + i * g
        if attrs.lstm_state_clip_min is not None or attrs.lstm_state_clip_max is not None:
            c = xp.clip(c, attrs.lstm_state_clip_min, attrs.lstm_state_clip_max)
        return o * xp.tanh(c), c
    if attrs.mode == "gru":
        r = sigmoid(xp, projected[:, :hidden] + recurrent[:, :hidden])
        z = sigmoid(xp, projected[:, hidden:2 * hidden] + recurrent[:, hidden:2 * hidden])
        n = xp.tanh(projected[:, 2 * hidden:] + r * recurrent[:, 2 * hidden:])
        return (1 - z) * n + z * h, c
    total = projected + recurrent
    return (xp.tanh(total) if attrs.mode == "rnn_tanh" else xp.maximum(total, 0)), c


def _run_direction(xp: Any, attrs: Attrs, cell: _Cell, x: Any, h: Any, c: Any,
                   reverse: bool, lengths: Any) -> tuple[Any, Any, Any]:
    """Run one direction of one layer over all steps; return (outputs, final h, final c)."""
    seq_len = x.shape[0]
    # xp.matmul, not `@`: CuPy's operator would bypass the capturable GEMM (engine.cuda.blas).
    projected = (xp.matmul(x.reshape(-1, x.shape[2]), cell.w_i2h.T) + cell.b_i2h).reshape(
        seq_len, x.shape[1], -1)
    outputs = xp.zeros((seq_len, x.shape[1], attrs.state_size), dtype=x.dtype)
    steps = range(seq_len - 1, -1, -1) if reverse else range(seq_len)
    for t in steps:
        new_h, new_c = _step(xp, attrs, projected[t], xp.matmul(h, cell.w_h2h.T) + cell.b_h2h, h, c)
        if lengths is None:
            h, c = new_h, new_c
            outputs[t] = h
            continue
        # Steps at or past a sequence's length leave its state alone and output zeros.
        active = (t < lengths)[:, None]
        h = xp.where(active, new_h, h)
        if c is not None:
            c = xp.where(active, new_c, c)
        outputs[t] = xp.where(active, new_h, 0)
    return outputs, h, c


def _kernel(xp: Any, attrs: Attrs, data: Any, parameters: Any, state: Any,
            *rest: Any) -> Any:
    names = _inputs(attrs)[3:]
    extra = dict(zip(names, rest, strict=True))
    state_cell = extra.get("state_cell")
    lengths = extra.get("sequence_length")
    if lengths is not None:
        lengths = lengths.astype(np.int64)
    dtype = data.dtype if data.dtype.kind == "f" else np.dtype(np.float32)
    layer_input = data.astype(dtype, copy=False)
    flat = parameters.astype(dtype, copy=False)
    cells = _unpack(attrs, flat, data.shape[2])
    dirs = _directions(attrs)
    final_h, final_c = [], []
    for layer, layer_cells in enumerate(cells):
        pieces = []
        for direction, cell in enumerate(layer_cells):
            index = layer * dirs + direction
            c0 = None if state_cell is None else state_cell[index].astype(dtype, copy=False)
            out, h, c = _run_direction(xp, attrs, cell, layer_input,
                                       state[index].astype(dtype, copy=False), c0,
                                       direction == 1, lengths)
            pieces.append(out)
            final_h.append(h)
            final_c.append(c)
        layer_input = pieces[0] if dirs == 1 else xp.concatenate(pieces, axis=2)
    if not attrs.state_outputs:
        return layer_input
    results = (layer_input, xp.stack(final_h))
    if attrs.mode == "lstm":
        results += (xp.stack(final_c),)
    return results


RNN = register(OpDef(
    name="RNN",
    params=(
        Param("state_size", parse_int),
        Param("num_layers", parse_int),
        Param("mode", choice(*GATES)),
        Param("bidirectional", parse_bool, False),
        Param("state_outputs", parse_bool, False),
        Param("p", parse_float, 0.0),
        Param("projection_size", _no_projection, None),
        Param("lstm_state_clip_min", optional(parse_float), None),
        Param("lstm_state_clip_max", optional(parse_float), None),
        Param("lstm_state_clip_nan", parse_bool, False),
        Param("use_sequence_length", parse_bool, False),
    ),
    inputs=_inputs,
    outputs=_outputs,
    infer_shape=_infer_shape,
    infer_dtype=_infer_dtype,
    kernel=_kernel,
    doc="Fused multi-layer (bi)directional LSTM/GRU/RNN over TNC data with a flat parameter "
        "vector; dropout p is ignored at inference.",
))


# --- _rnn_param_concat -----------------------------------------------------------------------

def _concat_inputs(attrs: Attrs) -> tuple[str, ...]:
    return tuple(f"arg{index}" for index in range(attrs.num_args))


def _concat_shape(attrs: Attrs, shapes: list[MaybeShape],
                  outputs: list[MaybeShape] | None = None) -> ShapeResult:
    """Concat along ``dim``; with a known output (``outputs``, when the caller has one), a
    single input of unknown length gets the remainder, as Gluon's deferred LSTM weights need."""
    output = outputs[0] if outputs else None
    ndim = next((len(shape) for shape in [*shapes, output] if shape is not None), None)
    if ndim is None:
        return shapes, [None]
    dim = attrs.dim % ndim
    common: MaybeShape = (0,) * ndim
    for index, shape in enumerate([*shapes, output]):
        if shape is not None:
            what = f"_rnn_param_concat input arg{index}" if index < len(shapes) else (
                "_rnn_param_concat output")
            common = merge(common, (*shape[:dim], 0, *shape[dim + 1:]), what)
    lengths = [0 if shape is None else shape[dim] for shape in shapes]
    unknown = [index for index, length in enumerate(lengths) if not length]
    if output is not None and output[dim] and len(unknown) == 1:
        remainder = output[dim] - sum(lengths)
        if remainder <= 0:
            raise ShapeError(f"_rnn_param_concat: inputs already hold {sum(lengths)} values "
                             f"along dim {dim}; the output has {output[dim]}")
        lengths[unknown[0]] = remainder
    total = sum(lengths) if all(lengths) else 0
    if output is not None and output[dim] and total and total != output[dim]:
        raise ShapeError(f"_rnn_param_concat: inputs give {total} along dim {dim}; "
                         f"the output has {output[dim]}")
    filled: list[MaybeShape] = [(*common[:dim], length, *common[dim + 1:]) for length in lengths]
    return filled, [(*common[:dim], total, *common[dim + 1:])]


def _concat_kernel(xp: Any, attrs: Attrs, *arrays: Any) -> Any:
    return xp.concatenate(arrays, axis=attrs.dim)


RNN_PARAM_CONCAT = register(OpDef(
    name="_rnn_param_concat",
    params=(Param("num_args", parse_int), Param("dim", parse_int, 1)),
    inputs=_concat_inputs,
    infer_shape=_concat_shape,
    kernel=_concat_kernel,
    doc="Concatenation that packs RNN weights into the flat parameter vector.",
))
