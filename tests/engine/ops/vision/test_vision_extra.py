"""The GPU-only contrib ops (fft, ifft, count_sketch) against plain NumPy references, and partial
and refused shapes of the vision ops (MXNet's outputs for the rest are in ops_special)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine.errors import ModelFormatError, ShapeError
from engine.ops import get_op
from tests.engine.ops.helpers import infer, run

RNG = np.random.default_rng(23)


def dft(signal: np.ndarray, inverse: bool = False) -> np.ndarray:
    """The textbook DFT along the last axis, unnormalised both ways."""
    length = signal.shape[-1]
    k = np.arange(length)
    sign = 1 if inverse else -1
    basis = np.exp(sign * 2j * np.pi * np.outer(k, k) / length)
    return signal @ basis.T


def test_fft_interleaves_the_unnormalised_spectrum() -> None:
    data = RNG.normal(size=(2, 3, 4, 5)).astype(np.float32)
    result = run("_contrib_fft", {}, data)[0]
    assert result.shape == (2, 3, 4, 10) and result.dtype == np.float32
    spectrum = dft(data.astype(np.float64))
    np.testing.assert_allclose(result[..., 0::2], spectrum.real, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(result[..., 1::2], spectrum.imag, rtol=1e-5, atol=1e-5)


def test_ifft_is_the_unscaled_inverse_real_part() -> None:
    pairs = RNG.normal(size=(3, 12)).astype(np.float32)
    result = run("_contrib_ifft", {"compute_size": "2"}, pairs)[0]
    expected = dft(pairs[:, 0::2] + 1j * pairs[:, 1::2], inverse=True).real
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-5)
    signal = RNG.normal(size=(2, 8)).astype(np.float32)
    round_trip = run("_contrib_ifft", {}, run("_contrib_fft", {}, signal)[0])[0]
    np.testing.assert_allclose(round_trip, 8 * signal, rtol=1e-5, atol=1e-5)  # no 1/n


def test_count_sketch_adds_signed_inputs_into_hashed_columns() -> None:
    data = RNG.normal(size=(2, 3, 2, 6)).astype(np.float32)
    hashes = np.array([[0, 3, 3, 1, 4, 0]], np.float32)
    signs = np.array([[1, -1, 1, 1, -1, -1]], np.float32)
    result = run("_contrib_count_sketch", {"out_dim": "5"}, data, hashes, signs)[0]
    expected = np.zeros((2, 3, 2, 5))
    for i in range(6):
        expected[..., int(hashes[0, i])] += signs[0, i] * data[..., i]
    np.testing.assert_allclose(result, expected, rtol=1e-6, atol=1e-6)


def test_spectral_shapes() -> None:
    assert infer("_contrib_fft", {}, [(0, 7)])[1] == [(0, 14)]
    assert infer("_contrib_ifft", {}, [(2, 3, 4, 8)])[1] == [(2, 3, 4, 4)]
    with pytest.raises(ShapeError, match="must be even"):
        infer("_contrib_ifft", {}, [(2, 7)])
    assert infer("_contrib_count_sketch", {"out_dim": "9"}, [(4, 6), None, None]) == (
        [(4, 6), (1, 6), (1, 6)], [(4, 9)])
    with pytest.raises(ShapeError, match="disagree"):
        infer("_contrib_count_sketch", {"out_dim": "9"}, [(4, 6), (1, 5), None])


DCONV = {"kernel": "(3, 3)", "pad": "(1, 1)", "num_filter": "8", "num_group": "2",
         "num_deformable_group": "2"}


def test_deformable_convolution_fills_offset_mask_weight_and_bias_shapes() -> None:
    inputs, outputs = infer("_contrib_ModulatedDeformableConvolution", DCONV,
                            [(2, 4, 5, 6), None, None, None, None])
    assert inputs == [(2, 4, 5, 6), (2, 36, 5, 6), (2, 18, 5, 6), (8, 2, 3, 3), (8,)]
    assert outputs == [(2, 8, 5, 6)]
    inputs, outputs = infer("_contrib_DeformableConvolution", {**DCONV, "no_bias": "True"},
                            [None, (0, 36, 5, 6), None])
    assert outputs == [None] and inputs[2] == (8, 0, 3, 3)
    with pytest.raises(ShapeError, match="offset"):
        infer("_contrib_DeformableConvolution", DCONV, [(2, 4, 5, 6), (2, 18, 5, 6), None, None])
    with pytest.raises(ShapeError, match="num_group=3 must divide"):
        infer("_contrib_DeformableConvolution", {**DCONV, "num_group": "3"},
              [(2, 4, 5, 6), None, None, None])


def test_zero_offsets_make_deformable_convolution_a_convolution() -> None:
    data = RNG.normal(size=(1, 4, 5, 6)).astype(np.float32)
    weight = RNG.normal(size=(8, 2, 3, 3)).astype(np.float32)
    bias = RNG.normal(size=8).astype(np.float32)
    attrs = {"kernel": "(3, 3)", "pad": "(1, 1)", "num_filter": "8", "num_group": "2"}
    expected = run("Convolution", attrs, data, weight, bias)[0]
    offset = np.zeros((1, 18, 5, 6), np.float32)
    result = run("_contrib_DeformableConvolution", attrs, data, offset, weight, bias)[0]
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-5)
    mask = np.ones((1, 9, 5, 6), np.float32)
    result = run("_contrib_ModulatedDeformableConvolution", attrs, data, offset, mask, weight,
                 bias)[0]
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-5)


def test_a_whole_pixel_offset_reads_the_neighbour() -> None:
    data = RNG.normal(size=(1, 1, 4, 5)).astype(np.float32)
    attrs = {"kernel": "(1, 1)", "num_filter": "1", "no_bias": "True"}
    offset = np.zeros((1, 2, 4, 5), np.float32)
    offset[:, 1] = 1.0  # every sample one column to the right
    result = run("_contrib_DeformableConvolution", attrs, data, offset,
                 np.ones((1, 1, 1, 1), np.float32))[0]
    np.testing.assert_allclose(result[0, 0, :, :4], data[0, 0, :, 1:], rtol=1e-6)
    assert np.all(result[0, 0, :, 4] == 0)  # past the right edge


def test_roi_family_shapes() -> None:
    attrs = {"spatial_scale": "0.5", "output_dim": "2", "pooled_size": "3"}
    assert infer("_contrib_PSROIPooling", attrs, [(1, 18, 8, 8), None]) == (
        [(1, 18, 8, 8), (0, 5)], [None])
    assert infer("_contrib_PSROIPooling", attrs, [None, (4, 5)])[1] == [(4, 2, 3, 3)]
    with pytest.raises(ShapeError, match="expected output_dim"):
        infer("_contrib_PSROIPooling", attrs, [(1, 16, 8, 8), (4, 5)])
    deformable = get_op("_contrib_DeformablePSROIPooling")
    parsed = deformable.parse_attrs({**attrs, "group_size": "3", "no_trans": "True"})
    assert deformable.input_names(parsed) == ("data", "rois")
    assert deformable.num_total_outputs(parsed) == 2  # MXNet's hidden top_count
    assert infer("_contrib_RROIAlign", {"pooled_size": "(2, 3)", "spatial_scale": "1"},
                 [(1, 4, 8, 8), None]) == ([(1, 4, 8, 8), (0, 6)], [None])
    assert infer("_contrib_bipartite_matching", {"threshold": "0.5"}, [(2, 3, 5, 6)])[1] == [
        (2, 3, 5), (2, 3, 6)]


def test_empty_roi_sets_pool_to_empty_outputs() -> None:
    data = RNG.normal(size=(1, 18, 6, 6)).astype(np.float32)
    attrs = {"spatial_scale": "0.5", "output_dim": "2", "pooled_size": "3"}
    assert run("_contrib_PSROIPooling", attrs, data, np.zeros((0, 5), np.float32))[0].shape == (
        0, 2, 3, 3)
    rotated = run("_contrib_RROIAlign", {"pooled_size": "(2, 2)", "spatial_scale": "1"},
                  data, np.zeros((0, 6), np.float32))[0]
    assert rotated.shape == (0, 18, 2, 2)


def _col2im_by_loops(columns: np.ndarray, size: tuple[int, int], kernel: tuple[int, int],
                     stride: tuple[int, int], pad: tuple[int, int]) -> np.ndarray:
    batch, rows, _ = columns.shape
    channels = rows // (kernel[0] * kernel[1])
    out_h = (size[0] + 2 * pad[0] - kernel[0]) // stride[0] + 1
    out_w = (size[1] + 2 * pad[1] - kernel[1]) // stride[1] + 1
    image = np.zeros((batch, channels, size[0] + 2 * pad[0], size[1] + 2 * pad[1]))
    cols = columns.reshape(batch, channels, kernel[0], kernel[1], out_h, out_w)
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            for y in range(out_h):
                for x in range(out_w):
                    image[:, :, y * stride[0] + i, x * stride[1] + j] += cols[:, :, i, j, y, x]
    return image[:, :, pad[0]:pad[0] + size[0], pad[1]:pad[1] + size[1]]


def test_col2im_is_the_adjoint_of_im2col() -> None:
    attrs: dict[str, Any] = {"kernel": "(3, 2)", "stride": "(2, 1)", "pad": "(1, 1)"}
    data = RNG.normal(size=(2, 3, 7, 5))
    columns = run("im2col", attrs, data)[0]
    other = RNG.normal(size=columns.shape)
    back = run("col2im", {**attrs, "output_size": "(7, 5)"}, other)[0]
    assert np.vdot(columns, other) == pytest.approx(np.vdot(data, back), rel=1e-12)
    np.testing.assert_allclose(back, _col2im_by_loops(other, (7, 5), (3, 2), (2, 1), (1, 1)))
    assert infer("col2im", {**attrs, "output_size": "(7, 5)"}, [None]) == (
        [(0, 0, 24)], [None])
    assert infer("im2col", attrs, [(0, 3, 7, 5)])[1] == [(0, 18, 24)]


def test_image_resize_shapes_and_refusals() -> None:
    assert infer("_image_resize", {"size": "4", "keep_ratio": "True"}, [(6, 9, 3)])[1] == [
        (4, 6, 3)]
    assert infer("_image_resize", {"size": "(5, 2)"}, [(3, 0, 0, 1)])[1] == [(3, 2, 5, 1)]
    assert infer("_image_resize", {"size": "4", "keep_ratio": "True"}, [(0, 9, 3)])[1] == [None]
    with pytest.raises(ModelFormatError, match="interp=7 is not one of OpenCV's"):
        get_op("_image_resize").parse_attrs({"size": "4", "interp": "7"})
    with pytest.raises(ShapeError, match="HWC image or an NHWC batch"):
        infer("_image_resize", {"size": "4"}, [(3, 4)])
