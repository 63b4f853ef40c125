"""The image benchmarks' inputs: the test photos, and the decoder benchmark's pipeline against
the server's."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, JpegImagePlugin

from bench import decode
from bench.photos import SIZE, sample_jpegs
from engine.serving.preprocess import preprocess_image
from engine.serving.preprocess_config import ImagePreprocess


def test_the_photos_are_500_by_375_baseline_jpegs_with_4_2_0_chroma() -> None:
    photos = sample_jpegs()
    assert len(photos) == 12 and len(set(photos)) == 12
    for data in photos:
        image = Image.open(io.BytesIO(data))
        assert (image.format, image.mode, image.size) == ("JPEG", "RGB", SIZE)
        assert JpegImagePlugin.get_sampling(image) == 2  # 4:2:0
        assert "progressive" not in image.info and "exif" not in image.info
        # A photograph, not a flat picture: pixels vary across the whole frame.
        assert np.asarray(image).std() > 20


def test_the_benchmark_pipeline_is_the_servers_imagenet_geometry() -> None:
    data = sample_jpegs()[0]
    server = ImagePreprocess.model_validate({"resize": 256, "center_crop": 224,
                                             "dtype": "UINT8", "layout": "NHWC"})
    expected, _ = preprocess_image(data, server)
    shifted = np.abs(np.roll(expected, 2, axis=1).astype(int) - expected).mean()
    for name, decoder in decode.decoders().items():  # whichever decoders are installed
        # Full-size decodes are the same pixels (libjpeg-turbo's IDCT in every one of them).
        np.testing.assert_array_equal(decode.pipeline(decoder, data, False), expected)
        # A 3/4-scale decode is resized less, so it is sharper; but it is not misplaced: it is
        # much closer than the server's own row shifted by two pixels.
        scaled = decode.pipeline(decoder, data, True)
        assert scaled.shape == (224, 224, 3), name
        assert np.abs(scaled.astype(int) - expected).mean() < shifted / 2, name
