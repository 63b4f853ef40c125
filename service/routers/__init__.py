"""The routers, one per resource, gathered for the inference and the management APIs."""

from __future__ import annotations

from service.routers import health, metrics, models, predict, v2_models, v2_repository

INFERENCE = (health.router, v2_models.router, predict.router, metrics.router)
MANAGEMENT = (v2_repository.router, models.router)
HEALTH = (health.router,)

