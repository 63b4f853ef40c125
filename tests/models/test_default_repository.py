"""The default repository in models/ serves a working digit classifier (on 64 values, and on
images through `digits_image`) and the seed MLP."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits

from engine.serving.preprocess import preprocess_image
from engine.serving.preprocess_config import ImagePreprocess
from engine.serving.repository import ModelRepository

MODELS = Path(__file__).resolve().parents[2] / "models"


async def _predict(images: np.ndarray, mlp_input: np.ndarray) -> tuple[np.ndarray, dict]:
    repository = ModelRepository(MODELS)
    await repository.start()
    try:
        parts = await asyncio.gather(*(repository.infer("digits", {"data": images[i:i + 50]})
                                       for i in range(0, len(images), 50)))
        mlp = await repository.infer("seed_mlp", {"data": mlp_input})
    finally:
        await repository.close()
    return np.concatenate([next(iter(part.values())) for part in parts]), mlp


def test_default_models_load_and_predict_digits() -> None:
    data = load_digits()
    images = data.data.astype(np.float32)  # raw 0..16 pixels, as clients send them
    scores, mlp = asyncio.run(_predict(images[:300], np.zeros((1, 512), np.float32)))
    accuracy = float((scores.argmax(axis=1) == data.target[:300]).mean())
    assert accuracy > 0.9, f"digit accuracy {accuracy}"
    assert scores.argmax(axis=1)[0] == 0  # the README's curl example is this first image, a 0
    assert next(iter(mlp.values())).shape == (1, 2)


def digit_png(values: np.ndarray, side: int) -> bytes:
    """An 8x8 digit (ink 0..16) drawn dark on light as a `side` x `side` grey PNG."""
    pixels = np.round(255 * (1 - values / 16)).astype(np.uint8)
    image = Image.fromarray(pixels, "L").resize((side, side), Image.Resampling.NEAREST)
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


async def _scores(name: str, input_name: str, rows: np.ndarray) -> np.ndarray:
    repository = ModelRepository(MODELS)
    await repository.start()
    try:
        handle = repository.get(name)
        labels = handle.labels
        parts = await asyncio.gather(*(repository.infer(name, {input_name: rows[i:i + 50]})
                                       for i in range(0, len(rows), 50)))
    finally:
        await repository.close()
    return np.concatenate([next(iter(part.values())) for part in parts]), labels


def test_digits_image_reads_drawn_digits_with_its_own_pipeline_and_labels() -> None:
    data = load_digits()
    config = json.loads((MODELS / "digits_image" / "config.json").read_text())
    options = ImagePreprocess.model_validate(config["inputs"][0]["preprocess"]["image"])
    # Drawn at 8x8 the pipeline only inverts and scales: the same scores as `digits` on the
    # raw values (up to PNG's rounding to 255 levels).
    exact = np.stack([preprocess_image(digit_png(image, 8), options)[0]
                      for image in data.images[:100]])
    image_scores, labels = asyncio.run(_scores("digits_image", "image", exact))
    plain_scores, _ = asyncio.run(_scores("digits", "data",
                                          data.data[:100].astype(np.float32)))
    np.testing.assert_allclose(image_scores, plain_scores, atol=0.05)
    assert labels == {"scores": ("zero", "one", "two", "three", "four", "five", "six", "seven",
                                 "eight", "nine")}
    # Drawn at 32x32 (as the README's sample) they are shrunk back by the pipeline's resize.
    drawn = np.stack([preprocess_image(digit_png(image, 32), options)[0]
                      for image in data.images[:300]])
    scores, _ = asyncio.run(_scores("digits_image", "image", drawn))
    accuracy = float((scores.argmax(axis=1) == data.target[:300]).mean())
    assert accuracy > 0.85, f"drawn digit accuracy {accuracy}"
