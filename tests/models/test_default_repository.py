"""The default repository in models/ serves a working digit classifier and the seed MLP."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

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
