"""Model definitions following the Gluon model zoo (``vision.get_model``)."""

from __future__ import annotations

from engine.gluon.model_zoo import vision

__all__ = ["vision"]
