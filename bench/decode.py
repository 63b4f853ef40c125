"""JPEG decoders compared: Pillow, simplejpeg and PyTurboJPEG on 500x375 photos (issue #25).

Two tasks per decoder, on the twelve photos of `bench/photos.py`:

- ``decode``: bytes to the decoder's own RGB result (a loaded Pillow image; a NumPy array
  for the others);
- ``pipeline``: the ``imagenet`` preset's geometry: decode, shorter side to 256 (Pillow's
  bilinear resize for every decoder, so only the decoding differs), centre crop 224, to a
  uint8 NumPy array. ``+ scaled DCT`` rows ask libjpeg for a reduced-scale decode that is
  still at least what the resize needs: Pillow's ``draft`` offers 1/2, 1/4, 1/8 only (none
  fits a 375-pixel side going to 256); simplejpeg's ``min_height``/``min_width`` and
  PyTurboJPEG's ``scaling_factor`` also offer M/8 (3/4 fits: 375 to 282).

Each is timed on one thread (ms per image) and on two threads decoding different photos at
once (images/s of both together; every decoder releases the GIL), the best of 15 rounds that
each run every task in turn. A decoder whose package is not installed is left out: simplejpeg
and PyTurboJPEG are not project dependencies (PyTurboJPEG also needs the system's
libturbojpeg).

    .venv/bin/python bench/decode.py                # ~1 minute
    .venv/bin/python bench/decode.py --size 2000 1500
"""

from __future__ import annotations

import argparse
import io
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np
from PIL import Image

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]
from bench.photos import sample_jpegs  # noqa: E402
from engine.serving.preprocess import shorter_side_size  # noqa: E402

SHORTER_SIDE, CROP = 256, 224
Decoder = Callable[[bytes, bool], "Image.Image | np.ndarray"]


def needed_size(width: int, height: int) -> tuple[int, int]:
    """The smallest ``(width, height)`` the resize to `SHORTER_SIDE` can start from."""
    factor = SHORTER_SIDE / min(width, height)
    return math.ceil(width * factor), math.ceil(height * factor)


def pillow_decode(data: bytes, scaled: bool) -> Image.Image:
    """Pillow, with ``draft`` (1/2, 1/4, 1/8) when `scaled`."""
    image = Image.open(io.BytesIO(data), formats=["JPEG"])
    if scaled:
        image.draft("RGB", needed_size(*image.size))
    image.load()
    return image


def simplejpeg_decoder() -> Decoder | None:
    """simplejpeg's `decode_jpeg`, with ``min_width``/``min_height`` when scaled."""
    try:
        import simplejpeg
    except ImportError:
        return None

    def decode(data: bytes, scaled: bool) -> np.ndarray:
        if not scaled:
            return simplejpeg.decode_jpeg(data, "RGB")
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        min_width, min_height = needed_size(width, height)
        return simplejpeg.decode_jpeg(data, "RGB", min_height=min_height, min_width=min_width)

    return decode


def turbojpeg_decoder() -> Decoder | None:
    """PyTurboJPEG's `decode` with the smallest scaling factor still large enough."""
    try:
        import turbojpeg

        jpeg = turbojpeg.TurboJPEG()
    except (ImportError, OSError, RuntimeError):
        return None
    factors = sorted(jpeg.scaling_factors, key=lambda pair: pair[0] / pair[1])

    def decode(data: bytes, scaled: bool) -> np.ndarray:
        if not scaled:
            return jpeg.decode(data, pixel_format=turbojpeg.TJPF_RGB)
        width, height, _, _ = jpeg.decode_header(data)
        min_width, min_height = needed_size(width, height)
        factor = next(pair for pair in factors
                      if width * pair[0] / pair[1] >= min_width
                      and height * pair[0] / pair[1] >= min_height)
        return jpeg.decode(data, pixel_format=turbojpeg.TJPF_RGB, scaling_factor=factor)

    return decode


