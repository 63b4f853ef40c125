"""Cases for SoftmaxActivation at ranks above 2 and for the loss heads and gradient markers
saved with trained networks: SVMOutput, MakeLoss, make_loss, softmax_cross_entropy,
_contrib_gradientmultiplier and CTCLoss under its four names.

Written on their own with ``generate_ops.py --only heads`` (``ops_heads/``). The forward of a
loss head is what MXNet's forward returns: the data for SVMOutput and MakeLoss, the summed loss
for softmax_cross_entropy, the per-sequence loss for CTCLoss. CTC cases cover both blank
positions (and so both padding values), data and label lengths alone and together, repeated
symbols, and a sequence too short for its label (MXNet gives it a loss of 0). Label lengths of
0 are left out: MXNet 1.9.1 returns uninitialised memory when every label of a batch is empty.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from casefile import Case

Rng = Callable[[str], np.random.Generator]


def heads_cases(rng_for: Rng) -> list[Case]:
    """Every family of this topic."""
    return [*softmax_activation_cases(rng_for), *pass_through_cases(rng_for),
            *cross_entropy_cases(rng_for), *ctc_cases(rng_for)]


def softmax_activation_cases(rng_for: Rng) -> list[Case]:
    """Instance mode softmaxes the last axis at any rank; channel mode axis 1."""
    rng = rng_for("heads_softmax_activation")
    three = rng.standard_normal((2, 3, 4)).astype("f4")
    four = rng.standard_normal((2, 3, 4, 5)).astype("f4")
    return [
        Case("softmax_activation_instance_3d", "SoftmaxActivation", {"data": three}),
        Case("softmax_activation_instance_4d", "SoftmaxActivation", {"data": four},
             {"mode": "instance"}),
        Case("softmax_activation_channel_3d", "SoftmaxActivation", {"data": three},
             {"mode": "channel"}),
        Case("softmax_activation_channel_4d", "SoftmaxActivation", {"data": four},
             {"mode": "channel"}),
        Case("softmax_activation_instance_1d", "SoftmaxActivation",
             {"data": rng.standard_normal(6).astype("f4")}),
    ]


def pass_through_cases(rng_for: Rng) -> list[Case]:
    """Heads and markers whose forward is the identity, with their attributes set."""
    rng = rng_for("heads_pass_through")
    scores = rng.standard_normal((3, 5)).astype("f4")
    labels = np.array([0, 4, 2], "f4")
    cube = rng.standard_normal((2, 3, 4)).astype("f4")
    return [
        Case("svm_output", "SVMOutput", {"data": scores, "label": labels}),
        Case("svm_output_3d_linear", "SVMOutput",
             {"data": cube, "label": rng.integers(0, 4, (2, 3)).astype("f4")},
             {"margin": "2.5", "regularization_coefficient": "0.1", "use_linear": "True"}),
        Case("make_loss_op", "MakeLoss", {"data": scores}),
        Case("make_loss_op_valid", "MakeLoss", {"data": cube},
             {"grad_scale": "0.5", "normalization": "valid", "valid_thresh": "0.2"}),
        Case("make_loss_op_float16", "MakeLoss", {"data": scores.astype("f2")},
             {"normalization": "batch"}),
        Case("make_loss_plain", "make_loss", {"data": cube}),
        Case("gradientmultiplier", "_contrib_gradientmultiplier", {"data": cube},
             {"scalar": "-0.5", "is_int": "False"}),
        Case("gradientmultiplier_int32", "_contrib_gradientmultiplier",
             {"data": rng.integers(-9, 9, (3, 4)).astype("int32")}, {"scalar": "3"}),
    ]


def cross_entropy_cases(rng_for: Rng) -> list[Case]:
    """The summed loss (shape (1,)); a fractional label is truncated to its class."""
    rng = rng_for("heads_cross_entropy")
    logits = (rng.standard_normal((4, 6)) * 2).astype("f4")
    return [
        Case("softmax_cross_entropy", "softmax_cross_entropy",
             {"data": logits, "label": np.array([0, 5, 2, 3], "f4")}),
        Case("softmax_cross_entropy_fractional", "softmax_cross_entropy",
             {"data": logits, "label": np.array([0.7, 4.5, 1.2, 5.9], "f4")}),
        Case("softmax_cross_entropy_float16", "softmax_cross_entropy",
             {"data": logits[:2].astype("f2"), "label": np.array([1, 3], "f2")}),
    ]


def _ctc_data(rng: np.random.Generator, frames: int, batch: int, alphabet: int) -> np.ndarray:
    # Wide activations, so that the loss depends strongly on the alignment.
    return (rng.standard_normal((frames, batch, alphabet)) * 2).astype("f4")


def ctc_cases(rng_for: Rng) -> list[Case]:
    """CTCLoss with either blank, lengths from padding or given, repeats, infeasible rows."""
    rng = rng_for("heads_ctc")
    data = _ctc_data(rng, 6, 3, 5)
    # Blank first: labels use 1..4 and end at their first 0.
    first = np.array([[1, 2, 3], [4, 4, 0], [2, 0, 0]], "f4")
    # Blank last (4): labels use 0..3 and end at their first -1.
    last = np.array([[0, 1, 2], [3, 3, -1], [0, -1, -1]], "f4")
    long_data = _ctc_data(rng, 20, 2, 6)
    long_labels = np.array([[1, 2, 2, 3, 5, 1, 4], [5, 4, 3, 0, 0, 0, 0]], "f4")
    lengths = {"use_data_lengths": "True", "use_label_lengths": "True"}
    return [
        Case("ctc_loss_blank_first", "CTCLoss", {"data": data, "label": first}),
        Case("ctc_loss_blank_last", "CTCLoss", {"data": data, "label": last},
             {"blank_label": "last"}),
        Case("ctc_loss_data_lengths", "CTCLoss",
             {"data": data, "label": first, "data_lengths": np.array([6, 4, 1], "f4")},
             {"use_data_lengths": "True"}),
        Case("ctc_loss_label_lengths", "CTCLoss",
             {"data": data, "label": np.array([[1, 2, 3], [4, 4, 1], [2, 3, 2]], "f4"),
              "label_lengths": np.array([3, 2, 1], "f4")},
             {"use_label_lengths": "True"}),
        # Row 1 needs 3 frames (4, blank, 4) and has 2: MXNet's loss is 0 there.
        Case("ctc_loss_both_lengths_last", "CTCLoss",
             {"data": data, "label": np.array([[0, 1, 2], [3, 3, 0], [1, 2, 0]], "f4"),
              "data_lengths": np.array([5, 2, 6], "f4"),
              "label_lengths": np.array([3, 2, 2], "f4")},
             {**lengths, "blank_label": "last"}),
        Case("ctc_loss_long", "CTCLoss", {"data": long_data, "label": long_labels}),
        Case("ctc_loss_int32_labels", "CTCLoss",
             {"data": data, "label": first.astype("int32")}),
        Case("ctc_loss_alias_ctc_loss", "ctc_loss", {"data": data, "label": first}),
        Case("ctc_loss_alias_contrib_CTCLoss", "_contrib_CTCLoss",
             {"data": data, "label": last}, {"blank_label": "last"}),
        Case("ctc_loss_alias_contrib_ctc_loss", "_contrib_ctc_loss",
             {"data": data, "label": first, "data_lengths": np.array([3, 5, 6], "f4")},
             {"use_data_lengths": "True"}),
    ]
