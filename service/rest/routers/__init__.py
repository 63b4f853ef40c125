"""The routers, one per resource, gathered for the inference and the management APIs.

Each resource module holds its FastAPI routes (``router``) and, for the hot routes, its plain
ASGI routes (``ROUTES``, see `service.rest.routes`); a route is declared in exactly one of them.
"""

from __future__ import annotations

from service.rest.routers import health, metrics, models, predict, v2_models, v2_repository

INFERENCE = (health.router, v2_models.router, metrics.router)
MANAGEMENT = (v2_repository.router, models.router)
HEALTH = (health.router,)
# ASGI routes, matched before the FastAPI routes: fixed paths (a string comparison) before
# patterns, the busiest first.
INFERENCE_ASGI = (*predict.ROUTES, *health.ROUTES, *v2_models.ROUTES)
HEALTH_ASGI = tuple(health.ROUTES)
