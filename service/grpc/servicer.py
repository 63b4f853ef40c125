"""`InferenceServicer`: the RPCs of ``inference.GRPCInferenceService`` over the shared runtime.

Each RPC calls what the matching REST route calls, the data plane (`service.dataplane`: the
`InferenceService`, `metadata`, the repository operations), so a request is refused for the same
reason with the same message; the HTTP status of that refusal becomes a gRPC code
(`service.grpc.status`). It knows nothing of the REST app: the two are siblings over one
`service.runtime.Runtime`.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import TypeVar

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from engine.serving.errors import ModelNotFound, ModelNotReady, VersionNotFound
from engine.serving.priority_queue import Scheduling
from engine.serving.repository import ModelRepository
from service.dataplane import metadata, triton_config
from service.dataplane import repository as operations
from service.dataplane.checks import Checked
from service.dataplane.drain import SHUTTING_DOWN
from service.dataplane.inference import Answer, described
from service.errors import BadRequest, Forbidden, Unauthorized
from service.grpc import inference_pb2 as pb
from service.grpc import inference_pb2_grpc as pb_grpc
from service.grpc import status, stream, tensors
from service.runtime import Runtime
from service.tensors.postprocess import v2_outputs
from service.tensors.v2 import RequestedOutput

Reply = TypeVar("Reply")
SPLIT_MANAGEMENT = ("management is served on the admin port only (--admin-port); load and "
                    "unload models there")


@dataclass(frozen=True)
class Refusal:
    """Why a request failed: its gRPC code and message."""

    code: grpc.StatusCode
    message: str


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """The gRPC face of one process's runtime."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.inference = runtime.inference
        self.repository = runtime.repository
        tracing = self.tracing = runtime.tracing
        # Bound once: while tracing is off a call runs the plain steps (nothing per request).
        self._decode = tracing.traced("decode", self._decode,
                                      lambda decoded: described(decoded[0]))
        self._encode = tracing.traced("encode", self._encode)
        self._infer = self._traced_infer if tracing.enabled else self._infer_steps

    async def _answer(self, context: grpc.aio.ServicerContext, method: str,
                      work: Callable[[], Awaitable[Reply]]) -> Reply:
        """Run `work` as one request in flight; any failure aborts the call with its code."""
        outcome = await self._attempt(method, work)
        if isinstance(outcome, Refusal):
            await context.abort(outcome.code, outcome.message)
            raise AssertionError("abort raises")
        return outcome

    async def _attempt(self, method: str, work: Callable[[], Awaitable[Reply]]
                       ) -> Reply | Refusal:
        """Run `work` as one request in flight (refused while the drain runs); a failure is
        counted and becomes the `Refusal` of its status."""
        drain = self.runtime.drain
        if drain.draining:
            return Refusal(grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN)
        drain.in_flight += 1
        try:
            return await work()
        except Exception as error:  # noqa: BLE001 - every failure becomes a status code
            http_status, code, message = status.refusal(error, method)
            self.runtime.metrics.observe_error(http_status)
            return Refusal(code, message)
        finally:
            drain.in_flight -= 1

    async def ServerLive(self, request: pb.ServerLiveRequest,
                         context: grpc.aio.ServicerContext) -> pb.ServerLiveResponse:
        """Live while the process answers."""
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest,
                          context: grpc.aio.ServicerContext) -> pb.ServerReadyResponse:
        """Ready once the repository is loaded, until shutdown begins (with strict readiness,
        not while a model it was asked to serve failed to load)."""
        return pb.ServerReadyResponse(ready=self.runtime.ready)

    async def ModelReady(self, request: pb.ModelReadyRequest,
                         context: grpc.aio.ServicerContext) -> pb.ModelReadyResponse:
        """Ready or not; not ready too for a model or version the repository does not know,
        as Triton answers (``tritonclient``'s ``is_model_ready`` raises on an error code)."""
        async def work() -> pb.ModelReadyResponse:
            try:
                metadata.model_ready(self.repository, request.name, request.version)
            except (ModelNotReady, ModelNotFound, VersionNotFound):
                return pb.ModelReadyResponse(ready=False)
            return pb.ModelReadyResponse(ready=True)
        return await self._answer(context, "ModelReady", work)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest,
                             context: grpc.aio.ServicerContext) -> pb.ServerMetadataResponse:
        """Server name, version and protocol extensions (those of REST's ``GET /v2``)."""
        found = metadata.server()
        return pb.ServerMetadataResponse(name=found.name, version=found.version,
                                         extensions=found.extensions)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest,
                            context: grpc.aio.ServicerContext) -> pb.ModelMetadataResponse:
        """Inputs, outputs and ready versions of a model version."""
        async def work() -> pb.ModelMetadataResponse:
            found = metadata.model_metadata(self.repository, request.name, request.version)
            response = pb.ModelMetadataResponse(name=found.name, versions=found.versions,
                                                platform=found.platform)
            for tensor in found.inputs:
                response.inputs.add(name=tensor.name, datatype=tensor.datatype,
                                    shape=tensor.shape)
            for tensor in found.outputs:
                response.outputs.add(name=tensor.name, datatype=tensor.datatype,
                                     shape=tensor.shape)
            return response
        return await self._answer(context, "ModelMetadata", work)

    async def ModelInfer(self, request: pb.ModelInferRequest,
                         context: grpc.aio.ServicerContext) -> pb.ModelInferResponse:
        """One inference through the shared `InferenceService` (its batcher and metrics)."""
        return await self._answer(context, "ModelInfer",
                                  lambda: self._infer(request, context, "ModelInfer"))

    async def ModelStreamInfer(self, messages: AsyncIterable[bytes],
                               context: grpc.aio.ServicerContext
                               ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Inference requests on one stream, answered as each completes. The messages come
        unparsed (see `service.grpc.server`): one that is no ModelInferRequest, like one that
        fails, is answered with its error_message and the stream goes on. (An async generator
        itself: gRPC streams the answers of a handler only when it is one.)"""
        answers = stream.as_completed(messages, lambda data: self._stream_answer(data, context))
        async with aclosing(answers):
            async for answer in answers:
                yield answer

    async def _stream_answer(self, data: bytes, context: grpc.aio.ServicerContext
                             ) -> pb.ModelStreamInferResponse:
        try:
            request = pb.ModelInferRequest.FromString(data)
        except DecodeError as error:
            self.runtime.metrics.observe_error(400)
            return pb.ModelStreamInferResponse(
                error_message=f"the request is not a valid inference.ModelInferRequest "
                              f"message: {error}")
        outcome = await self._attempt("ModelStreamInfer",
                                      lambda: self._infer(request, context, "ModelStreamInfer"))
        if isinstance(outcome, Refusal):
            # The id travels with the error too, so that a client matches it to its request.
            return pb.ModelStreamInferResponse(
                error_message=outcome.message, infer_response=pb.ModelInferResponse(
                    model_name=request.model_name, model_version=request.model_version,
                    id=request.id))
        return pb.ModelStreamInferResponse(infer_response=outcome)

    async def ModelConfig(self, request: pb.ModelConfigRequest,
                          context: grpc.aio.ServicerContext) -> pb.ModelConfigResponse:
        """A model version's configuration in Triton's form (that of REST's ``/config``)."""
        async def work() -> pb.ModelConfigResponse:
            found = triton_config.model_config(self.repository, request.name, request.version)
            config = json_format.ParseDict(found.model_dump(mode="json", exclude_none=True),
                                           pb.ModelConfig())
            return pb.ModelConfigResponse(config=config)
        return await self._answer(context, "ModelConfig", work)

    async def _traced_infer(self, request: pb.ModelInferRequest,
                            context: grpc.aio.ServicerContext, method: str
                            ) -> pb.ModelInferResponse:
        """`_infer_steps` in the call's ``receive`` span (its parent from the ``traceparent``
        metadata): `_infer` while tracing is on."""
        with self.tracing.grpc(context.invocation_metadata, method):
            return await self._infer_steps(request, context, method)

    async def _infer_steps(self, request: pb.ModelInferRequest,
                           context: grpc.aio.ServicerContext, method: str
                           ) -> pb.ModelInferResponse:
        """One inference (`method` is the RPC, for traces): decoded, run, encoded."""
        await self.inference.load_on_demand(request.model_name, request.model_version)
        checked, binary, classes = self._decode(request)
        # The call's deadline bounds the whole request; its "timeout" parameter is the
        # request's own, which a model's queue policy reads (see `Scheduling`).
        scheduling = Scheduling(tensors.priority(request.parameters),
                                tensors.timeout_s(request.parameters))
        answer = await self.inference.run(checked, context.time_remaining(),
                                          tensors.sequence_of(request.parameters), scheduling)
        return self._encode(request, answer, binary, classes)

    def _decode(self, request: pb.ModelInferRequest
                ) -> tuple[Checked, dict[str, bool], dict[str, int]]:
        """The request's checked inputs, and the outputs it asks for (`requested_outputs`)."""
        checked = self.inference.check(request.model_name, request.model_version, lambda names:
                                       tensors.decode_inputs(
                                           request, self.inference.max_tensor_elements, names))
        counts = tensors.classification_counts(request)
        # Every tensor model metadata lists when the request names none, as REST answers.
        requested = [RequestedOutput(output.name, False, counts.get(output.name))
                     for output in request.outputs] or None
        binary, classes = self.inference.requested_outputs(checked.handle, requested, False)
        return checked, binary, classes

    @staticmethod
    def _encode(request: pb.ModelInferRequest, answer: Answer, binary: dict[str, bool],
                classes: dict[str, int]) -> pb.ModelInferResponse:
        handle = answer.version
        outputs, _ = v2_outputs(handle, answer.outputs, binary, classes, answer.geometries)
        response = pb.ModelInferResponse(model_name=handle.name,
                                         model_version=str(handle.version), id=request.id)
        tensors.encode_outputs(response, outputs)
        return response

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest,
                              context: grpc.aio.ServicerContext) -> pb.RepositoryIndexResponse:
        """Every version known on disk or in memory (only ready ones when `ready` is set)."""
        async def work() -> pb.RepositoryIndexResponse:
            rows = operations.index(self.repository, True if request.ready else None)
            return pb.RepositoryIndexResponse(models=[
                pb.RepositoryIndexResponse.ModelIndex(name=row.name, version=row.version,
                                                      state=row.state, reason=row.reason or "")
                for row in rows])
        return await self._answer(context, "RepositoryIndex", work)

    async def RepositoryModelLoad(
            self, request: pb.RepositoryModelLoadRequest,
            context: grpc.aio.ServicerContext) -> pb.RepositoryModelLoadResponse:
        """Load a model by its version policy (admin token required)."""
        return await self._manage(context, "RepositoryModelLoad", request, operations.load,
                                  pb.RepositoryModelLoadResponse, ())

    async def RepositoryModelUnload(
            self, request: pb.RepositoryModelUnloadRequest,
            context: grpc.aio.ServicerContext) -> pb.RepositoryModelUnloadResponse:
        """Unload every version of a model (admin token required)."""
        # tritonclient sends unload_dependents with every unload; no model depends on another
        # here, so either value unloads the one model.
        return await self._manage(context, "RepositoryModelUnload", request, operations.unload,
                                  pb.RepositoryModelUnloadResponse, ("unload_dependents",))

    async def _manage(self, context: grpc.aio.ServicerContext, method: str,
                      request: pb.RepositoryModelLoadRequest | pb.RepositoryModelUnloadRequest,
                      operation: Callable[[ModelRepository, str], Awaitable[object]],
                      reply: Callable[[], Reply], flags: tuple[str, ...]) -> Reply:
        """Run a repository `operation` on the request's model, once the admin token passes
        and the request's parameters are boolean `flags`; answer with an empty `reply`."""
        async def work() -> Reply:
            self._require_admin(context)
            _check_flags(request.parameters, flags, method)
            await operation(self.repository, request.model_name)
            return reply()
        return await self._answer(context, method, work)

    def _require_admin(self, context: grpc.aio.ServicerContext) -> None:
        """REST's bearer-token check, on the call's ``authorization`` metadata."""
        if self.runtime.settings.admin_port is not None:
            raise Forbidden(SPLIT_MANAGEMENT)
        given = dict(context.invocation_metadata() or ()).get("authorization")
        bearer = isinstance(given, str) and given.startswith("Bearer ")
        self.runtime.admin.check(
            given.removeprefix("Bearer ") if bearer else None,
            Unauthorized("this call needs the metadata 'authorization: Bearer <admin token>'"))


def _check_flags(parameters: Mapping[str, pb.ModelRepositoryParameter], flags: tuple[str, ...],
                 method: str) -> None:
    """400 unless every repository parameter is one of `flags`, given as a bool (REST's
    check; ``config`` and ``file:`` are refused: a model loads from its files as they are)."""
    for key, parameter in parameters.items():
        if key not in flags:
            raise BadRequest(f"{method}: parameter {key!r} is not supported"
                             + (f"; only {', '.join(flags)} is" if flags else
                                "; a model is loaded from its files in the repository"))
        if parameter.WhichOneof("parameter_choice") != "bool_param":
            raise BadRequest(f"{method}: parameter {key!r} must be a bool_param")