def pipeline(decode: Decoder, data: bytes, scaled: bool) -> np.ndarray:
    """Decode, resize the shorter side to 256 (Pillow, bilinear), crop 224 from the middle."""
    decoded = decode(data, scaled)
    image = decoded if isinstance(decoded, Image.Image) else Image.fromarray(decoded)
    # Sizes come from the stored size, so a scaled decode changes only the pixels.
    original = Image.open(io.BytesIO(data)).size if scaled else image.size
    height, width = shorter_side_size((original[1], original[0]), SHORTER_SIDE)
    resized = image.resize((width, height), Image.Resampling.BILINEAR)
    top, left = round((height - CROP) / 2), round((width - CROP) / 2)
    return np.asarray(resized.crop((left, top, left + CROP, top + CROP)))


def per_image_ms(task: Callable[[bytes], object], photos: list[bytes]) -> float:
    """Mean milliseconds per photo, one thread, one pass."""
    started = time.perf_counter()
    for data in photos:
        task(data)
    return (time.perf_counter() - started) / len(photos) * 1e3


def two_thread_rate(task: Callable[[bytes], object], photos: list[bytes],
                    pool: ThreadPoolExecutor) -> float:
    """Images/s with two threads, each working through half the photos, one pass."""
    halves = [photos[0::2], photos[1::2]]
    started = time.perf_counter()
    list(pool.map(lambda half: [task(data) for data in half], halves))
    return len(photos) / (time.perf_counter() - started)


def best_of(tasks: dict[str, Callable[[bytes], object]], photos: list[bytes],
            rounds: int) -> dict[str, tuple[float, float]]:
    """Per task, the best one-thread ms/image and the best two-thread images/s. Every round
    runs every task, so a burst of load from other processes slows all tasks alike and the
    best round of each is its figure on a quiet machine."""
    single = {label: math.inf for label in tasks}
    double = {label: 0.0 for label in tasks}
    with ThreadPoolExecutor(2) as pool:
        for _ in range(rounds):
            for label, task in tasks.items():
                single[label] = min(single[label], per_image_ms(task, photos))
                double[label] = max(double[label], two_thread_rate(task, photos, pool))
    return {label: (single[label], double[label]) for label in tasks}


def decoders() -> dict[str, Decoder]:
    """Every decoder installed here, by name."""
    found: dict[str, Decoder | None] = {"Pillow": pillow_decode,
                                         "simplejpeg": simplejpeg_decoder(),
                                         "PyTurboJPEG": turbojpeg_decoder()}
    return {name: decode for name, decode in found.items() if decode is not None}


def versions() -> str:
    """The decoders' and their libjpeg's versions."""
    from PIL import __version__, features

    parts = [f"Pillow {__version__} (libjpeg-turbo {features.version('libjpeg_turbo')})"]
    for module, name in (("simplejpeg", "simplejpeg"), ("turbojpeg", "PyTurboJPEG")):
        try:
            parts.append(f"{name} {__import__(module).__version__}")
        except (ImportError, AttributeError):
            pass
    return ", ".join(parts)


def main() -> None:
    """Print one table row per (decoder, task)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, nargs=2, default=(500, 375), metavar=("W", "H"))
    parser.add_argument("--repeat", type=int, default=2, help="passes over the photos a round")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    photos = sample_jpegs(tuple(args.size)) * args.repeat
    print(f"machine: nproc {os.cpu_count()}, {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}, NumPy {np.__version__}; {versions()}")
    print(f"{len(photos)} photos a round, {args.size[0]}x{args.size[1]}, mean "
          f"{np.mean([len(data) for data in photos]) / 1024:.1f} KiB")
    print("| decoder | task | 1 thread ms/image | 1 thread images/s | 2 threads images/s |")
    print("|---|---|---|---|---|")
    tasks = {}
    for name, decode in decoders().items():
        tasks[f"{name} | decode"] = partial(decode, scaled=False)
        tasks[f"{name} | pipeline"] = partial(pipeline, decode, scaled=False)
        tasks[f"{name} | pipeline + scaled DCT"] = partial(pipeline, decode, scaled=True)
    for label, (single, double) in best_of(tasks, photos, args.rounds).items():
        print(f"| {label} | {single:.2f} | {1e3 / single:.0f} | {double:.0f} |")

if __name__ == "__main__":
    main()
