"""Run an input's image pipeline: encoded bytes to one batch row of the model's input.

Decode (`engine.serving.images`), resize (shorter side, exact or letterbox), centre crop, then
``(pixel * scale - mean) / std`` per channel in the configured colour order, layout and dtype.
Pure Pillow and NumPy, deterministic. Alongside the row comes a `Geometry`: where the original
image's pixels landed in the model's input, to map boxes back (detection postprocessing).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from PIL import Image

from engine.serving.images import ImageError, decode_image
from engine.serving.preprocess_config import ImagePreprocess, ResizeConfig

_FILTERS = {"nearest": Image.Resampling.NEAREST, "bilinear": Image.Resampling.BILINEAR,
            "bicubic": Image.Resampling.BICUBIC}
_DTYPES = {"FP32": np.dtype(np.float32), "FP16": np.dtype(np.float16),
           "UINT8": np.dtype(np.uint8)}
# A reduced-scale JPEG decode is asked for only when the image is at least this much larger
# than the model needs (libjpeg scales by 1/2, 1/4 or 1/8).
_DRAFT_FACTOR = 2.0


@dataclass(frozen=True)
class Geometry:
    """How a model-input pixel relates to the original image (as displayed, EXIF applied):
    ``input = original * scale + offset`` per axis, ``(y, x)`` order."""

    original: tuple[int, int]  # (height, width)
    scale: tuple[float, float] = (1.0, 1.0)
    offset: tuple[float, float] = (0.0, 0.0)

    def to_original(self, boxes: np.ndarray) -> np.ndarray:
        """Boxes ``[..., (x1, y1, x2, y2)]`` in model-input pixels, in the original image's
        pixels, clipped to it."""
        boxes = np.asarray(boxes, dtype=np.float64)
        (scale_y, scale_x), (offset_y, offset_x) = self.scale, self.offset
        xs = (boxes[..., 0::2] - offset_x) / scale_x
        ys = (boxes[..., 1::2] - offset_y) / scale_y
        height, width = self.original
        out = np.empty_like(boxes)
        out[..., 0::2] = np.clip(xs, 0, width)
        out[..., 1::2] = np.clip(ys, 0, height)
        return out


def preprocess_image(data: bytes, options: ImagePreprocess) -> tuple[np.ndarray, Geometry]:
    """One batch row (shape `options.output_shape`) from encoded image bytes.

    Raises:
        ImageError: the image is refused (see `engine.serving.images.decode_image`), or is
            smaller than the centre crop when the pipeline does not resize.
    """
    draft = _draft_size(options.resize) if options.jpeg_draft else None
    image, (width, height) = decode_image(data, max_pixels=options.max_pixels,
                                          draft_size=draft)
    image, geometry = resize_and_crop(image, (height, width), options)
    return to_array(image, options), geometry


def resize_and_crop(image: Image.Image, original: tuple[int, int],
                    options: ImagePreprocess) -> tuple[Image.Image, Geometry]:
    """`image` resized and cropped as `options` say; `original` is the ``(height, width)``
    before any reduced-scale decode, which sizes come from so that drafting changes none."""
    geometry = Geometry(original, (image.height / original[0], image.width / original[1]))
    if options.resize is not None:
        image, geometry = _resize(image, original, options.resize, options.max_pixels)
    if options.center_crop is not None:
        image, geometry = _center_crop(image, geometry, options.center_crop)
    return image, geometry


def _resize(image: Image.Image, original: tuple[int, int], resize: ResizeConfig,
            max_pixels: int) -> tuple[Image.Image, Geometry]:
    height, width = original
    resample = _FILTERS[resize.interpolation]
    if resize.letterbox is not None:
        return _letterbox(image, original, resize.letterbox, resize.pad_value, resample)
    if resize.exact is not None:
        new_height, new_width = resize.exact
    else:
        new_height, new_width = shorter_side_size(original, resize.shorter_side or 0)
        if new_height * new_width > max_pixels:  # a 1x100000 strip would become 256x25.6M
            raise ImageError(f"image is {width}x{height} (width x height): resizing its "
                             f"shorter side to {resize.shorter_side} would make it "
                             f"{new_width}x{new_height}, over the limit of {max_pixels} "
                             "pixels; its aspect ratio is too extreme")
    resized = image.resize((new_width, new_height), resample)
    return resized, Geometry(original, (new_height / height, new_width / width))


def shorter_side_size(original: tuple[int, int], side: int) -> tuple[int, int]:
    """``(height, width)`` with the shorter side `side` and the aspect kept; the longer side
    truncated, as torchvision's ``Resize(int)`` does."""
    height, width = original
    if height <= width:
        return side, max(1, int(side * width / height))
    return max(1, int(side * height / width)), side


