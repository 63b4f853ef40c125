"""The GPU versions of box_nms and MultiBoxDetection (array ops only, so they can be captured)
against the CPU's sequential loops, on random records with tied scores and every attribute.

Both versions are written against an array module, so numpy runs the device one here; the
MXNet cases run it through the CuPy stand-in in `test_simulated_gpu`.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.ops.registry import get_op
from engine.ops.vision.multibox import _detect_one, detect_batches
from engine.ops.vision.nms import suppress_batches, suppress_rows


def _boxes(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    start = rng.uniform(0, 0.7, (*shape, 2))
    return np.concatenate([start, start + rng.uniform(0.05, 0.4, (*shape, 2))], axis=-1)


@st.composite
def nms_cases(draw: st.DrawFn) -> tuple[np.ndarray, dict[str, str]]:
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    batch, count = draw(st.integers(1, 3)), draw(st.integers(1, 24))
    ids = rng.integers(0, 3, (batch, count, 1))
    scores = rng.integers(0, 6, (batch, count, 1)) / 5  # ties: the sorts must be stable
    data = np.concatenate([ids, scores, _boxes(rng, (batch, count))], axis=-1)
    attrs = {"overlap_thresh": draw(st.sampled_from([0.1, 0.3, 0.5, 0.7])),
             "valid_thresh": draw(st.sampled_from([0.0, 0.2, 0.6])),
             "topk": draw(st.sampled_from([-1, 1, 5, 40])),
             "id_index": draw(st.sampled_from([-1, 0])),
             "background_id": draw(st.sampled_from([-1, 1])),
             "force_suppress": draw(st.booleans()),
             "in_format": draw(st.sampled_from(["corner", "center"])),
             "out_format": draw(st.sampled_from(["corner", "center"]))}
    return data.astype(np.float32), {key: str(value) for key, value in attrs.items()}


@settings(max_examples=120, deadline=None)
@given(nms_cases())
def test_box_nms_on_the_device_matches_the_host_loop(case: tuple) -> None:
    data, raw = case
    attrs = get_op("_contrib_box_nms").parse_attrs(raw)
    expected = np.stack([suppress_rows(rows, attrs) for rows in data])
    np.testing.assert_allclose(suppress_batches(np, data, attrs), expected, rtol=1e-6, atol=1e-7)


@st.composite
def detection_cases(draw: st.DrawFn) -> tuple[tuple[np.ndarray, ...], dict[str, str]]:
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    batch, classes, count = draw(st.integers(1, 3)), draw(st.integers(2, 4)), \
        draw(st.integers(1, 24))
    logits = rng.integers(0, 4, (batch, classes, count)).astype(np.float64)  # tied scores
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    loc = rng.normal(0, 1, (batch, count * 4))
    anchors = _boxes(rng, (1, count))
    attrs = {"threshold": draw(st.sampled_from([0.01, 0.3, 0.5])),
             "nms_threshold": draw(st.sampled_from([0.3, 0.5, 1.0, 1.5])),
             "nms_topk": draw(st.sampled_from([-1, 1, 4, 40])),
             "force_suppress": draw(st.booleans()),
             "clip": draw(st.booleans())}
    arrays = tuple(array.astype(np.float32) for array in (probs, loc, anchors))
    return arrays, {key: str(value) for key, value in attrs.items()}


@settings(max_examples=120, deadline=None)
@given(detection_cases())
def test_multibox_detection_on_the_device_matches_the_host_loop(case: tuple) -> None:
    (probs, loc, anchors), raw = case
    attrs = get_op("_contrib_MultiBoxDetection").parse_attrs(raw)
    flat = anchors.reshape(-1, 4)
    expected = np.stack([_detect_one(probs[b], loc[b], flat, attrs) for b in range(len(probs))])
    np.testing.assert_allclose(detect_batches(np, probs, loc, flat, attrs), expected,
                               rtol=1e-5, atol=1e-6)
