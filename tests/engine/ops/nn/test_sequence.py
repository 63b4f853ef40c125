"""Sequence ops against a loop over the batch."""

from __future__ import annotations

import numpy as np

from engine.ops import get_op
from tests.engine.ops.helpers import infer, run

RNG = np.random.default_rng(11)


def normal(*shape: int) -> np.ndarray:
    return RNG.normal(size=shape).astype(np.float32)


def test_sequence_last_both_axes() -> None:
    data = normal(5, 3, 2)  # (time, batch, feature)
    lengths = np.array([5.0, 1.0, 3.0], np.float32)
    raw = {"use_sequence_length": "True"}
    (out,) = run("SequenceLast", raw, data, lengths)
    np.testing.assert_array_equal(out, data[[4, 0, 2], [0, 1, 2]])
    (out,) = run("SequenceLast", {**raw, "axis": "1"}, data.transpose(1, 0, 2), lengths)
    np.testing.assert_array_equal(out, data[[4, 0, 2], [0, 1, 2]])
    assert infer("SequenceLast", {**raw, "axis": "1"}, [(3, 5, 2), None]) == (
        [(3, 5, 2), (3,)], [(3, 2)])
    assert get_op("SequenceLast").input_names(get_op("SequenceLast").parse_attrs({})) == (
        "data",)


def test_sequence_mask_and_reverse_match_a_loop() -> None:
    data = normal(4, 3, 2)
    lengths = np.array([2.0, 4.0, 1.0], np.float32)
    raw = {"use_sequence_length": "True", "value": "-9"}
    masked = data.copy()
    reversed_ = data.copy()
    for b, length in enumerate(lengths.astype(int)):
        masked[length:, b] = -9
        reversed_[:length, b] = data[:length, b][::-1]
    (out,) = run("SequenceMask", raw, data, lengths)
    np.testing.assert_array_equal(out, masked)
    (out,) = run("SequenceMask", {**raw, "axis": "1"}, data.transpose(1, 0, 2), lengths)
    np.testing.assert_array_equal(out, masked.transpose(1, 0, 2))
    (out,) = run("SequenceReverse", {"use_sequence_length": "True"}, data, lengths)
    np.testing.assert_array_equal(out, reversed_)
    (out,) = run("SequenceReverse", {}, data)
    np.testing.assert_array_equal(out, data[::-1])
