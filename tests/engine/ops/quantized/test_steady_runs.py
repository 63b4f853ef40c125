"""Bound int8 steps decide their path at their first run and repeat it while nothing they
decided on changes: a fused convolution (`fused._FusedInt8Conv.run`) and a dense layer into
float32 (`fused._BoundFc`). The logits stay the NumPy path's bit for bit, each run takes the
same compiled paths, and a change (the compiled paths off and on again, another data range)
makes them decide anew. The range outputs they copy through memoryviews
(`ranges.constant_writer`, `range_copier`) hold what `np.copyto` writes."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import engine
from engine.cpu import parallel
from engine.kernels import int8_conv
from engine.ops.quantized import fused, integer, ranges
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


@pytest.mark.parametrize("threads", [1, 2])
def test_steady_runs_repeat_the_first_runs_choices(decisions, threads):
    before = parallel.threads()
    parallel.set_threads(threads)  # plans bound from here run on these threads
    try:
        repeat_the_first_runs_choices(decisions)
    finally:
        parallel.set_threads(before)


def repeat_the_first_runs_choices(decisions):
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
        first, first_paths = paths_taken(lambda images=images: model.infer(images)["fc2_output"])
        decided = sum(decisions.values())
        assert decided >= 5  # every fused convolution of the net decided once
        np.testing.assert_array_equal(first, want)
        for _ in range(3):
            got, paths = paths_taken(lambda images=images: model.infer(images)["fc2_output"])
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
        slow, paths = paths_taken(lambda images=images: model.infer(images)["fc2_output"])
    finally:
        integer.use_fast_path(True)
    assert paths["int8_fused_conv"] == 0 and paths["int8_channels_last_handoff"] == 0
    assert sum(decisions.values()) == 2 * decided  # each convolution looked and refused
    again, paths = paths_taken(lambda images=images: model.infer(images)["fc2_output"])
    assert sum(decisions.values()) == 3 * decided  # then decided anew
    assert paths["int8_fused_conv"] > 0
    np.testing.assert_array_equal(slow, first)
    np.testing.assert_array_equal(again, first)


def test_a_float_classifier_repeats_its_product_until_its_data_range_changes(monkeypatch):
    """fc2 (float32 logits) runs its product without `_sums` after its first run; fc1
    (uint8 out) decides each run. A new data range makes fc2 decide again."""
    calls: Counter = Counter()
    sums = fused._BoundFc._sums

    def counted(self, rows):
        calls[self.chain.main.num_hidden] += 1
        return sums(self, rows)

    monkeypatch.setattr(fused._BoundFc, "_sums", counted)
    symbol, params = residual_net()
    calibration = RNG.standard_normal((16, 3, 16, 16)).astype(np.float32)
    model = engine.load_model(symbol, params, precision="int8",
                              calibration={"data": calibration})
    images = {"data": RNG.standard_normal((2, 3, 16, 16)).astype(np.float32)}
    with numpy_path():
        want = model.infer(images)["fc2_output"]
    calls.clear()
    for _ in range(3):
        got, paths = paths_taken(lambda images=images: model.infer(images)["fc2_output"])
        np.testing.assert_array_equal(got, want)
        assert paths["int8_gemm"] == 2  # both dense layers on the int8 GEMM each run
    assert calls == Counter({48: 3, 10: 1})
    bound = next(step.call for step in model.plan_for(images).steps
                 if isinstance(step.call, fused._BoundFc)
                 and step.call.chain.main.num_hidden == 10)
    low = np.asarray(bound.values["min_data"])
    view = bound._range_views[0]
    assert view[0] == float(low.reshape(-1)[0])
    bound._steady = (((view[0] - 1.0, bound._range_views[1][0]), True), None)
    np.testing.assert_array_equal(model.infer(images)["fc2_output"], want)
    assert calls[10] == 2  # another range: decided again


@pytest.mark.parametrize("target", [np.zeros(1, np.float32), np.zeros((3, 2), np.float32)[:, 0]])
@pytest.mark.parametrize("value", [np.float32(2.5), np.array([-7.25], np.float64)])
def test_range_writers_write_what_copyto_writes(target, value):
    want = target.copy()
    np.copyto(want, value)
    ranges.constant_writer(target, value)()
    np.testing.assert_array_equal(target, want)


def test_a_range_copier_reads_its_source_at_each_call():
    source, target = np.array([1.5], np.float32), np.zeros(1, np.float32)
    copy = ranges.range_copier(source, target)
    copy()
    assert target[0] == np.float32(1.5)
    source[0] = -3.0
    copy()
    assert target[0] == np.float32(-3.0)
    wide, narrow = np.array([0.1], np.float64), np.zeros(1, np.float32)
    ranges.range_copier(wide, narrow)()  # another dtype: NumPy's cast, as before
    assert narrow[0] == np.float32(0.1)
