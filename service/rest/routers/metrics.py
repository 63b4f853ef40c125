"""``GET /metrics`` in the Prometheus text format."""

from __future__ import annotations

from fastapi import APIRouter, Response

from service.dataplane.metrics import CONTENT_TYPE
from service.rest.deps import MetricsDep
from service.rest.routes import FileStackRoute

router = APIRouter(tags=["metrics"], route_class=FileStackRoute)


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE: {}}, "description": "Prometheus text"}})
async def metrics(metrics: MetricsDep) -> Response:
    """Request counts and latency, queue and compute time, batch sizes, loaded models, memory."""
    return Response(metrics.render(), media_type=CONTENT_TYPE)
