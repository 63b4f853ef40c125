"""Responses serialised with orjson (numpy arrays included, without converting to lists)."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def dumps(content: Any) -> bytes:
    """JSON bytes of `content`; numpy arrays must be C-contiguous (see
    `service.tensors.json.json_ready`)."""
    return orjson.dumps(content, option=OPTIONS)


class OrjsonResponse(Response):
    """A JSON response rendered by orjson."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        """Serialise `content`."""
        return dumps(content)


def json_response(content: Any, status: int = 200,
                  headers: dict[str, str] | None = None) -> OrjsonResponse:
    """A JSON response with `status` and extra `headers`."""
    return OrjsonResponse(content, status_code=status, headers=headers)