def _letterbox(image: Image.Image, original: tuple[int, int], target: tuple[int, int],
               pad_value: tuple[int, ...], resample: Image.Resampling
               ) -> tuple[Image.Image, Geometry]:
    """Fit the whole image into `target`, aspect kept, centred on a `pad_value` canvas."""
    (height, width), (target_height, target_width) = original, target
    factor = min(target_height / height, target_width / width)
    new_height = min(target_height, max(1, round(height * factor)))
    new_width = min(target_width, max(1, round(width * factor)))
    top, left = (target_height - new_height) // 2, (target_width - new_width) // 2
    canvas = Image.new("RGB", (target_width, target_height), tuple(pad_value))
    canvas.paste(image.resize((new_width, new_height), resample), (left, top))
    return canvas, Geometry(original, (new_height / height, new_width / width),
                            (float(top), float(left)))


def _center_crop(image: Image.Image, geometry: Geometry,
                 crop: tuple[int, int]) -> tuple[Image.Image, Geometry]:
    crop_height, crop_width = crop
    if crop_height > image.height or crop_width > image.width:
        raise ImageError(f"image is {image.width}x{image.height} (width x height) after "
                         f"resizing, smaller than the centre crop {crop_width}x{crop_height}")
    top = int(round((image.height - crop_height) / 2))
    left = int(round((image.width - crop_width) / 2))
    cropped = image.crop((left, top, left + crop_width, top + crop_height))
    offset = (geometry.offset[0] - top, geometry.offset[1] - left)
    return cropped, Geometry(geometry.original, geometry.scale, offset)


def to_array(image: Image.Image, options: ImagePreprocess) -> np.ndarray:
    """The RGB image as the model's row: colour order, normalisation, layout, dtype."""
    if options.color == "L":  # ITU-R 601 luma, as Pillow's convert("L")
        pixels = np.asarray(image.convert("L"))[:, :, None]
    else:
        pixels = np.asarray(image)
    if options.color == "BGR":
        pixels = pixels[:, :, ::-1]
    if options.layout == "NCHW":
        pixels = pixels.transpose(2, 0, 1)  # a view of the uint8 pixels
    if options.dtype == "UINT8":
        return np.ascontiguousarray(pixels)
    # (p * scale - mean) / std as one multiply and one add, written straight into a
    # contiguous row: transposing the floats afterwards copied 4x the bytes, strided, and
    # took most of this function's time.
    channels = slice(0, options.channels)
    std = np.asarray(options.std[channels], np.float32)
    per_channel = (-1, 1, 1) if options.layout == "NCHW" else (1, 1, -1)
    gain = (np.float32(options.scale) / std).reshape(per_channel)
    bias = (-np.asarray(options.mean[channels], np.float32) / std).reshape(per_channel)
    row = np.multiply(pixels, gain, out=np.empty(pixels.shape, np.float32))
    row += bias
    return row.astype(_DTYPES[options.dtype], copy=False)


def _draft_size(resize: ResizeConfig | None) -> Callable[[int, int], tuple[int, int] | None] | None:
    """For `decode_image`: the size a JPEG may be decoded at, at least what `resize` needs
    (conservatively, whatever the EXIF orientation), or None when not much smaller."""
    if resize is None:
        return None

    def needed(width: int, height: int) -> tuple[int, int] | None:
        side = resize.shorter_side or max(resize.fixed_size or (0, 0))
        factor = side / min(width, height)
        if factor * _DRAFT_FACTOR > 1.0:
            return None
        return math.ceil(width * factor), math.ceil(height * factor)

    return needed
