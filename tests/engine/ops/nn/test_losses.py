"""Loss heads and SoftmaxActivation beyond the MXNet cases: CTC against every alignment spelled
out, the rank rules of SoftmaxActivation, and the errors for inputs MXNet refuses."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from engine.errors import ShapeError
from engine.ops import get_op
from tests.engine.ops.helpers import infer, run, run_op

RNG = np.random.default_rng(38)


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("shape", [(2, 3, 4), (2, 3, 4, 5)])
def test_softmax_activation_instance_mode_softmaxes_the_last_axis(shape: tuple) -> None:
    x = RNG.normal(size=shape).astype(np.float32)
    result = run_op("SoftmaxActivation", {}, [x])
    np.testing.assert_allclose(result, _softmax(x, -1), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(result.sum(axis=-1), 1.0, rtol=1e-5)


def test_softmax_activation_channel_mode_softmaxes_axis_1() -> None:
    x = RNG.normal(size=(2, 3, 4, 5)).astype(np.float32)
    result = run_op("SoftmaxActivation", {"mode": "channel"}, [x])
    np.testing.assert_allclose(result, _softmax(x, 1), rtol=1e-5, atol=1e-7)


def test_softmax_activation_channel_mode_needs_three_axes() -> None:
    with pytest.raises(ShapeError, match=r"mode='channel' needs data with at least 3 axes.*"
                                         r"\(4, 5\)"):
        infer("SoftmaxActivation", {"mode": "channel"}, [(4, 5)])


def _ctc_by_enumeration(logits: np.ndarray, label: list[int], blank: int) -> float:
    """-log of the summed probability of every frame-wise path that collapses to ``label``."""
    frames, alphabet = logits.shape
    probs = _softmax(logits.astype(np.float64), -1)
    total = 0.0
    for path in itertools.product(range(alphabet), repeat=frames):
        collapsed = [symbol for k, symbol in enumerate(path)
                     if symbol != blank and (k == 0 or symbol != path[k - 1])]
        if collapsed == label:
            total += float(np.prod(probs[np.arange(frames), path]))
    return -np.log(total) if total > 0 else 0.0


@pytest.mark.parametrize("blank_label", ["first", "last"])
def test_ctc_loss_sums_every_alignment(blank_label: str) -> None:
    frames, alphabet = 5, 4
    blank = 0 if blank_label == "first" else alphabet - 1
    padding = 0 if blank_label == "first" else -1
    symbols = [s for s in range(alphabet) if s != blank]
    labels = [[symbols[0], symbols[1], symbols[1]], [symbols[2]], [symbols[0], symbols[2]]]
    data = RNG.normal(size=(frames, len(labels), alphabet)).astype(np.float32) * 2
    padded = np.array([label + [padding] * (3 - len(label)) for label in labels], np.float32)
    (loss,) = run("CTCLoss", {"blank_label": blank_label}, data, padded)
    expected = [_ctc_by_enumeration(data[:, n], label, blank) for n, label in enumerate(labels)]
    np.testing.assert_allclose(loss, expected, rtol=1e-5)


def test_ctc_loss_lengths_cut_data_and_labels() -> None:
    data = RNG.normal(size=(5, 2, 4)).astype(np.float32)
    label = np.array([[1, 2, 3], [3, 1, 2]], np.float32)
    attrs = {"use_data_lengths": "True", "use_label_lengths": "True"}
    (loss,) = run("CTCLoss", attrs, data, label, np.array([4, 3], np.float32),
                  np.array([2, 1], np.float32))
    expected = [_ctc_by_enumeration(data[:4, 0], [1, 2], 0),
                _ctc_by_enumeration(data[:3, 1], [3], 0)]
    np.testing.assert_allclose(loss, expected, rtol=1e-5)


def test_ctc_loss_is_zero_where_the_label_needs_more_frames_than_the_data_has() -> None:
    # [2, 2] needs three frames (2, blank, 2); the sequence has two.
    data = RNG.normal(size=(3, 1, 4)).astype(np.float32)
    (loss,) = run("CTCLoss", {"use_data_lengths": "True"}, data,
                  np.array([[2, 2]], np.float32), np.array([2], np.float32))
    assert loss.tolist() == [0.0]


def test_ctc_loss_gives_nan_for_a_symbol_outside_the_alphabet() -> None:
    data = RNG.normal(size=(4, 2, 3)).astype(np.float32)
    (loss,) = run("CTCLoss", {}, data, np.array([[1, 7], [2, 1]], np.float32))
    assert np.isnan(loss[0]) and np.isfinite(loss[1])


def test_ctc_loss_shapes_and_their_errors() -> None:
    attrs = {"use_data_lengths": "True", "use_label_lengths": "True"}
    assert get_op("CTCLoss").input_names(get_op("CTCLoss").parse_attrs(attrs)) == (
        "data", "label", "data_lengths", "label_lengths")
    inputs, outputs = infer("CTCLoss", attrs, [(6, 3, 5), (3, 4), None, None])
    assert inputs == [(6, 3, 5), (3, 4), (3,), (3,)] and outputs == [(3,)]
    with pytest.raises(ShapeError, match="label length 7 exceeds the data's 6 time frames"):
        infer("CTCLoss", {}, [(6, 3, 5), (3, 7)])
    with pytest.raises(ShapeError, match=r"must be \(time, batch, alphabet\); got shape \(6, 5\)"):
        infer("CTCLoss", {}, [(6, 5), None])


def test_softmax_cross_entropy_sums_the_rows_losses() -> None:
    logits = RNG.normal(size=(3, 5)).astype(np.float32)
    label = np.array([4, 0, 2.6], np.float32)  # 2.6 reads as class 2
    (loss,) = run("softmax_cross_entropy", {}, logits, label)
    log_probs = np.log(_softmax(logits.astype(np.float64), 1))
    assert loss.shape == (1,)
    np.testing.assert_allclose(loss, [-(log_probs[0, 4] + log_probs[1, 0] + log_probs[2, 2])],
                               rtol=1e-5)
    (outside,) = run("softmax_cross_entropy", {}, logits, np.array([4, 5, 0], np.float32))
    assert np.isnan(outside[0])
    with pytest.raises(ShapeError, match=r"takes 2-D data \(batch, classes\); got shape"):
        infer("softmax_cross_entropy", {}, [(2, 3, 4), None])


@pytest.mark.parametrize("name", ["SVMOutput", "MakeLoss", "make_loss",
                                  "_contrib_gradientmultiplier"])
def test_pass_through_heads_copy_their_data(name: str) -> None:
    x = RNG.normal(size=(3, 4)).astype(np.float32)
    inputs = [x, np.zeros(3, np.float32)] if name == "SVMOutput" else [x]
    result = run_op(name, {}, inputs)
    np.testing.assert_array_equal(result, x)
    assert not np.shares_memory(result, x)


def test_svm_output_infers_its_label_and_make_loss_refuses_integers() -> None:
    assert infer("SVMOutput", {}, [(2, 3, 4), None])[0] == [(2, 3, 4), (2, 3)]
    op = get_op("MakeLoss")
    with pytest.raises(ShapeError, match="MakeLoss takes floating-point data only.*int32"):
        op.infer_dtype(op.parse_attrs({}), [np.dtype(np.int32)])


def test_ctc_loss_of_an_empty_label_is_the_all_blank_path() -> None:
    data = RNG.normal(size=(3, 2, 4)).astype(np.float32)
    (loss,) = run("CTCLoss", {"use_label_lengths": "True"}, data,
                  np.array([[1, 2], [3, 3]], np.float32), np.array([0, 0], np.float32))
    log_blank = np.log(_softmax(data.astype(np.float64), -1)[:, :, 0]).sum(axis=0)
    np.testing.assert_allclose(loss, -log_blank, rtol=1e-5)
    (empty,) = run("CTCLoss", {}, data, np.zeros((2, 0), np.float32))
    np.testing.assert_allclose(empty, -log_blank, rtol=1e-5)
