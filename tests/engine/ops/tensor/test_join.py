"""Concat, stack and split: partial shapes, input and output names, writing into out."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import ShapeError
from engine.ops import get_op
from tests.engine.ops.helpers import infer, run

RNG = np.random.default_rng(7)


def test_concat_partial_shapes_and_input_names() -> None:
    op = get_op("Concat")
    attrs = op.parse_attrs({"num_args": "3"})
    assert op.input_names(attrs) == ("arg0", "arg1", "arg2")
    inputs, outputs = op.infer_shape(attrs, [(2, 3, 4), None, (0, 5, 0)])
    assert inputs == [(2, 3, 4), (2, 0, 4), (2, 5, 4)]
    assert outputs == [(2, 0, 4)]
    inputs, outputs = op.infer_shape(attrs, [(2, 3, 4), (2, 1, 4), (0, 5, 0)])
    assert outputs == [(2, 9, 4)]
    with pytest.raises(ShapeError, match="Concat input shapes"):
        op.infer_shape(attrs, [(2, 3, 4), (3, 1, 4), (2, 1, 4)])


def test_concat_and_stack_write_into_out() -> None:
    parts = [RNG.normal(size=(2, k)).astype(np.float32) for k in (1, 2, 3)]
    op = get_op("concat")
    target = np.empty((2, 6), np.float32)
    op.compute(np, op.parse_attrs({"num_args": "3"}), parts, out=target)
    np.testing.assert_array_equal(target, np.concatenate(parts, axis=1))
    (out,) = run("stack", {"num_args": "2", "axis": "1"}, parts[1], parts[1] * 2)
    np.testing.assert_array_equal(out, np.stack([parts[1], parts[1] * 2], axis=1))


def test_slice_channel_outputs() -> None:
    op = get_op("split")
    attrs = op.parse_attrs({"num_outputs": "3", "axis": "1", "squeeze_axis": "True"})
    assert op.output_names(attrs) == ("output0", "output1", "output2")
    assert op.infer_dtype(attrs, [np.dtype(np.float16)])[1] == [np.dtype(np.float16)] * 3
    data = RNG.normal(size=(2, 3, 4)).astype(np.float32)
    outs = op.compute(np, attrs, [data])
    for k, out in enumerate(outs):
        np.testing.assert_array_equal(out, data[:, k])
    with pytest.raises(ShapeError, match="equal parts"):
        infer("SliceChannel", {"num_outputs": "2"}, [(2, 3)])
