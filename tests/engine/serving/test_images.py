"""Safe decoding (`engine.serving.images`): formats, modes, orientation and hostile inputs."""

from __future__ import annotations

import io
import tracemalloc
import warnings

import numpy as np
import pytest
from PIL import Image

from engine.errors import InputError
from engine.serving.images import (
    MAX_EXIF_BYTES,
    ImageError,
    decode_image,
    exif_orientation,
    sniff_format,
)
from tests.service.image_model import png_header_only

RNG = np.random.default_rng(25)
ORIENTATION = 0x0112


def encode(image: Image.Image, kind: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, kind, **options)
    return buffer.getvalue()


def noise(width: int, height: int) -> Image.Image:
    return Image.fromarray(RNG.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB")


@pytest.mark.parametrize("kind", ["JPEG", "PNG", "WEBP"])
def test_accepted_formats_decode_to_rgb(kind: str) -> None:
    source = noise(33, 17)
    image, original = decode_image(encode(source, kind, **({"lossless": True}
                                                           if kind == "WEBP" else {})))
    assert image.mode == "RGB" and image.size == (33, 17) and original == (33, 17)
    if kind != "JPEG":  # lossless formats give the pixels back exactly
        np.testing.assert_array_equal(np.asarray(image), np.asarray(source))


def test_grey_becomes_three_equal_channels() -> None:
    grey = Image.fromarray(np.arange(60, dtype=np.uint8).reshape(6, 10) * 4, "L")
    image, _ = decode_image(encode(grey, "PNG"))
    pixels = np.asarray(image)
    assert pixels.shape == (6, 10, 3)
    for channel in range(3):
        np.testing.assert_array_equal(pixels[:, :, channel], np.asarray(grey))
    jpeg, _ = decode_image(encode(grey, "JPEG", quality=95))
    assert jpeg.mode == "RGB" and np.abs(np.asarray(jpeg)[:, :, 0].astype(int)
                                         - np.asarray(grey)).max() <= 8


def test_palette_and_alpha_modes_keep_their_colours() -> None:
    palette = Image.new("P", (4, 2))
    palette.putpalette([255, 0, 0, 0, 0, 255] + [0] * 762)
    palette.putdata([0, 1, 0, 1, 1, 0, 1, 0])
    expected = np.array([[255, 0, 0], [0, 0, 255]], np.uint8)[np.array([0, 1, 0, 1, 1, 0, 1, 0])]
    image, _ = decode_image(encode(palette, "PNG"))
    np.testing.assert_array_equal(np.asarray(image).reshape(-1, 3), expected)
    rgba = np.dstack([np.asarray(noise(5, 3)), np.full((3, 5), 7, np.uint8)])
    image, _ = decode_image(encode(Image.fromarray(rgba, "RGBA"), "PNG"))
    np.testing.assert_array_equal(np.asarray(image), rgba[:, :, :3])
    grey_alpha = Image.fromarray(np.dstack([np.full((3, 5), 90, np.uint8)] * 2), "LA")
    image, _ = decode_image(encode(grey_alpha, "PNG"))
    assert (np.asarray(image) == 90).all()


def test_cmyk_jpeg_becomes_rgb() -> None:
    red = Image.new("CMYK", (16, 16), (0, 255, 255, 0))
    image, _ = decode_image(encode(red, "JPEG", quality=95))
    assert image.mode == "RGB"
    np.testing.assert_allclose(np.asarray(image).reshape(-1, 3).mean(axis=0), [255, 0, 0],
                               atol=6)


def test_16_bit_grey_png_is_scaled_not_clipped() -> None:
    values = np.array([[0, 257 * 100, 65535, 32896]], np.uint16)
    data = encode(Image.fromarray(values), "PNG")
    assert Image.open(io.BytesIO(data)).mode.startswith("I")
    image, _ = decode_image(data)
    np.testing.assert_array_equal(np.asarray(image)[0, :, 0], [0, 100, 255, 128])


@pytest.mark.parametrize("orientation, top_colour", [(6, (255, 0, 0)), (8, (0, 0, 255)),
                                                     (3, None), (1, None)])
def test_exif_orientation_is_applied(orientation: int, top_colour: tuple | None) -> None:
    # Stored 40 wide, 20 high: the left half red, the right half blue.
    stored = np.zeros((20, 40, 3), np.uint8)
    stored[:, :20, 0], stored[:, 20:, 2] = 255, 255
    exif = Image.Exif()
    exif[ORIENTATION] = orientation
    data = encode(Image.fromarray(stored), "JPEG", quality=95, exif=exif.tobytes())
    image, original = decode_image(data)
    pixels = np.asarray(image).astype(int)
    if top_colour is None:  # no quarter turn: 40x20 still; 3 turns it half, blue on the left
        assert image.size == original == (40, 20)
        left = (0, 0, 255) if orientation == 3 else (255, 0, 0)
        np.testing.assert_allclose(pixels[:, :15].reshape(-1, 3).mean(axis=0), left, atol=8)
        return
    # 6 turns it clockwise for display (left half on top), 8 anticlockwise.
    assert image.size == original == (20, 40)
    np.testing.assert_allclose(pixels[:15].reshape(-1, 3).mean(axis=0), top_colour, atol=8)


def test_sniffing_names_what_it_refuses() -> None:
    gif = encode(Image.new("P", (2, 2)), "GIF")
    bmp = encode(Image.new("RGB", (2, 2)), "BMP")
    tiff = encode(Image.new("RGB", (2, 2)), "TIFF")
    cases = {gif: "GIF", bmp: "BMP", tiff: "TIFF", b"hello, world": "unknown",
             b"\x00\x00\x00\x1cftypavif": "HEIC, AVIF"}
    for data, named in cases.items():
        with pytest.raises(ImageError, match=f"image format .*{named}.* is not accepted; send "
                                             "JPEG, PNG, WEBP"):
            sniff_format(data)
    assert issubclass(ImageError, InputError)  # the service maps it to 400


def test_empty_and_truncated_images_are_refused() -> None:
    with pytest.raises(ImageError, match=r"image is empty \(0 bytes\)"):
        decode_image(b"")
    jpeg = encode(noise(64, 64), "JPEG")
    for cut in (jpeg[:len(jpeg) // 2], jpeg[:4]):
        with pytest.raises(ImageError, match="JPEG image .*(corrupt or truncated)"):
            decode_image(cut)
    png = encode(noise(64, 64), "PNG")
    with pytest.raises(ImageError, match="PNG image .*(corrupt or truncated)"):
        decode_image(png[:len(png) // 2])


def test_a_20000_square_png_under_1_mb_is_refused_from_its_header() -> None:
    data = png_header_only(20000, 20000)
    assert len(data) < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(ImageError, match="PNG image has too many pixels"):
            decode_image(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20  # 400 million pixels would be 400 MB


def test_the_pixel_cap_is_checked_before_decoding() -> None:
    # 8000x8000 is under Pillow's own bomb limit: refused by the configured cap alone.
    with pytest.raises(ImageError, match=r"PNG image is 8000x8000 \(64000000 pixels\); the "
                                         r"limit is 40000000 pixels"):
        decode_image(png_header_only(8000, 8000))
    data = encode(noise(100, 50), "JPEG")
    with pytest.raises(ImageError, match=r"100x50 \(5000 pixels\); the limit is 4999"):
        decode_image(data, max_pixels=4999)
    assert decode_image(data, max_pixels=5000)[0].size == (100, 50)


def test_a_1_by_100000_image_decodes_within_the_cap() -> None:
    line = Image.fromarray(np.full((1, 100000, 3), 200, np.uint8), "RGB")
    image, original = decode_image(encode(line, "PNG"))
    assert image.size == original == (100000, 1)


def test_huge_exif_is_refused() -> None:
    exif = b"Exif\x00\x00MM\x00*" + b"\x00" * (MAX_EXIF_BYTES + 10)
    data = encode(noise(8, 8), "PNG", exif=exif)
    with pytest.raises(ImageError, match=f"EXIF block is {len(exif)} bytes; at most "
                                         f"{MAX_EXIF_BYTES}"):
        decode_image(data)


def test_garbage_exif_in_a_jpeg_is_ignored_or_refused_with_warnings_as_errors() -> None:
    # The largest EXIF a JPEG segment holds, all noise after a valid TIFF header.
    garbage = b"Exif\x00\x00MM\x00*\x00\x00\x00\x08" + RNG.bytes(65000)
    data = encode(noise(16, 16), "JPEG", exif=garbage)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        image, _ = decode_image(data)
    assert image.mode == "RGB" and image.size == (16, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ImageError, match="JPEG image header cannot be read"):
            decode_image(data)


def test_exif_orientation_reader_survives_any_block() -> None:
    exif = Image.Exif()
    exif[ORIENTATION] = 6
    block = exif.tobytes()
    assert block.startswith(b"Exif\x00\x00") and exif_orientation(block) == 6
    assert exif_orientation(block.removeprefix(b"Exif\x00\x00")) == 6
    for broken in (b"", b"Exif\x00\x00", block[:12], block[:-3], RNG.bytes(3000),
                   b"Exif\x00\x00II*\x00\xff\xff\xff\xff"):
        assert exif_orientation(broken) in range(1, 9)


def test_draft_decodes_a_large_jpeg_at_reduced_scale() -> None:
    data = encode(noise(800, 600), "JPEG")
    image, original = decode_image(data, draft_size=lambda width, height: (width // 4,
                                                                           height // 4))
    assert image.size == (200, 150) and original == (800, 600)
    png, _ = decode_image(encode(noise(80, 60), "PNG"), draft_size=lambda w, h: (w // 4, h // 4))
    assert png.size == (80, 60)  # only JPEG decodes at reduced scale
