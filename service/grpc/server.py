"""Start and stop the gRPC server on the running event loop (the HTTP server's)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message

from service.grpc import inference_pb2 as pb
from service.grpc.servicer import InferenceServicer
from service.runtime import Runtime

SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
Handler = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Message]]


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
    server.add_generic_rpc_handlers((handlers(InferenceServicer(runtime)),))
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


def handlers(servicer: InferenceServicer) -> grpc.GenericRpcHandler:
    """Every RPC of the service, each parsing its own request (see `_parsing`); a streaming
    RPC gets its messages as bytes and parses each itself, so that one bad message fails
    that request alone, not the stream."""
    methods = {}
    for method in SERVICE.methods:
        request_type = getattr(pb, method.input_type.name)
        response_type = getattr(pb, method.output_type.name)
        if method.client_streaming:
            methods[method.name] = grpc.stream_stream_rpc_method_handler(
                getattr(servicer, method.name), response_serializer=response_type.SerializeToString)
            continue
        methods[method.name] = grpc.unary_unary_rpc_method_handler(
            _parsing(getattr(servicer, method.name), request_type, servicer),
            response_serializer=response_type.SerializeToString)
    return grpc.method_handlers_generic_handler(SERVICE.full_name, methods)


def _parsing(handler: Handler, request_type: type[Message],
             servicer: InferenceServicer) -> Callable[[bytes, grpc.aio.ServicerContext],
                                                      Awaitable[Message]]:
    """`handler` taking the request's bytes: bytes that are no such message are the client's
    mistake (INVALID_ARGUMENT), where gRPC's own parsing would answer UNKNOWN."""
    async def parse_then_handle(data: bytes, context: grpc.aio.ServicerContext) -> Message:
        try:
            request = request_type.FromString(data)
        except DecodeError as error:
            servicer.runtime.metrics.observe_error(400)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"the request is not a valid {request_type.DESCRIPTOR.full_name} "
                                f"message: {error}")
        return await handler(request, context)
    return parse_then_handle
