"""Image pipelines: the config schema, the pipeline against a reference, the upload checks."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import engine
from engine import sym
from engine.serving.config import ModelConfig, parse_config
from engine.serving.errors import InvalidModel
from engine.serving.images import ImageError
from engine.serving.preprocess import preprocess_image
from engine.serving.preprocess_config import PRESETS, ImagePreprocess
from engine.serving.validate import checks_of, default_loader, load_and_validate
from tests.conformance.fixtures import model_files

RNG = np.random.default_rng(2025)
MEAN = np.array([0.485, 0.456, 0.406])
STD = np.array([0.229, 0.224, 0.225])
IMAGENET = PRESETS["imagenet"].image


def encode(pixels: np.ndarray, kind: str, **options: Any) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, kind, **options)
    return buffer.getvalue()


def photo(height: int, width: int) -> np.ndarray:
    """Smooth colour gradients plus a little noise: JPEG-friendly, not constant."""
    ys, xs = np.mgrid[0:height, 0:width] / max(height, width)
    base = np.stack([np.sin(6 * xs), np.cos(5 * ys), np.sin(4 * (xs + ys))], axis=2)
    return np.clip(128 + 100 * base + RNG.normal(0, 4, base.shape), 0, 255).astype(np.uint8)


def reference_imagenet(rgb: np.ndarray) -> np.ndarray:
    """The ImageNet evaluation transform, step by step in NumPy (Pillow only resizes)."""
    height, width = rgb.shape[:2]
    if height <= width:
        size = (int(256 * width / height), 256)  # Pillow sizes are (width, height)
    else:
        size = (256, int(256 * height / width))
    resized = np.asarray(Image.fromarray(rgb).resize(size, Image.Resampling.BILINEAR),
                         np.float64)
    top = int(round((resized.shape[0] - 224) / 2))
    left = int(round((resized.shape[1] - 224) / 2))
    crop = resized[top:top + 224, left:left + 224] / 255.0
    return ((crop - MEAN) / STD).transpose(2, 0, 1)


def stored_pixels(data: bytes) -> np.ndarray:
    """What Pillow decodes, untouched (no orientation applied)."""
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


# The pipeline against the reference.

@pytest.mark.parametrize("kind, height, width", [("JPEG", 375, 500), ("PNG", 451, 300),
                                                 ("WEBP", 256, 256)])
def test_imagenet_preset_matches_a_numpy_reference(kind: str, height: int, width: int) -> None:
    data = encode(photo(height, width), kind, quality=90)
    row, geometry = preprocess_image(data, IMAGENET)
    assert row.shape == (3, 224, 224) and row.dtype == np.float32 and row.flags.c_contiguous
    np.testing.assert_allclose(row, reference_imagenet(stored_pixels(data)), atol=2e-5)
    assert geometry.original == (height, width)


def test_exif_rotated_jpeg_matches_the_reference_on_the_upright_image() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # display rotated a quarter turn clockwise
    data = encode(photo(300, 480), "JPEG", quality=90, exif=exif.tobytes())
    row, geometry = preprocess_image(data, IMAGENET)
    upright = np.ascontiguousarray(np.rot90(stored_pixels(data), k=-1))
    np.testing.assert_allclose(row, reference_imagenet(upright), atol=2e-5)
    assert geometry.original == (480, 300)


@pytest.mark.parametrize("mode", ["L", "P", "RGBA", "CMYK", "I;16"])
def test_every_mode_goes_through_the_pipeline(mode: str) -> None:
    pixels = photo(120, 160)
    source = Image.fromarray(pixels)
    if mode == "I;16":
        source = Image.fromarray(pixels[:, :, 0].astype(np.uint16) * 257)
    else:
        source = source.convert(mode)
    buffer = io.BytesIO()
    source.save(buffer, "JPEG" if mode == "CMYK" else "PNG")
    row, _ = preprocess_image(buffer.getvalue(), IMAGENET)
    assert row.shape == (3, 224, 224) and np.isfinite(row).all()
    expected = reference_imagenet(np.asarray(source.convert("RGB"))) if mode in (
        "L", "P", "RGBA") else None
    if expected is not None:
        np.testing.assert_allclose(row, expected, atol=2e-5)
    if mode == "I;16":  # 16-bit scaled down to the 8-bit grey it was made from
        np.testing.assert_allclose(row, reference_imagenet(np.repeat(pixels[:, :, :1], 3, 2)),
                                   atol=2e-5)


def test_letterbox_pads_and_maps_boxes_back() -> None:
    options = ImagePreprocess.model_validate(
        {"resize": {"letterbox": [416, 416], "pad_value": 114}})
    pixels = photo(100, 200)
    row, geometry = preprocess_image(encode(pixels, "PNG"), options)
    assert row.shape == (3, 416, 416)
    assert geometry.scale == (2.08, 2.08) and geometry.offset == (104.0, 0.0)
    assert (row[:, :104] == 114).all() and (row[:, 312:] == 114).all()
    resized = np.asarray(Image.fromarray(pixels).resize((416, 208), Image.Resampling.BILINEAR))
    np.testing.assert_array_equal(row[:, 104:312], resized.transpose(2, 0, 1))
    boxes = np.array([[0, 104, 416, 312], [208, 208, 312, 260]], np.float32)
    np.testing.assert_allclose(geometry.to_original(boxes),
                               [[0, 0, 200, 100], [100, 50, 150, 75]], atol=1e-9)
    np.testing.assert_allclose(geometry.to_original([[-20, 0, 500, 500]]),
                               [[0, 0, 200, 100]])  # clipped to the original


def test_crop_geometry_finds_a_marker_in_the_original() -> None:
    pixels = np.zeros((375, 500, 3), np.uint8)
    pixels[200:240, 300:340] = 255  # a white square
    row, geometry = preprocess_image(encode(pixels, "PNG"), IMAGENET)
    bright = np.argwhere(row[0] > 0)  # above the mean: the square
    (y1, x1), (y2, x2) = bright.min(axis=0), bright.max(axis=0) + 1
    box = geometry.to_original(np.array([x1, y1, x2, y2], np.float64))
    np.testing.assert_allclose(box, [300, 200, 340, 240], atol=3)  # bilinear blurs an edge


def test_colour_order_layout_and_dtype() -> None:
    pixels = photo(64, 48)
    data = encode(pixels, "PNG")
    base = {"resize": {"exact": [32, 40]}, "scale": 0.5, "mean": [1, 2, 3]}
    rgb, _ = preprocess_image(data, ImagePreprocess.model_validate(base))
    bgr, _ = preprocess_image(data, ImagePreprocess.model_validate({
        **base, "color": "BGR", "mean": [3, 2, 1], "layout": "NHWC", "dtype": "fp16"}))
    assert rgb.shape == (3, 32, 40) and bgr.shape == (32, 40, 3) and bgr.dtype == np.float16
    np.testing.assert_allclose(bgr.astype(np.float32), rgb[::-1].transpose(1, 2, 0), rtol=1e-3)
    raw, _ = preprocess_image(data, ImagePreprocess.model_validate(
        {"resize": {"exact": [32, 40]}, "dtype": "UINT8", "layout": "NHWC"}))
    assert raw.dtype == np.uint8
    np.testing.assert_allclose(raw * 0.5 - [1, 2, 3], rgb.transpose(1, 2, 0), atol=1e-5)


def test_a_1_by_100000_strip_is_refused_by_shorter_side_and_fits_a_letterbox() -> None:
    data = encode(np.full((1, 100000, 3), 50, np.uint8), "PNG")
    with pytest.raises(ImageError, match="100000x1 .*shorter side to 256 would make it "
                                         "25600000x256.*aspect ratio is too extreme"):
        preprocess_image(data, IMAGENET.model_copy(update={"max_pixels": 10_000_000}))
    options = ImagePreprocess.model_validate({"resize": {"letterbox": [64, 64]}})
    row, geometry = preprocess_image(data, options)
    assert row.shape == (3, 64, 64) and geometry.scale[1] == 64 / 100000


def test_jpeg_draft_is_close_to_the_full_decode() -> None:
    data = encode(photo(1500, 2000), "JPEG", quality=90)
    full, full_geometry = preprocess_image(data, IMAGENET)
    drafted, draft_geometry = preprocess_image(
        data, IMAGENET.model_copy(update={"jpeg_draft": True}))
    assert drafted.shape == full.shape and draft_geometry == full_geometry
    assert np.abs(drafted - full).mean() < 0.05  # normalised units; one grey level is ~0.017
    assert not np.array_equal(drafted, full)  # it did decode at reduced scale


def test_a_pipeline_without_resize_refuses_an_image_smaller_than_its_crop() -> None:
    options = ImagePreprocess.model_validate({"center_crop": 64})
    with pytest.raises(ImageError, match="image is 50x40 .* smaller than the centre crop 64x64"):
        preprocess_image(encode(photo(40, 50), "PNG"), options)
    assert preprocess_image(encode(photo(70, 80), "PNG"), options)[0].shape == (3, 64, 64)


# The schema.

def _config(preprocess: Any) -> ModelConfig:
    return parse_config({"inputs": [{"name": "data", "preprocess": preprocess}]}, "upload")


@pytest.mark.parametrize("preprocess, message", [
    ("imagenett", "unknown preprocess preset 'imagenett'; presets are \\['imagenet'\\]"),
    ({"image": {"center_crop": 8, "colour": "RGB"}}, "image.colour: Extra inputs"),
    ({"image": {"resize": {"shorter_side": 9, "mode": "x"}, "center_crop": 8}},
     "resize.mode: Extra inputs"),
    ({"image": {"center_crop": 8}, "text": {"max_length": 8}}, "exactly one of image, text"),
    ({"audio": {}}, "\\.audio: Extra inputs"),
    ({"image": {"resize": 256}}, "must give every image the same size"),
    ({"image": {"resize": {"shorter_side": 9, "exact": [8, 8]}}},
     "exactly one of shorter_side, exact, letterbox; got shorter_side, exact"),
    ({"image": {"resize": [100, 100], "center_crop": [120, 90]}},
     "center_crop \\[120, 90\\] is larger than the resized image \\[100, 100\\]"),
    ({"image": {"resize": 100, "center_crop": 120}}, "larger than the shorter side 100"),
    ({"image": {"center_crop": 8, "std": [1, 0, 1]}}, "must be non-zero"),
    ({"image": {"center_crop": 8, "scale": True}}, "expected a number, got True"),
    ({"image": {"center_crop": 8, "mean": [1, 2]}}, "image.mean"),
    ({"image": {"center_crop": 8, "dtype": "UINT8", "scale": 0.5}}, "UINT8 keeps the pixels"),
    ({"image": {"center_crop": 8, "layout": "CHW"}}, "image.layout"),
    ({"image": {"center_crop": 8, "max_pixels": 10**9}}, "image.max_pixels"),
    ({"image": {"resize": {"letterbox": [8, 8], "pad_value": [1, 2]}}},
     "pad_value \\[1, 2\\]: one value, or one per channel"),
])
def test_invalid_pipelines_are_refused_naming_the_field(preprocess: Any, message: str) -> None:
    with pytest.raises(InvalidModel, match=f"upload: inputs.0.preprocess.*{message}"):
        _config(preprocess)


def test_preprocess_belongs_to_inputs() -> None:
    with pytest.raises(InvalidModel, match="outputs \\['scores'\\]: preprocess belongs to "
                                           "inputs"):
        parse_config({"outputs": [{"name": "scores", "preprocess": "imagenet"}]}, "upload")


def test_a_preset_expands_and_the_completed_config_parses_again() -> None:
    config = _config("imagenet")
    assert config.inputs is not None and config.inputs[0].preprocess == PRESETS["imagenet"]
    assert parse_config(config.to_json(), "again") == config
    letterbox = _config({"image": {"resize": {"letterbox": [416, 416], "pad_value": 114}}})
    assert parse_config(letterbox.to_json(), "again") == letterbox


# The checks at upload.

def _validate(name: str, preprocess: Any, **tensor: Any) -> Any:
    symbol, params = model_files(name)

    def loader(_symbol: Path, _params: Path, *, device: str) -> Any:
        return default_loader(symbol, params, device=device)

    config = parse_config({"inputs": [{"name": "data", "preprocess": preprocess, **tensor}]},
                          "upload")
    return load_and_validate(Path("unused"), config, loader=loader, device="cpu",
                             where=f"upload of {name}")


def test_a_one_channel_graph_refuses_the_imagenet_preset() -> None:
    with pytest.raises(InvalidModel, match=r"upload of lenet: inputs.0.preprocess: input 'data' "
                                           r"has shape \[-1, 1, -1, -1\]: 1 channel\(s\) at "
                                           r"dimension 1; the pipeline gives 3 \(RGB\)"):
        _validate("lenet", "imagenet")


def test_a_graph_of_rank_2_or_another_dtype_or_size_refuses_the_pipeline() -> None:
    with pytest.raises(InvalidModel, match=r"input 'data' has shape \[-1, 4\]; an image "
                                           r"pipeline gives rows of shape \[3, 224, 224\]"):
        _validate("hybridnet", "imagenet")
    with pytest.raises(InvalidModel, match="the pipeline gives FP16; input 'data' takes FP32"):
        _validate("resblock", {"image": {"center_crop": 32, "dtype": "FP16"}})
    with pytest.raises(InvalidModel, match=r"shape \[-1, 3, 32, 32\]; the pipeline gives rows "
                                           r"of shape \[3, 224, 224\].*differ at dimension 2"):
        _validate("resblock", "imagenet", shape=[-1, 3, 32, 32])
    with pytest.raises(InvalidModel, match=r"gives rows of shape \[32, 32, 3\] \(NHWC, .*differ "
                                           r"at dimension 1"):
        _validate("resblock", {"image": {"center_crop": 32, "layout": "NHWC"}})


def test_a_pipeline_that_fits_is_dry_run_and_recorded() -> None:
    validated = _validate("resblock", "imagenet")
    record = checks_of(validated.model).as_dict()["preprocess"]
    assert record == {"ran": True, "inputs": {"data": [3, 224, 224]}, "warnings": []}
    assert validated.config.inputs[0].preprocess == PRESETS["imagenet"]
    assert "preprocess" not in checks_of(_validate_plain("resblock")).as_dict()


def _validate_plain(name: str) -> Any:
    symbol, params = model_files(name)
    return load_and_validate(Path("unused"), ModelConfig(), device="cpu", where="upload",
                             loader=lambda *_, device: default_loader(symbol, params,
                                                                      device=device)).model


def test_a_graph_that_normalises_its_input_gets_a_warning() -> None:
    data = sym.var("data")
    shifted = sym.broadcast_sub(data * 0.0039, sym.var("mean"))
    for first, graph in (("_mul_scalar", shifted), ("Convolution", data)):
        net = sym.Convolution(graph, kernel=(3, 3), num_filter=2, name="conv")
        params = {"conv_weight": RNG.normal(size=(2, 3, 3, 3)).astype(np.float32),
                  "conv_bias": np.zeros(2, np.float32),
                  "mean": np.full((1, 3, 1, 1), 0.5, np.float32)}
        params = {name: value for name, value in params.items()
                  if name in net.list_arguments()}
        # The rank is given: broadcasting against the 4-D mean, rank 3 would do too.
        config = parse_config({"inputs": [{"name": "data", "preprocess": "imagenet",
                                           "shape": [-1, 3, -1, -1]}]}, "u")
        validated = load_and_validate(
            Path("unused"), config, device="cpu", where="upload",
            loader=lambda *_, device, net=net, params=params: engine.load_model(
                net, params, device=device, keep_batch=True))
        warnings = checks_of(validated.model).as_dict()["preprocess"]["warnings"]
        if first == "Convolution":
            assert warnings == []
            continue
        assert len(warnings) == 1 and warnings[0].startswith(
            "input 'data': the graph's first op on it, node ") and "(_mul_scalar)" in warnings[0]
        assert "check that images are not normalised twice" in warnings[0]
