"""A bound fused int8 convolution decides its path at its first run and repeats it while
nothing it decided on changes (`fused._FusedInt8Conv.run`'s steady path): the logits stay
the NumPy path's bit for bit, each run takes the same compiled paths, and a change (the
compiled paths off and on again) makes it decide anew."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import engine
from engine.kernels import int8_conv
from engine.ops.quantized import fused, integer
from tests.engine.ops.quantized.int8_models import numpy_path, paths_taken
from tests.engine.quantize.test_int8_model import residual_net

pytestmark = pytest.mark.skipif(not int8_conv.supported_here(),
                                reason="needs AVX-512 VNNI, numba and the spin pool")

RNG = np.random.default_rng(43)


@pytest.fixture()
def decisions(monkeypatch):
    """Counts of `_decide_and_run` calls, by bound node."""
    counts: Counter = Counter()
    decide = fused._FusedInt8Conv._decide_and_run

    def counted(self):
        counts[id(self)] += 1
        return decide(self)

    monkeypatch.setattr(fused._FusedInt8Conv, "_decide_and_run", counted)
    return counts


def test_steady_runs_repeat_the_first_runs_choices(decisions):
    symbol, params = residual_net()
    calibration = RNG.standard_normal((16, 3, 16, 16)).astype(np.float32)
    model = engine.load_model(symbol, params, precision="int8",
                              calibration={"data": calibration})
    with numpy_path():
        exact = engine.load_model(symbol, params, precision="int8",
                                  calibration={"data": calibration})
    for batch in (1, 3):
        images = {"data": RNG.standard_normal((batch, 3, 16, 16)).astype(np.float32)}
        want = exact.infer(images)["fc2_output"]
        first, first_paths = paths_taken(lambda: model.infer(images)["fc2_output"])
        decided = sum(decisions.values())
        assert decided >= 5  # every fused convolution of the net decided once
        np.testing.assert_array_equal(first, want)
        for _ in range(3):
            got, paths = paths_taken(lambda: model.infer(images)["fc2_output"])
            np.testing.assert_array_equal(got, want)
            assert paths == first_paths  # the same hand-offs, rescales and fused layers
            assert first_paths["int8_channels_last_handoff"] > 0
        assert sum(decisions.values()) == decided  # none decided again
        decisions.clear()


def test_a_change_between_runs_decides_again(decisions):
    symbol, params = residual_net()
    calibration = RNG.standard_normal((16, 3, 16, 16)).astype(np.float32)
    model = engine.load_model(symbol, params, precision="int8",
                              calibration={"data": calibration})
    images = {"data": RNG.standard_normal((2, 3, 16, 16)).astype(np.float32)}
    first = model.infer(images)["fc2_output"]
    decided = sum(decisions.values())
    integer.use_fast_path(False)
    try:
        slow, paths = paths_taken(lambda: model.infer(images)["fc2_output"])
    finally:
        integer.use_fast_path(True)
    assert paths["int8_fused_conv"] == 0 and paths["int8_channels_last_handoff"] == 0
    assert sum(decisions.values()) == 2 * decided  # each convolution looked and refused
    again, paths = paths_taken(lambda: model.infer(images)["fc2_output"])
    assert sum(decisions.values()) == 3 * decided  # then decided anew
    assert paths["int8_fused_conv"] > 0
    np.testing.assert_array_equal(slow, first)
    np.testing.assert_array_equal(again, first)
