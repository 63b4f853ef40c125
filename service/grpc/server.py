"""Start and stop the gRPC server on the running event loop (the HTTP server's)."""

from __future__ import annotations

import grpc

from service.grpc import inference_pb2_grpc as pb_grpc
from service.grpc.servicer import InferenceServicer
from service.runtime import Runtime

STOP_GRACE_S = 5.0


class GrpcPortError(Exception):
    """The gRPC port cannot be listened on."""


def address(host: str, port: int) -> str:
    """``host:port``, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def start_grpc(runtime: Runtime) -> grpc.aio.Server:
    """A started gRPC server for `runtime` on ``settings.host:settings.grpc_port``.

    Messages over ``max_request_bytes`` are refused by gRPC itself (RESOURCE_EXHAUSTED), as
    REST refuses such bodies with 413.

    Raises:
        GrpcPortError: the port is taken or the address cannot be bound.
    """
    settings = runtime.settings
    server = grpc.aio.server(options=[
        ("grpc.max_receive_message_length", settings.max_request_bytes),
        ("grpc.max_send_message_length", -1),
        # Without this a second server could silently share a port that is already taken.
        ("grpc.so_reuseport", 0),
    ])
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(runtime), server)
    where = address(settings.host, settings.grpc_port)
    try:
        bound = server.add_insecure_port(where)
    except RuntimeError as error:
        raise GrpcPortError(f"cannot listen for gRPC on {where}: {error}") from None
    if bound == 0:
        raise GrpcPortError(f"cannot listen for gRPC on {where}: the port is taken or the "
                            "address is not this machine's (set --grpc-port, or 0 for no gRPC)")
    await server.start()
    return server
