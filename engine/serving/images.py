"""Decode untrusted image bytes into an RGB Pillow image, safely.

Only JPEG, PNG and WebP are opened, recognised by their first bytes (never by a name or a
content type the client gives); the pixel count is read from the header and refused past a cap
before any pixel is decoded; EXIF orientation is applied; every mode ends as 8-bit RGB. Nothing
here fetches a URL: the input is bytes. Every refusal is an `ImageError` naming what is wrong.

Pillow decodes: simplejpeg and PyTurboJPEG were measured and decode a JPEG faster, but the
pipeline around the decode barely changes (docs/preprocessing.md, "The decoder").
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable

import numpy as np
from PIL import Image, UnidentifiedImageError

from engine.errors import InputError
from engine.serving.preprocess_config import DEFAULT_MAX_PIXELS

# First bytes of each accepted format, and the Pillow plugin that reads it.
ACCEPTED = ("JPEG", "PNG", "WEBP")
# A JPEG's EXIF segment is at most 64 KiB; PNG and WebP chunks can be far larger, and parsing
# one is work done before the pixels: anything past this is not a camera's EXIF.
MAX_EXIF_BYTES = 1 << 20

_ORIENTATION_TAG = 0x0112
# What turns a stored image upright, by EXIF orientation (as `ImageOps.exif_transpose` does).
_TRANSPOSES = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180,
               4: Image.Transpose.FLIP_TOP_BOTTOM, 5: Image.Transpose.TRANSPOSE,
               6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
               8: Image.Transpose.ROTATE_90}

# Formats a client may send by mistake, named in the refusal (the first bytes that mark them).
_OTHER_FORMATS: tuple[tuple[bytes, str], ...] = (
    (b"GIF87a", "GIF"), (b"GIF89a", "GIF"), (b"BM", "BMP"), (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"), (b"%PDF", "PDF"), (b"\x00\x00\x01\x00", "ICO"),
    (b"\x00\x00\x00\x0cjP  ", "JPEG 2000"), (b"8BPS", "PSD"), (b"<svg", "SVG"),
    (b"<?xml", "XML"),
)


class ImageError(InputError):
    """An encoded image is refused: empty, not an accepted format, too large, or corrupt."""


def sniff_format(data: bytes) -> str:
    """The format of `data` from its magic bytes: one of `ACCEPTED`.

    Raises:
        ImageError: empty, or another format (named when recognised).
    """
    if not data:
        raise ImageError("image is empty (0 bytes)")
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    raise ImageError(f"image format {_describe(data)} is not accepted; send "
                     f"{', '.join(ACCEPTED)}")


def _describe(data: bytes) -> str:
    """A name for the format `data` starts with, else its first bytes."""
    for magic, name in _OTHER_FORMATS:
        if data.startswith(magic):
            return name
    if data[4:8] == b"ftyp":
        return f"ISO media ({data[8:12].decode('latin-1')!r}: HEIC, AVIF or video)"
    return f"unknown (first bytes {data[:8]!r})"


def decode_image(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS,
                 draft_size: Callable[[int, int], tuple[int, int] | None] | None = None
                 ) -> tuple[Image.Image, tuple[int, int]]:
    """Decode `data` to an RGB image, EXIF orientation applied.

    Args:
        max_pixels: images with more pixels (width x height, from the header) are refused
            before decoding.
        draft_size: for JPEG, given the stored ``(width, height)``, the smallest size the
            caller needs (None: full size); libjpeg then decodes at 1/2, 1/4 or 1/8 scale when
            that is still at least as large. Much faster for photos larger than the model's
            input.

    Returns:
        The image and the ``(width, height)`` of the original, oriented as displayed (the
        decoded image is smaller when drafted).

    Raises:
        ImageError: empty, wrong format, over `max_pixels`, corrupt or truncated.
    """
    kind = sniff_format(data)
    image = _open(data, kind, max_pixels)
    stored = image.size
    if draft_size is not None and kind == "JPEG":
        target = draft_size(*stored)
        if target is not None:
            image.draft(None, target)
    try:
        image.load()
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError, Warning) as error:
        raise ImageError(f"{kind} image cannot be decoded (corrupt or truncated): "
                         f"{error}") from None
    orientation = exif_orientation(image.info.get("exif", b""))
    if orientation in _TRANSPOSES:
        image = image.transpose(_TRANSPOSES[orientation])
    # Orientations 5 to 8 turn the image a quarter: the displayed width is the stored height.
    original = (stored[1], stored[0]) if orientation in (5, 6, 7, 8) else stored
    return to_rgb(image), original


def _open(data: bytes, kind: str, max_pixels: int) -> Image.Image:
    """Parse the header only (Pillow opens lazily) and refuse too many pixels."""
    try:
        image = Image.open(io.BytesIO(data), formats=[kind])
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        # Pillow's own guard, past ~89 million pixels (a warning turned into an error too).
        raise ImageError(f"{kind} image has too many pixels ({error}); the limit is "
                         f"{max_pixels} pixels") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Warning) as error:
        # Pillow warns about malformed metadata (EXIF tags past the end); where warnings are
        # errors that is a refusal too, elsewhere the warning is logged and decoding goes on.
        raise ImageError(f"{kind} image header cannot be read (corrupt or truncated): "
                         f"{error}") from None
    width, height = image.size
    if width * height > max_pixels:
        raise ImageError(f"{kind} image is {width}x{height} ({width * height} pixels); the "
                         f"limit is {max_pixels} pixels")
    if width < 1 or height < 1:
        raise ImageError(f"{kind} image is {width}x{height}: it has no pixels")
    return image


def exif_orientation(exif: bytes) -> int:
    """The Orientation tag (1 to 8) of an EXIF block, 1 when absent or unreadable.

    Read directly rather than through Pillow's full EXIF parser, which warns on every
    malformed tag of a hostile block: only the first directory's entries are looked at.

    Raises:
        ImageError: the block is larger than `MAX_EXIF_BYTES`.
    """
    if len(exif) > MAX_EXIF_BYTES:
        raise ImageError(f"image EXIF block is {len(exif)} bytes; at most {MAX_EXIF_BYTES} "
                         "are read")
    tiff = exif.removeprefix(b"Exif\x00\x00")
    order = {b"II": "<", b"MM": ">"}.get(tiff[:2])
    if order is None or len(tiff) < 8:
        return 1
    (first,) = struct.unpack_from(order + "I", tiff, 4)
    if first + 2 > len(tiff):
        return 1
    (count,) = struct.unpack_from(order + "H", tiff, first)
    for entry in range(first + 2, min(first + 2 + 12 * count, len(tiff) - 11), 12):
        tag, kind, _, value = struct.unpack_from(order + "HHIH", tiff, entry)
        if tag == _ORIENTATION_TAG and kind == 3:  # SHORT
            return value if 1 <= value <= 8 else 1
    return 1


def to_rgb(image: Image.Image) -> Image.Image:
    """`image` as 8-bit RGB: grey and palette expanded, alpha dropped (the colour channels
    kept), CMYK converted, 16- and 32-bit grey scaled from their full range to 0-255."""
    if image.mode == "RGB":
        return image
    if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        return _wide_grey_to_rgb(image)
    if image.mode in ("P", "PA"):
        image = image.convert("RGBA")
    try:
        return image.convert("RGB")
    except ValueError as error:
        raise ImageError(f"image mode {image.mode} cannot be converted to RGB: "
                         f"{error}") from None


def _wide_grey_to_rgb(image: Image.Image) -> Image.Image:
    """16-bit grey (Pillow's ``I;16`` or ``I``) to RGB, 65535 becoming 255: Pillow's own
    conversion clips at 255 instead, turning most of a 16-bit image white."""
    values = np.asarray(image).astype(np.uint32)
    grey = ((np.clip(values, 0, 65535) + 128) // 257).astype(np.uint8)
    return Image.fromarray(np.repeat(grey[:, :, None], 3, axis=2), "RGB")
