"""RNN and _rnn_param_concat: flat parameter size inference, state shapes, a reference LSTM."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import ModelFormatError, ShapeError
from engine.ops import Attrs, get_op
from engine.ops.nn.rnn import param_size

RNN = get_op("RNN")


def attrs_of(**raw: str) -> Attrs:
    return RNN.parse_attrs({"num_layers": "1", **raw})


def inputs_of(attrs: Attrs) -> tuple[str, ...]:
    return RNN.input_names(attrs)


@pytest.mark.parametrize(("raw", "width", "size"), [
    ({"mode": "lstm", "state_size": "4"}, 3, 144),
    ({"mode": "lstm", "state_size": "4", "num_layers": "2", "bidirectional": "True"}, 3, 736),
    ({"mode": "gru", "state_size": "4", "num_layers": "2"}, 3, 228),
    ({"mode": "rnn_relu", "state_size": "4", "num_layers": "2", "bidirectional": "True"}, 3, 184),
    ({"mode": "lstm", "state_size": "32"}, 16, 6400),
])
def test_parameter_size_inferred_from_data_and_back(raw: dict, width: int, size: int) -> None:
    attrs = attrs_of(**raw)
    assert param_size(attrs, width) == size
    inputs, _ = RNN.infer_shape(attrs, [(5, 2, width), None, *[None] * (len(inputs_of(attrs)) - 2)])
    assert inputs[1] == (size,)
    inputs, _ = RNN.infer_shape(attrs, [(5, 2, 0), (size,), *[None] * (len(inputs_of(attrs)) - 2)])
    assert inputs[0] == (5, 2, width)


def test_state_shapes_and_batch_from_zeros_placeholder() -> None:
    attrs = attrs_of(mode="lstm", state_size="32", state_outputs="True")
    assert inputs_of(attrs) == ("data", "parameters", "state", "state_cell")
    assert RNN.output_names(attrs) == ("output", "state_output", "statecell_output")
    inputs, outputs = RNN.infer_shape(attrs, [(7, 2, 16), None, (1, 0, 32), (1, 0, 32)])
    assert inputs == [(7, 2, 16), (6400,), (1, 2, 32), (1, 2, 32)]
    assert outputs == [(7, 2, 32), (1, 2, 32), (1, 2, 32)]
    inputs, outputs = RNN.infer_shape(attrs, [(7, 0, 16), None, (1, 3, 32), None])
    assert inputs[0] == (7, 3, 16) and outputs[0] == (7, 3, 32)


def test_gru_bidirectional_outputs_and_sequence_length_input() -> None:
    attrs = attrs_of(mode="gru", state_size="4", bidirectional="True", state_outputs="True",
                     use_sequence_length="True")
    assert inputs_of(attrs) == ("data", "parameters", "state", "sequence_length")
    inputs, outputs = RNN.infer_shape(attrs, [(5, 2, 3), None, None, None])
    assert inputs[2:] == [(2, 2, 4), (2,)]
    assert outputs == [(5, 2, 8), (2, 2, 4)]
    in_dtypes, out_dtypes = RNN.infer_dtype(attrs, [np.dtype(np.float32), None, None, None])
    assert in_dtypes[3] == np.dtype(np.int32) and out_dtypes == [np.dtype(np.float32)] * 2


def test_bad_parameter_length_and_projection_are_clear_errors() -> None:
    attrs = attrs_of(mode="lstm", state_size="4")
    with pytest.raises(ShapeError, match="parameters"):
        RNN.infer_shape(attrs, [(5, 2, 3), (100,), None, None])
    with pytest.raises(ShapeError, match="fits no input width"):
        RNN.infer_shape(attrs, [None, (101,), None, None])
    with pytest.raises(ModelFormatError, match="projection_size"):
        RNN.parse_attrs({"mode": "lstm", "state_size": "4", "num_layers": "1",
                         "projection_size": "2"})


def reference_lstm(x, flat, h, c, hidden):
    """A one-layer unidirectional LSTM, one sample and one step at a time."""
    width = x.shape[2]
    w_x = flat[:4 * hidden * width].reshape(4 * hidden, width)
    offset = 4 * hidden * width
    w_h = flat[offset:offset + 4 * hidden * hidden].reshape(4 * hidden, hidden)
    offset += 4 * hidden * hidden
    bias = flat[offset:offset + 4 * hidden] + flat[offset + 4 * hidden:]
    out = np.zeros((x.shape[0], x.shape[1], hidden))
    h, c = h.astype(np.float64).copy(), c.astype(np.float64).copy()
    for t in range(x.shape[0]):
        for n in range(x.shape[1]):
            gates = w_x @ x[t, n] + w_h @ h[n] + bias
            i, f, g, o = np.split(gates, 4)
            c[n] = 1 / (1 + np.exp(-f)) * c[n] + 1 / (1 + np.exp(-i)) * np.tanh(g)
            h[n] = 1 / (1 + np.exp(-o)) * np.tanh(c[n])
            out[t, n] = h[n]
    return out, h, c


def test_lstm_matches_reference_and_sequence_length_stops_state() -> None:
    rng = np.random.default_rng(0)
    hidden = 3
    x = rng.normal(size=(4, 2, 5)).astype(np.float32)
    flat = rng.normal(scale=0.5, size=4 * hidden * (5 + hidden + 2)).astype(np.float32)
    h0 = rng.normal(size=(1, 2, hidden)).astype(np.float32)
    c0 = rng.normal(size=(1, 2, hidden)).astype(np.float32)
    attrs = attrs_of(mode="lstm", state_size="3", state_outputs="True",
                     use_sequence_length="True")
    lengths = np.array([4, 2], np.float32)
    out, hy, cy = RNN.compute(np, attrs, [x, flat, h0, c0, lengths])
    full, h_full, c_full = reference_lstm(x, flat, h0[0], c0[0], hidden)
    short, h_short, c_short = reference_lstm(x[:2, 1:], flat, h0[:, 1], c0[:, 1], hidden)
    np.testing.assert_allclose(out[:, 0], full[:, 0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[:2, 1], short[:, 0], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out[2:, 1], 0)
    np.testing.assert_allclose(hy[0], [h_full[0], h_short[0]], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cy[0], [c_full[0], c_short[0]], rtol=1e-5, atol=1e-6)


def test_param_concat_fills_one_unknown_input_from_the_output() -> None:
    op = get_op("_rnn_param_concat")
    attrs = op.parse_attrs({"num_args": "4", "dim": "0"})
    assert op.input_names(attrs) == ("arg0", "arg1", "arg2", "arg3")
    shapes = [(0,), (4096,), (128,), (128,)]
    assert op.infer_shape(attrs, shapes) == (shapes, [(0,)])
    inputs, outputs = op.infer_shape(attrs, [None, (4096,), (128,), (128,)], [(6400,)])
    assert inputs == [(2048,), (4096,), (128,), (128,)] and outputs == [(6400,)]
    with pytest.raises(ShapeError, match="the output has"):
        op.infer_shape(attrs, [(10,), (4096,), (128,), (128,)], [(6400,)])
    parts = [np.arange(n, dtype=np.float32) for n in (2, 3)]
    two = op.parse_attrs({"num_args": "2", "dim": "0"})
    np.testing.assert_array_equal(op.compute(np, two, parts)[0], np.concatenate(parts))
