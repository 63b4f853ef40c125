"""Inference requests: resolve the model version, check tensors against its config, run, count.

`InferenceService` is what REST's routes (`/predict`, V2 infer) and gRPC's ``ModelInfer`` call.
REST hands it the body (`predict`, `infer_v2` decode it with `service.tensors`); gRPC decodes
its protobuf itself (`service.grpc.tensors`) and calls the same steps: look the version up once
and check the inputs once (`check`, `service.dataplane.checks`), pick the outputs to answer
(`requested_outputs`), run (`run`: images and texts preprocessed, the repository's batcher,
the request counted in the metrics), then postprocess the outputs
(`service.tensors.postprocess.v2_outputs`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from engine.errors import EngineError, InputError, ShapeError
from engine.serving.errors import ModelNotReady
from engine.serving.loaded import LoadedVersion
from engine.serving.preprocess import Geometry
from engine.serving.priority_queue import Scheduling
from engine.serving.repository import ModelRepository
from engine.serving.sequences import SequenceControl
from service.dataplane.checks import (
    UNFORESEEN,
    Checked,
    answerable,
    check_input_name,
    check_inputs,
    check_requested,
    names,
    undecodable,
    where,
)
from service.dataplane.metrics import Metrics
from service.errors import BadRequest, ServiceError
from service.tensors import images, postprocess, predict, text, v2
from service.tensors.datatypes import BYTES, NameCheck
from service.tensors.images import ImageInputs
from service.tensors.v2 import RequestedOutput
from service.tracing import Tracing

# Reads a request's inputs (arrays and datatypes), each name checked by the callable it gets.
Decoder = Callable[[NameCheck], tuple[dict[str, np.ndarray], Mapping[str, str] | None]]


@dataclass(frozen=True)
class Answer:
    """A finished inference: which version ran, its outputs, and each image input's
    geometries (one per row; None without images) for postprocessing."""

    version: LoadedVersion
    outputs: dict[str, np.ndarray]
    geometries: dict[str, list[Geometry]] | None = None


def described(checked: Checked) -> tuple[str, int, int]:
    """What a trace names of checked inputs: model name, version and batch size."""
    return checked.handle.name, checked.handle.version, checked.rows


class InferenceService:
    """Runs requests on a repository's models and records them in the metrics."""

    def __init__(self, repository: ModelRepository, metrics: Metrics,
                 max_tensor_elements: int, image_threads: int = 2,
                 tracing: Tracing | None = None) -> None:
        self.repository = repository
        self.metrics = metrics
        self.max_tensor_elements = max_tensor_elements
        self.images = ImageInputs(image_threads)
        tracing = tracing or Tracing()
        self.step = tracing.step  # ``preprocess``: reached by inputs with an image pipeline
        # Bound once: while tracing is off these stay the plain methods (nothing per request).
        self._predict_decode = tracing.traced("decode", self._predict_decode, described)
        self._predict_encode = tracing.traced("encode", self._predict_encode)
        self._v2_decode = tracing.traced("decode", self._v2_decode,
                                         lambda decoded: described(decoded[0]))
        self._v2_encode = tracing.traced("encode", self._v2_encode)

    def close(self) -> None:
        """Stop the image pool's threads."""
        self.images.close()

    async def load_on_demand(self, name: str, version: str | None) -> None:
        """Where the repository loads on demand: load a model on disk but not loaded, before
        its request is read (requests arriving meanwhile share the load)."""
        if self.repository.load_on_demand:
            await self.repository.serving_version(name, version or None)

    def check(self, name: str, version: str | None, decode: Decoder) -> Checked:
        """Inputs decoded by `decode` and checked against the version they name (the newest
        ready one when `version` is None or empty), looked up once: first, so that `decode`
        checks each input's name as it reads it (before its size)."""
        handle = self.repository.get(name, version or None)
        arrays, datatypes = decode(functools.partial(check_input_name, handle))
        return Checked(handle, arrays, check_inputs(handle, arrays, datatypes))

    async def run(self, checked: Checked, timeout_s: float | None = None,
                  sequence: SequenceControl | None = None,
                  scheduling: Scheduling | None = None) -> Answer:
        """Run checked inputs on the version they were checked against, images and texts
        preprocessed first; shape failures inside are the input's. `sequence`: the request's
        place in its sequence (V2's sequence parameters), for a model serving sequences;
        `scheduling`: its ``priority`` and ``timeout`` parameters (`timeout_s` is the
        transport's deadline)."""
        handle, arrays, geometries = checked.handle, checked.arrays, None
        if handle.pipelines:
            with self.step("preprocess"):
                arrays, geometries = await self.images.prepare(handle, arrays)
        started = time.perf_counter()
        ok = False
        try:
            outputs = await self.repository.infer(handle.name, arrays, version=handle.version,
                                                  timeout_s=timeout_s, handle=handle,
                                                  rows=checked.rows, sequence=sequence,
                                                  scheduling=scheduling)
            ok = True
        except ShapeError as error:
            raise InputError(str(error)) from error
        finally:
            self.metrics.observe_request(handle.name, handle.version, ok,
                                         time.perf_counter() - started)
        return Answer(handle, outputs, geometries)

    def predict_inputs(self, body: bytes) -> Checked:
        """A ``POST /predict`` body decoded and checked."""
        try:
            return self._predict_inputs(body)
        except (ServiceError, EngineError):
            raise
        except UNFORESEEN as error:
            raise undecodable("predict request", error) from error

    def _predict_inputs(self, body: bytes) -> Checked:
        request = predict.decode_predict(body)
        handle = self.repository.get(request.model, request.version)
        ranks = {name: len(spec.shape) for name, spec in handle.input_specs.items()}
        texts = text.predict_texts(handle, request.inputs) if handle.pipelines else {}
        arrays = predict.predict_arrays(request, handle.input_dtypes, self.max_tensor_elements,
                                        ranks)
        arrays.update(texts)
        datatypes = text.datatypes_of(arrays) if texts else None
        return Checked(handle, arrays, check_inputs(handle, arrays, datatypes))

    def predict_images(self, body: bytes, content_type: str, query: str) -> Checked:
        """A ``POST /predict`` body of images (raw ``image/*`` or multipart) as BYTES tensors,
        checked."""
        request = images.read_image_request(body, content_type, query)
        handle = self.repository.get(request.model, request.version)
        if request.images is None:
            if len(handle.pipelines) != 1:
                raise BadRequest(f"{where(handle)} has {len(handle.pipelines)} inputs with a "
                                 "preprocess pipeline; a raw image body serves models with "
                                 "exactly one (send multipart files named after the inputs, "
                                 "or JSON)")
            sent = {next(iter(handle.pipelines)): [request.raw]}
        else:
            sent = request.images
        arrays = images.as_tensors(sent)
        return Checked(handle, arrays, check_inputs(handle, arrays,
                                                    {name: BYTES for name in arrays}))

    async def predict(self, body: bytes, content_type: str | None = None,
                      query: str = "") -> dict[str, object]:
        """``POST /predict``: the response body. JSON, or images when `content_type` says so."""
        try:
            checked = self._predict_decode(body, content_type, query)
        except ModelNotReady as error:
            # The model is named inside the body: load it on demand, then read the body again.
            model = getattr(error, "model", None)
            if not self.repository.load_on_demand or model is None:
                raise
            await self.load_on_demand(model, None)
            checked = self._predict_decode(body, content_type, query)
        answer = await self.run(checked)
        return self._predict_encode(answer)

    def _predict_decode(self, body: bytes, content_type: str | None, query: str) -> Checked:
        if content_type is not None and images.is_image_body(content_type):
            return self.predict_images(body, content_type, query)
        return self.predict_inputs(body)

    @staticmethod
    def _predict_encode(answer: Answer) -> dict[str, object]:
        return {"model": answer.version.name, "version": answer.version.version,
                "outputs": postprocess.predict_outputs(answer.version, answer.outputs,
                                                       answer.geometries)}

    async def infer_v2(self, name: str, version: str | None, body: bytes,
                       header_length: int | None) -> tuple[bytes, int | None]:
        """``POST /v2/models/{name}[/versions/{v}]/infer``: body and binary header length."""
        await self.load_on_demand(name, version)
        checked, request, binary, classes = self._v2_decode(name, version, body, header_length)
        timeout = None if request.timeout_us is None else request.timeout_us / 1e6
        answer = await self.run(checked, None, v2.sequence_of(request.parameters),
                                Scheduling(request.priority, timeout))
        return self._v2_encode(answer, binary, classes, request.id)

    def _v2_decode(self, name: str, version: str | None, body: bytes, header_length: int | None
                   ) -> tuple[Checked, v2.V2Request, dict[str, bool], dict[str, int]]:
        """The request's checked inputs, the request, and its outputs (`requested_outputs`)."""
        try:
            checked, request = self._v2_inputs(name, version, body, header_length)
        except (ServiceError, EngineError):
            raise
        except UNFORESEEN as error:
            raise undecodable("inference request", error) from error
        binary, classes = self.requested_outputs(checked.handle, request.outputs,
                                                 request.binary_output)
        return checked, request, binary, classes

    @staticmethod
    def _v2_encode(answer: Answer, binary: dict[str, bool], classes: dict[str, int],
                   request_id: str | None) -> tuple[bytes, int | None]:
        handle = answer.version
        outputs, binary = postprocess.v2_outputs(handle, answer.outputs, binary, classes,
                                                 answer.geometries)
        return v2.encode_v2_response(handle.name, handle.version, outputs, binary, request_id)

    def _v2_inputs(self, name: str, version: str | None, body: bytes,
                   header_length: int | None) -> tuple[Checked, v2.V2Request]:
        """A V2 request decoded, and its inputs checked against the version it names (each
        input's name as it is read, before its size)."""
        handle = self.repository.get(name, version or None)
        if header_length == 0:
            request = self._raw_request(handle, body)
        else:
            request = v2.decode_v2_request(body, header_length, self.max_tensor_elements,
                                           functools.partial(check_input_name, handle))
        return Checked(handle, request.inputs,
                       check_inputs(handle, request.inputs, request.datatypes)), request

    def _raw_request(self, handle: LoadedVersion, body: bytes) -> v2.V2Request:
        """A raw binary request: the body is the tensor of the model's only input."""
        specs = list(handle.input_specs.values())
        if len(specs) != 1:
            raise BadRequest(f"{where(handle)} has {len(specs)} inputs "
                             f"({names([spec.name for spec in specs])}); a raw binary "
                             "request (Inference-Header-Content-Length 0) serves models of one "
                             "input only, send a JSON header naming each input")
        spec = specs[0]
        return v2.decode_raw_request(body, spec.name, spec.datatype, spec.shape,
                                     self.max_tensor_elements,
                                     spec.axis if handle.config.max_batch_size else None)

    @staticmethod
    def requested_outputs(handle: LoadedVersion, outputs: list[RequestedOutput] | None,
                          binary_output: bool) -> tuple[dict[str, bool], dict[str, int]]:
        """Tensors to return, in order, with whether each goes as binary data (every tensor
        model metadata lists when the request names none, else exactly those it names, each
        as binary as it asks or else as `binary_output` says); and the class count of the
        outputs asked for as classifications."""
        if outputs is None:
            return dict.fromkeys(answerable(handle), binary_output), {}
        classes = {output.name: output.classification for output in outputs
                   if output.classification is not None}
        check_requested(handle, [output.name for output in outputs], classes)
        return {output.name: binary_output if output.binary is None else output.binary
                for output in outputs}, classes
