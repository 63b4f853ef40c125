"""A tiny image classifier with an ``imagenet`` pipeline, test images, and its reference.

Convolution (3 -> 4 channels), global average pooling, FullyConnected to 5 classes, random
weights, taking ``(N, 3, 224, 224)``. The reference preprocesses with NumPy and Pillow alone
(not the server's pipeline) and runs the same files through `engine.load_model`.
"""

from __future__ import annotations

import io
import struct
import zlib
from typing import Any

import numpy as np
from PIL import Image, ImageOps

import engine
from engine import sym
from engine.graph.params import save_params

NAME = "tinynet"
CONFIG = {"max_batch_size": 8, "inputs": [{"name": "data", "preprocess": "imagenet"}],
          "outputs": [{"name": "scores", "source": "fc_output"}],
          "dynamic_batching": {"max_queue_delay_us": 5000}}
MEAN = np.array([0.485, 0.456, 0.406])
STD = np.array([0.229, 0.224, 0.225])


def _symbol() -> Any:
    data = sym.var("data")
    conv = sym.Convolution(data, kernel=(3, 3), pad=(1, 1), num_filter=4, name="conv")
    pool = sym.Pooling(conv, global_pool=True, pool_type="avg", kernel=(1, 1), name="pool")
    return sym.FullyConnected(pool, num_hidden=5, name="fc")


def model_files(seed: int = 7) -> tuple[bytes, bytes]:
    """(symbol JSON, params) of the tiny classifier."""
    symbol = _symbol()
    shapes, _, _ = symbol.infer_shape(data=(1, 3, 224, 224))
    rng = np.random.default_rng(seed)
    params = {f"arg:{name}": rng.normal(size=shape).astype(np.float32)
              for name, shape in zip(symbol.list_arguments(), shapes) if name != "data"}
    return symbol.tojson().encode(), save_params(None, params)


def reference_scores(symbol: bytes, params: bytes, images: list[bytes]) -> np.ndarray:
    """The model's outputs for `images`, preprocessed independently of the server."""
    model = engine.load_model(symbol, params)
    rows = np.stack([reference_row(data) for data in images]).astype(np.float32)
    return np.asarray(model.infer({"data": rows})["fc_output"])


def reference_row(data: bytes) -> np.ndarray:
    """The ImageNet evaluation transform in NumPy, Pillow decoding and resizing only."""
    rgb = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    width, height = rgb.size
    size = ((int(256 * width / height), 256) if height <= width
            else (256, int(256 * height / width)))
    resized = np.asarray(rgb.resize(size, Image.Resampling.BILINEAR), np.float64)
    top = int(round((resized.shape[0] - 224) / 2))
    left = int(round((resized.shape[1] - 224) / 2))
    crop = resized[top:top + 224, left:left + 224] / 255.0
    return ((crop - MEAN) / STD).transpose(2, 0, 1)


def photo(height: int, width: int, seed: int = 0) -> np.ndarray:
    """Smooth colour gradients plus a little noise: JPEG-friendly, different per seed."""
    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:height, 0:width] / max(height, width)
    phase = rng.uniform(0, 3, 3)
    base = np.stack([np.sin(6 * xs + phase[0]), np.cos(5 * ys + phase[1]),
                     np.sin(4 * (xs + ys) + phase[2])], axis=2)
    return np.clip(128 + 100 * base + rng.normal(0, 4, base.shape), 0, 255).astype(np.uint8)


def encode(pixels: np.ndarray, kind: str) -> bytes:
    """`pixels` as a JPEG (quality 90) or PNG file."""
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, kind, **({"quality": 90} if kind == "JPEG" else {}))
    return buffer.getvalue()


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares `width` x `height` palette pixels but holds almost no data."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body)))
    header = struct.pack(">IIBBBBB", width, height, 8, 3, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"PLTE", b"\x00" * 3)
            + chunk(b"IDAT", zlib.compress(b"\x00" * 1024)) + chunk(b"IEND", b""))
