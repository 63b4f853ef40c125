"""Errors as gRPC status codes: the REST side's HTTP status, translated, with its message."""

from __future__ import annotations

import grpc

from service.errors import error_reply

# The code of each HTTP status the service answers (`service.errors` maps errors to those).
# 413 is RESOURCE_EXHAUSTED, as gRPC itself answers a message over the size limit.
CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    422: grpc.StatusCode.FAILED_PRECONDITION,
    500: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def code_of(status: int) -> grpc.StatusCode:
    """The gRPC code of an HTTP status (UNKNOWN for one the table lacks)."""
    return CODES.get(status, grpc.StatusCode.UNKNOWN)


def refusal(error: Exception, method: str) -> tuple[int, grpc.StatusCode, str]:
    """The HTTP status, gRPC code and message of `error` (logged as REST logs it)."""
    status, message, _ = error_reply(error, "gRPC", method)
    return status, code_of(status), message
