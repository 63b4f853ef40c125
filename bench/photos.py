"""Realistic 500x375 JPEG photos for the image benchmarks, made from real photographs.

Nothing is downloaded: scikit-learn (a dev dependency) ships two photographs,
``china.jpg`` and ``flower.jpg`` (640x427). Each gives six photos: a 4:3 crop at the left,
the middle and the right, each also mirrored, resized to 500x375 with Lanczos and encoded
as a camera or a web site would: quality 90, 4:2:0 chroma subsampling, baseline, no EXIF.
"""

from __future__ import annotations

import io

from PIL import Image

SIZE = (500, 375)  # (width, height): the size of a typical web photo, 4:3
QUALITY = 90


def source_photos() -> list[Image.Image]:
    """scikit-learn's two bundled photographs, RGB."""
    from sklearn.datasets import load_sample_images

    return [Image.fromarray(array) for array in load_sample_images().images]


def crops(photo: Image.Image, size: tuple[int, int] = SIZE) -> list[Image.Image]:
    """Six views of `photo` at `size`: three crops of its aspect, each also mirrored."""
    width, height = photo.size
    crop_width = min(width, round(height * size[0] / size[1]))
    views = []
    for left in (0, (width - crop_width) // 2, width - crop_width):
        view = photo.crop((left, 0, left + crop_width, height)).resize(
            size, Image.Resampling.LANCZOS)
        views += [view, view.transpose(Image.Transpose.FLIP_LEFT_RIGHT)]
    return views


def encode_jpeg(image: Image.Image, quality: int = QUALITY) -> bytes:
    """`image` as a baseline JPEG with 4:2:0 subsampling (Pillow's ``subsampling=2``)."""
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=quality, subsampling=2)
    return buffer.getvalue()


def sample_jpegs(size: tuple[int, int] = SIZE, quality: int = QUALITY) -> list[bytes]:
    """Twelve JPEG photos of `size` (see the module's docstring)."""
    return [encode_jpeg(view, quality) for photo in source_photos()
            for view in crops(photo, size)]
