"""Serving core, independent of HTTP: the model repository and the dynamic batcher."""

from __future__ import annotations

from engine.serving.batcher import BatchingPolicy, DynamicBatcher
from engine.serving.config import ModelConfig, TensorConfig
from engine.serving.stats import BatcherStats, Histogram

__all__ = ["BatcherStats", "BatchingPolicy", "DynamicBatcher", "Histogram", "ModelConfig",
           "TensorConfig"]
