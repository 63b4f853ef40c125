"""Properties of box_nms on random records, whatever the attributes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.ops.vision.boxes import pairwise_iou
from tests.engine.ops.helpers import run


@st.composite
def nms_inputs(draw: st.DrawFn) -> tuple[np.ndarray, dict[str, str]]:
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    count = draw(st.integers(1, 20))
    start = rng.uniform(0, 0.7, (count, 2))
    boxes = np.concatenate([start, start + rng.uniform(0.05, 0.4, (count, 2))], axis=1)
    ids = rng.integers(0, 3, (count, 1))
    scores = rng.uniform(0, 1, (count, 1))
    data = np.concatenate([ids, scores, boxes], axis=1).astype(np.float32)[None]
    attrs = {"overlap_thresh": str(draw(st.sampled_from([0.1, 0.3, 0.5, 0.7]))),
             "valid_thresh": str(draw(st.sampled_from([0.0, 0.2, 0.6]))),
             "topk": str(draw(st.sampled_from([-1, 1, 5]))),
             "id_index": str(draw(st.sampled_from([-1, 0]))),
             "force_suppress": str(draw(st.booleans()))}
    return data, attrs


@settings(max_examples=80, deadline=None)
@given(nms_inputs())
def test_box_nms_invariants(case: tuple[np.ndarray, dict[str, str]]) -> None:
    data, attrs = case
    (out,) = run("_contrib_box_nms", attrs, data)
    rows = out[0]
    kept = rows[rows[:, 1] != -1]
    assert (rows[len(kept):] == -1).all(), "suppressed rows come after the kept ones"
    assert all(np.isclose(data[0], row).all(axis=1).any() for row in kept)
    assert (np.diff(kept[:, 1]) <= 0).all(), "kept rows are sorted by descending score"
    assert (kept[:, 1] > float(attrs["valid_thresh"])).all()
    if int(attrs["topk"]) > 0:
        assert len(kept) <= int(attrs["topk"])
    overlaps = pairwise_iou(np, kept[:, 2:6], kept[:, 2:6])
    same_class = kept[:, None, 0] == kept[None, :, 0]
    if attrs["id_index"] == "-1" or attrs["force_suppress"] == "True":
        same_class[:] = True
    clash = (overlaps > float(attrs["overlap_thresh"])) & same_class
    np.fill_diagonal(clash, False)
    assert not clash.any(), "no two kept boxes suppress each other"
    if len(kept) == 0:
        assert (data[0, :, 1] <= float(attrs["valid_thresh"])).all()
