"""Serving core, independent of HTTP: the model repository and the dynamic batcher."""

from __future__ import annotations

from engine.serving.batcher import BatchingPolicy, DynamicBatcher
from engine.serving.config import ModelConfig, TensorConfig
from engine.serving.errors import (
    Conflict,
    InvalidModel,
    InvalidName,
    MemoryBudgetExceeded,
    ModelNotFound,
    ModelNotReady,
    ModelNotServing,
    Overloaded,
    ServingError,
    TimedOut,
    VersionNotFound,
)
from engine.serving.loaded import LoadedVersion, MemoryUsage, VersionState, VersionStatus
from engine.serving.repository import ModelRepository
from engine.serving.stats import BatcherStats, Histogram

__all__ = [
    "BatcherStats", "BatchingPolicy", "Conflict", "DynamicBatcher", "Histogram", "InvalidModel",
    "InvalidName", "LoadedVersion", "MemoryBudgetExceeded", "MemoryUsage", "ModelConfig",
    "ModelNotFound", "ModelNotReady", "ModelNotServing", "ModelRepository", "Overloaded",
    "ServingError", "TensorConfig", "TimedOut", "VersionNotFound", "VersionState",
    "VersionStatus",
]
