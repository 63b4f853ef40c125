"""The ``"color": "L"`` pipelines: one grey channel, its schema and its upload checks."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from engine.serving.config import parse_config
from engine.serving.errors import InvalidModel
from engine.serving.preprocess import preprocess_image
from engine.serving.preprocess_config import ImagePreprocess
from engine.serving.validate import checks_of, default_loader, load_and_validate
from tests.conformance.fixtures import model_files

RNG = np.random.default_rng(7)


def png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def luma(rgb: np.ndarray) -> np.ndarray:
    """ITU-R 601 luma in floating point: what one grey channel should hold."""
    return rgb.astype(np.float64) @ np.array([0.299, 0.587, 0.114])


def test_grey_rows_hold_the_luma_normalised_in_either_layout() -> None:
    rgb = RNG.integers(0, 256, (30, 40, 3), dtype=np.uint8)
    options = ImagePreprocess.model_validate(
        {"color": "L", "center_crop": [20, 30], "scale": 1 / 255, "mean": 0.5, "std": 0.25})
    row, _ = preprocess_image(png(rgb), options)
    assert row.shape == (1, 20, 30) and options.output_shape == (1, 20, 30)
    expected = (luma(rgb[5:25, 5:35]) / 255 - 0.5) / 0.25
    np.testing.assert_allclose(row[0], expected, atol=1.01 / 255 / 0.25)  # Pillow rounds
    nhwc, _ = preprocess_image(png(rgb), options.model_copy(update={"layout": "NHWC"}))
    assert nhwc.shape == (20, 30, 1)
    np.testing.assert_array_equal(nhwc[:, :, 0], row[0])


def test_a_grey_image_keeps_its_values_and_uint8_passes_them_through() -> None:
    grey = RNG.integers(0, 256, (16, 12), dtype=np.uint8)
    options = ImagePreprocess.model_validate({"color": "L", "center_crop": [16, 12],
                                              "dtype": "UINT8", "layout": "NHWC"})
    row, _ = preprocess_image(png(grey), options)
    assert row.dtype == np.uint8
    np.testing.assert_array_equal(row[:, :, 0], grey)


def test_an_inverting_pipeline_maps_dark_ink_to_one() -> None:
    options = ImagePreprocess.model_validate(
        {"color": "L", "resize": [2, 2], "scale": -1 / 255, "mean": -1})
    pixels = np.array([[0, 255], [255, 51]], np.uint8)
    row, _ = preprocess_image(png(pixels), options)
    np.testing.assert_allclose(row[0], [[1.0, 0.0], [0.0, 0.8]], atol=1e-6)


@pytest.mark.parametrize("image, message", [
    ({"color": "L", "center_crop": 8, "mean": [0.1, 0.2, 0.3]},
     r"color L has one channel: mean \[0.1, 0.2, 0.3\] must be one number"),
    ({"color": "L", "center_crop": 8, "std": [1, 1, 2]}, "color L has one channel: std"),
    ({"color": "GRAY", "center_crop": 8}, "image.color"),
])
def test_grey_pipelines_refuse_per_channel_values(image: Any, message: str) -> None:
    with pytest.raises(InvalidModel, match=message):
        parse_config({"inputs": [{"name": "data", "preprocess": {"image": image}}]}, "upload")


def test_one_number_stands_for_every_channel() -> None:
    options = ImagePreprocess.model_validate({"center_crop": 8, "mean": 0.5, "std": 2})
    assert options.mean == (0.5, 0.5, 0.5) and options.std == (2.0, 2.0, 2.0)


def _validate(name: str, image: dict[str, Any]) -> Any:
    symbol, params = model_files(name)

    def loader(_symbol: Path, _params: Path, *, device: str) -> Any:
        return default_loader(symbol, params, device=device)

    config = parse_config({"inputs": [{"name": "data", "preprocess": {"image": image}}]},
                          "upload")
    return load_and_validate(Path("unused"), config, loader=loader, device="cpu",
                             where=f"upload of {name}")


def test_a_one_channel_graph_takes_a_grey_pipeline_and_a_three_channel_one_refuses_it() -> None:
    validated = _validate("lenet", {"color": "L", "resize": [28, 28], "scale": 1 / 255})
    record = checks_of(validated.model).as_dict()["preprocess"]
    assert record["ran"] and record["inputs"] == {"data": [1, 28, 28]}
    with pytest.raises(InvalidModel, match=r"3 channel\(s\) at dimension 1; the pipeline gives "
                                           r"1 \(L\) there in NCHW"):
        _validate("resblock", {"color": "L", "center_crop": 32})
