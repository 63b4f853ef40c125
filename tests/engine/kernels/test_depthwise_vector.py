"""The vector 3×3 depthwise kernel (`engine.kernels.depthwise_vector`, IR in `depthwise_ir`)
agrees with a float64 NumPy convolution: every width around a vector's lanes (16 with AVX-512,
8 with AVX2), planes of one cell, odd channel counts, stride 1 and 2, its clamp and NaNs, its
jobs and slabs; it writes nothing past its output and stands aside where it does not
apply."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cpu import host_features, kernel_jobs, spin_pool
from engine.kernels import bf16, bf16_handoff, depthwise_ir, depthwise_vector

RNG = np.random.default_rng(31)
SENTINEL = np.float32(-12345.0)

pytestmark = pytest.mark.skipif(depthwise_vector._task(1) is None,
                                reason="no AVX-512 or AVX2, or no llvmlite JIT on this host")


def reference(data: np.ndarray, weight: np.ndarray, bias: np.ndarray, stride: int,
              low: float = -np.inf, high: float = np.inf) -> np.ndarray:
    """The 3×3 pad-1 depthwise convolution in float64, clipped as ``clip`` clips."""
    batch, channels, height, width = data.shape
    padded = np.pad(data.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    out_height, out_width = (height - 1) // stride + 1, (width - 1) // stride + 1
    out = np.zeros((batch, channels, out_height, out_width)) + bias.reshape(1, -1, 1, 1)
    for ky in range(3):
        for kx in range(3):
            window = padded[:, :, ky:ky + stride * (out_height - 1) + 1:stride,
                            kx:kx + stride * (out_width - 1) + 1:stride]
            out += weight[:, 0, ky, kx].reshape(1, -1, 1, 1) * window
    return np.clip(out, low, high)


def operands(shape: tuple, stride: int) -> tuple[np.ndarray, ...]:
    """Input, weight, bias, an output filled with `SENTINEL` that is a view at the start of a
    longer buffer (its tail must stay `SENTINEL`), and that buffer."""
    batch, channels, height, width = shape
    data = RNG.normal(scale=2, size=shape).astype(np.float32)
    weight = RNG.normal(size=(channels, 1, 3, 3)).astype(np.float32)
    bias = RNG.normal(size=channels).astype(np.float32)
    out_shape = (batch, channels, (height - 1) // stride + 1, (width - 1) // stride + 1)
    buffer = np.full(int(np.prod(out_shape)) + 64, SENTINEL, np.float32)
    return data, weight, bias, buffer[:-64].reshape(out_shape), buffer


# Widths 1-3, around 8, 16 and 32 lanes (9, 15, 16, 17, 31, 33) and MobileNet's 7, 14, 28,
# 56 and 112 (AVX2's build reads and writes the columns inside those rows unmasked); heights
# of 1 and 2 rows (no inside row); one channel and channel counts that are not a multiple of 16.
SHAPES = [(1, 5, 1, 1), (2, 3, 1, 4), (1, 4, 5, 1), (1, 3, 2, 2), (2, 17, 7, 7),
          (1, 6, 14, 14), (1, 1, 15, 16), (1, 3, 16, 17), (1, 2, 9, 31), (1, 2, 4, 33),
          (2, 19, 28, 28), (1, 2, 3, 48), (1, 3, 5, 9), (2, 3, 9, 56), (1, 2, 6, 112)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("stride", [1, 2])
def test_kernel_matches_reference_and_writes_only_its_output(shape: tuple, stride: int) -> None:
    data, weight, bias, out, buffer = operands(shape, stride)
    depthwise_vector.bind(data, weight, bias, out, stride)()
    np.testing.assert_allclose(out, reference(data, weight, bias, stride), rtol=1e-5,
                               atol=1e-5)
    assert (buffer[out.size:] == SENTINEL).all(), "a store landed past the output"


# Each build's engine, compiled once for the tests that run a build other than the host's.
_BUILDS: dict[int, dict] = {}


def use_build(lanes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the build of ``lanes``-lane vectors in this test (compiled for this host)."""
    monkeypatch.setattr(depthwise_vector, "lanes", lambda: lanes)
    if lanes not in _BUILDS:
        monkeypatch.setattr(depthwise_vector, "_compiled", {})
        assert depthwise_vector._task(1) is not None
        _BUILDS[lanes] = depthwise_vector._compiled
    monkeypatch.setattr(depthwise_vector, "_compiled", _BUILDS[lanes])


@pytest.mark.skipif(not (host_features.has("avx2") and host_features.has("fma")),
                    reason="no AVX2 and FMA on this host")
