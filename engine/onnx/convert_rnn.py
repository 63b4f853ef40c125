"""The fused ``RNN`` op as one ONNX LSTM/GRU/RNN node per layer.

MXNet's flat parameter vector holds every weight matrix (layer by layer, direction inside each
layer, ``W_i2h`` before ``W_h2h``), then every bias in the same order. ONNX orders the gates
differently: LSTM i,o,f,c (MXNet i,f,g,o) and GRU z,r,h (MXNet r,z,n); cuDNN-style GRU, where
the reset gate multiplies ``W_hn h + b_hn``, is ONNX's ``linear_before_reset=1``.
"""

from __future__ import annotations

import numpy as np

from engine.onnx.context import NodeContext, converts

GATE_ORDER = {"lstm": [0, 3, 1, 2], "gru": [1, 0, 2], "rnn_tanh": [0], "rnn_relu": [0]}
ONNX_OP = {"lstm": "LSTM", "gru": "GRU", "rnn_tanh": "RNN", "rnn_relu": "RNN"}


def _reorder(matrix: np.ndarray, mode: str) -> np.ndarray:
    """Gate blocks (rows) of one MXNet weight or bias, in ONNX's order."""
    blocks = np.split(matrix, len(GATE_ORDER[mode]), axis=0)
    return np.concatenate([blocks[k] for k in GATE_ORDER[mode]], axis=0)


def unpack_parameters(flat: np.ndarray, mode: str, layers: int, dirs: int, hidden: int,
                      input_size: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """ONNX (W, R, B) per layer from MXNet's flat vector: W/R ``[dirs, gates*H, in]``."""
    gates = len(GATE_ORDER[mode])
    offset, weights = 0, []
    for layer in range(layers):
        width = input_size if layer == 0 else dirs * hidden
        for _ in range(dirs):
            pair = []
            for columns in (width, hidden):
                size = gates * hidden * columns
                pair.append(flat[offset:offset + size].reshape(gates * hidden, columns))
                offset += size
            weights.append(pair)
    biases = []
    for _ in range(layers * dirs):
        pair = []
        for _ in range(2):
            pair.append(flat[offset:offset + gates * hidden])
            offset += gates * hidden
        biases.append(pair)
    result = []
    for layer in range(layers):
        units = range(layer * dirs, (layer + 1) * dirs)
        w = np.stack([_reorder(weights[u][0], mode) for u in units])
        r = np.stack([_reorder(weights[u][1], mode) for u in units])
        b = np.stack([np.concatenate([_reorder(biases[u][0], mode), _reorder(biases[u][1], mode)])
                      for u in units])
        result.append((w, r, b))
    return result


@converts("RNN")
def rnn(ctx: NodeContext) -> list[str]:
    params = ctx.params
    if params.use_sequence_length:
        raise ctx.fail("use_sequence_length=True is not supported")
    if params.lstm_state_clip_min is not None or params.lstm_state_clip_max is not None:
        raise ctx.fail("lstm_state_clip_min/max have no ONNX equivalent")
    mode, dirs, hidden = params.mode, 2 if params.bidirectional else 1, int(params.state_size)
    layers = unpack_parameters(ctx.constant(1, "parameters").reshape(-1), mode,
                               int(params.num_layers), dirs, hidden, ctx.in_shapes[0][2])
    sequence, states, cells = ctx.inputs[0], [], []
    for index, (w, r, b) in enumerate(layers):
        sequence, state, cell = _layer(ctx, index, sequence, (w, r, b), dirs, hidden)
        states.append(state)
        cells.append(cell)
    if not params.state_outputs:
        return [sequence]
    outputs = [sequence, _join(ctx, states)]
    return outputs + ([_join(ctx, cells)] if mode == "lstm" else [])


def _layer(ctx: NodeContext, index: int, sequence: str, weights: tuple, dirs: int,
           hidden: int) -> tuple[str, str, str | None]:
    mode = ctx.params.mode
    dtype = ctx.in_dtypes[0]
    w, r, b = (ctx.builder.const(array.astype(dtype), f"{ctx.hint}_l{index}_{name}")
               for array, name in zip(weights, "WRB"))
    inputs = [sequence, w, r, b, "", _state_slice(ctx, 2, index, dirs)]
    attrs: dict = {"hidden_size": hidden,
                   "direction": "bidirectional" if dirs == 2 else "forward"}
    if mode == "lstm":
        inputs.append(_state_slice(ctx, 3, index, dirs))
    elif mode == "gru":
        attrs["linear_before_reset"] = 1
    else:
        attrs["activations"] = ["Relu" if mode == "rnn_relu" else "Tanh"] * dirs
    count = 3 if mode == "lstm" else 2
    outputs = ctx.op(ONNX_OP[mode], inputs, outputs=count, **attrs)
    # Y is (seq, dirs, batch, hidden); MXNet's output is (seq, batch, dirs * hidden).
    merged = ctx.op("Transpose", [outputs[0]], perm=[0, 2, 1, 3])
    merged = ctx.op("Reshape", [merged, ctx.ints([0, 0, -1])])
    return merged, outputs[1], outputs[2] if mode == "lstm" else None


def _state_slice(ctx: NodeContext, input_index: int, layer: int, dirs: int) -> str:
    if ctx.params.num_layers == 1:
        return ctx.inputs[input_index]
    return ctx.op("Slice", [ctx.inputs[input_index], ctx.ints([layer * dirs]),
                            ctx.ints([(layer + 1) * dirs]), ctx.ints([0])])


def _join(ctx: NodeContext, parts: list) -> str:
    return parts[0] if len(parts) == 1 else ctx.op("Concat", parts, axis=0)