@pytest.mark.parametrize("lanes", [depthwise_vector.AVX2_LANES, depthwise_vector.LANES])
@pytest.mark.parametrize("shape", [(1, 3, 5, 9), (2, 3, 9, 56), (1, 2, 6, 112), (1, 4, 7, 7),
                                   (1, 2, 4, 33), (1, 3, 11, 41)], ids=str)
@pytest.mark.parametrize("stride", [1, 2])
def test_each_build_matches_reference(lanes: int, shape: tuple, stride: int,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Both builds on any host with AVX2: AVX-512's 16 lanes (split in two here) and AVX2's 8
    lanes with its unmasked inside columns, so that the build a host does not take is
    checked too; a NaN reaches only the outputs whose taps cover it."""
    use_build(lanes, monkeypatch)
    data, weight, bias, out, buffer = operands(shape, stride)
    data[0, 1, shape[2] // 2, shape[3] // 2] = np.nan
    depthwise_vector.bind(data, weight, bias, out, stride).clamped(np.float32(-1),
                                                                   np.float32(4))()
    np.testing.assert_allclose(out, reference(data, weight, bias, stride, -1.0, 4.0),
                               rtol=1e-5, atol=1e-5)
    assert (buffer[out.size:] == SENTINEL).all(), "a store landed past the output"


@pytest.mark.parametrize("width", range(1, 10))
@pytest.mark.parametrize("height", [1, 2, 3, 5, 9])
def test_narrow_planes_stack_rows_in_a_vector(width: int, height: int) -> None:
    """Planes of half a vector's lanes or fewer at stride 1 take the stacked task (two rows
    or more to a vector; heights that make one vector, two, and first, inner and last ones),
    clamped, a NaN reaching only its neighbours, and it writes nothing past its output; wider
    ones do not."""
    lanes = depthwise_vector.lanes()
    stacked = depthwise_ir.stacks(width, 1, lanes)
    assert stacked == (width <= lanes // 2)
    engine = depthwise_vector._compiled["engine"]
    for paired in (False, True):
        assert (depthwise_vector._task(1, paired, width) == engine.get_function_address(
            depthwise_ir.task_name(1, paired, stacked)))
    data, weight, bias, out, buffer = operands((2, 3, height, width), 1)
    data[1, 2, height // 2, width - 1] = np.nan
    depthwise_vector.bind(data, weight, bias, out, 1).clamped(np.float32(-1),
                                                              np.float32(4))()
    want = reference(data, weight, bias, 1, -1.0, 4.0)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    assert (buffer[out.size:] == SENTINEL).all(), "a store landed past the output"


@pytest.mark.parametrize("stride", [1, 2])
def test_no_bias_reads_as_zero(stride: int) -> None:
    data, weight, bias, out, _ = operands((1, 3, 9, 10), stride)
    depthwise_vector.bind(data, weight, None, out, stride)()
    np.testing.assert_allclose(out, reference(data, weight, np.zeros_like(bias), stride),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("stride", [1, 2])
def test_clamp_keeps_nan_and_padding_reads_zero(stride: int) -> None:
    # NaNs in a corner, on the first and last columns and inside: each must reach the outputs
    # whose taps cover it and no other (a column's neighbour across a row's end, say), and
    # a padded tap must read zero, not a neighbouring plane's values.
    shape = (1, 4, 11, 21)
    data, weight, bias, out, _ = operands(shape, stride)
    for channel, (y, x) in enumerate(((0, 0), (5, 0), (5, 20), (6, 9))):
        data[0, channel, y, x] = np.nan
    call = depthwise_vector.bind(data, weight, bias, out, stride).clamped(np.float32(0),
                                                                          np.float32(6))
    call()
    want = reference(data, weight, bias, stride, 0.0, 6.0)
    assert np.isnan(want).any()
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)  # NaN exactly where want's


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("batch", [1, 2])  # slabs of channels of one sample, of whole samples
def test_job_of_several_parts_and_slabs_match_one_call(stride: int, batch: int,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # the 16-lane build: AVX2's cuts no slabs (`test_avx2_build_runs_as_its_job_alone`)
    use_build(depthwise_vector.LANES, monkeypatch)
    monkeypatch.setattr(kernel_jobs, "PART_ELEMENTS", 1)  # as many parts as there may be
    data, weight, bias, out, _ = operands((batch, 7, 12, 13), stride)
    call = depthwise_vector.bind(data, weight, bias, out, stride)
    call()
    want = out.copy()
    out.fill(SENTINEL)
    job = call.as_job(None)
    if spin_pool.available():
        assert job.args[-1] > 1, "the job was not cut into parts"
    job()
    np.testing.assert_array_equal(out, want)
    monkeypatch.setattr("engine.kernels.depthwise_kernel.SLAB_MIN_BYTES", 0)
    for count in (2, 3):
        out.fill(SENTINEL)
        slabs = call.slabs(count)
        assert slabs is not None and len(slabs) > 1
        for slab in slabs:
            slab()
        np.testing.assert_array_equal(out, want)


@pytest.mark.skipif(not (host_features.has("avx2") and host_features.has("fma")),
                    reason="no AVX2 and FMA on this host")
def test_avx2_build_runs_as_its_job_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """AVX2's build cuts no slabs for `parallel`'s threads: its job of parts, armed or on one
    thread, is the layer's step, and it computes the layer."""
    use_build(depthwise_vector.AVX2_LANES, monkeypatch)
    monkeypatch.setattr("engine.kernels.depthwise_kernel.SLAB_MIN_BYTES", 0)
    data, weight, bias, out, _ = operands((1, 8, 14, 14), 1)
    call = depthwise_vector.bind(data, weight, bias, out, 1)
    assert call.slabs(2) is None
    call.as_job(None)()
    np.testing.assert_allclose(out, reference(data, weight, bias, 1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("change", "applies"), [
    ({}, True),
    ({"geometry": ((3, 3), (2, 2), (1, 1), (1, 1))}, True),
    ({"geometry": ((5, 5), (1, 1), (1, 1), (2, 2))}, False),
    ({"geometry": ((3, 3), (1, 1), (1, 1), (0, 0))}, False),
    ({"geometry": ((3, 3), (2, 1), (1, 1), (1, 1))}, False),
    ({"geometry": ((3, 3), (3, 3), (1, 1), (1, 1))}, False),
    ({"geometry": ((3, 3), (1, 1), (2, 2), (2, 2))}, False),
    ({"dtype": np.float64}, False),
    ({"strided": True}, False),
])
def test_applies_only_to_what_it_computes(change: dict, applies: bool) -> None:
    dtype = change.get("dtype", np.float32)
    data = np.zeros((1, 4, 8, 8), dtype)
    if change.get("strided"):
        data = np.zeros((1, 4, 8, 16), dtype)[..., ::2]
    weight, out = np.zeros((4, 1, 3, 3), dtype), np.zeros((1, 4, 8, 8), dtype)
    geometry = change.get("geometry", ((3, 3), (1, 1), (1, 1), (1, 1)))
    assert depthwise_vector.applies(data, weight, None, out, geometry) == applies


def test_mismatched_operands_are_refused_by_name() -> None:
    data, weight, bias, out, _ = operands((1, 4, 6, 6), 1)
    with pytest.raises(ValueError, match="depthwise 3×3"):
        depthwise_vector.depthwise_3x3(data.reshape(4, 6, 6), weight.reshape(4, 9), bias[:3],
                                       out.reshape(4, 6, 6), 1, None, None, -np.inf,
                                       np.inf)


def test_without_avx512_or_avx2_it_stands_aside(monkeypatch: pytest.MonkeyPatch) -> None:
    # Neither vector width: the kernel is not compiled, and the bind falls back to numba's
    # kernels.
    monkeypatch.setattr(depthwise_vector, "_compiled", {})
    monkeypatch.setattr("engine.cpu.host_features.has", lambda flag: False)
    data, weight, bias, out, _ = operands((1, 4, 8, 8), 1)
    assert depthwise_vector._task(1) is None
    assert not depthwise_vector.applies(data, weight, bias, out,
                                        ((3, 3), (1, 1), (1, 1), (1, 1)))


def paired_reference(out: np.ndarray, words_shape: tuple[int, int]) -> np.ndarray:
    """The words the pairing pass (`bf16.patch_pairing`) makes of one sample's planes."""
    words = np.zeros(words_shape, np.float32)
    bf16.patch_pairing(out.reshape(out.shape[1], -1), 1, words)()
    return words


@pytest.mark.parametrize("shape", [(1, 5, 9, 10), (1, 6, 14, 14), (1, 17, 7, 7),
                                   (1, 3, 16, 17), (1, 1, 1, 1), (1, 4, 28, 33)], ids=str)
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("as_job", [False, True])
def test_a_taken_handoff_gets_the_pairing_pass_words(shape: tuple, stride: int, as_job: bool,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Every reader took the hand-off: the words (one per two channels, an odd count's last
    high half zero, the padding past the positions and K untouched) are the pairing pass's
    of the float32 planes, NaNs included; the planes are not written."""
    monkeypatch.setattr(kernel_jobs, "PART_ELEMENTS", 1)
    data, weight, bias, out, _ = operands(shape, stride)
    data[0, 0, 0, 0] = np.nan
    planes = out.copy()
    depthwise_vector.bind(data, weight, bias, planes, stride).clamped(
        np.float32(0), np.float32(6))()
    positions = planes.shape[2] * planes.shape[3]
    words = (bf16.amx_depth(shape[1]), bf16.amx_rows(positions))
    handoff = bf16_handoff.PairedHandoff(readers=1, shape=words, slot=(shape[1], 0))
    handoff.words = np.zeros(words, np.float32)
    handoff.takers = 1
    handoff.note()  # taken anew, as binding a reader does
    call = depthwise_vector.bind(data, weight, bias, out, stride, handoff).clamped(
        np.float32(0), np.float32(6))
    assert call.slabs(2) is None  # the words take every plane's halves
    if as_job:  # parts on two threads: a word's two halves written by different parts
        with spin_pool.armed(2):
            call.as_job(None)()
    else:
        call()
    assert handoff.laid
    want = paired_reference(planes, handoff.words.shape)
    np.testing.assert_array_equal(handoff.words.view(np.uint32), want.view(np.uint32))
    assert (out == SENTINEL).all(), "the planes were written beside the words"


@pytest.mark.parametrize("as_job", [False, True])
def test_a_handoff_not_every_reader_took_gets_the_planes(as_job: bool) -> None:
    data, weight, bias, out, _ = operands((1, 6, 9, 9), 1)
    handoff = bf16_handoff.PairedHandoff(readers=2, shape=(16, 96), slot=(6, 0))
    handoff.words = np.zeros((16, 96), np.float32)
    handoff.takers = 1
    handoff.note()  # taken anew, as binding a reader does
    call = depthwise_vector.bind(data, weight, bias, out, 1, handoff)
    (call.as_job(None) if as_job else call)()
    assert not handoff.laid and not handoff.words.any()
    np.testing.assert_allclose(out, reference(data, weight, bias, 1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 5, 9, 10), (1, 3, 16, 17), (2, 4, 7, 7), (1, 1, 1, 1),
                                   (1, 3, 28, 33), (1, 2, 15, 48)], ids=str)
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("as_job", [False, True])
def test_bf16_planes_read_as_the_floats_they_are(shape: tuple, stride: int, as_job: bool,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Input planes as bf16 bits (uint16): the output, clamped, is the float32 kernel's over
    those values widened, bit for bit, NaN and infinity included; narrow planes (7 wide)
    take the column walk; nothing lands past the output."""
    monkeypatch.setattr(kernel_jobs, "PART_ELEMENTS", 1)
    data, weight, bias, out, buffer = operands(shape, stride)
    data.reshape(-1)[-2:] = [np.nan, np.inf][-data.size:]
    halves = bf16.round_to_bf16(data)
    want = np.full_like(out, SENTINEL)
    depthwise_vector.bind(bf16.widen(halves), weight, bias, want, stride).clamped(
        np.float32(0), np.float32(6))()
    call = depthwise_vector.bind(halves, weight, bias, out, stride).clamped(
        np.float32(0), np.float32(6))
    if as_job:
        with spin_pool.armed(2):
            call.as_job(None)()
    else:
        call()
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))
    assert (buffer[out.size:] == SENTINEL).all(), "a store landed past the output"


@pytest.mark.parametrize("shape", [(1, 5, 9, 10), (1, 4, 28, 33)], ids=str)
@pytest.mark.parametrize("stride", [1, 2])
def test_bf16_planes_in_and_a_taken_handoff_out(shape: tuple, stride: int) -> None:
    """bf16 planes in, the hand-off's words out: the words the float32 kernel writes from
    those values widened, bit for bit."""
    data, weight, bias, out, _ = operands(shape, stride)
    halves = bf16.round_to_bf16(data)
    positions = out.shape[2] * out.shape[3]
    words = (bf16.amx_depth(shape[1]), bf16.amx_rows(positions))
    handoffs = []
    for source in (bf16.widen(halves), halves):
        handoff = bf16_handoff.PairedHandoff(readers=1, shape=words, slot=(shape[1], 0))
        handoff.words = np.zeros(words, np.float32)
        handoff.takers = 1
        handoff.note()  # taken anew, as binding a reader does
        depthwise_vector.bind(source, weight, bias, out, stride, handoff)()
        assert handoff.laid
        handoffs.append(handoff.words.view(np.uint32))
    np.testing.assert_array_equal(*handoffs)
    assert (out == SENTINEL).all()
