"""Inference requests: resolve the model version, check tensors against its config, run, count."""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, NoReturn

import numpy as np

from engine.errors import EngineError, InputError, ShapeError
from engine.serving.config import TensorConfig
from engine.serving.loaded import LoadedVersion
from engine.serving.preprocess import Geometry
from engine.serving.repository import ModelRepository
from engine.serving.text import TextPipeline
from service import codecs, image_forms, postprocess_outputs, text_inputs
from service.errors import BadRequest, ServiceError
from service.image_inputs import ImageInputs
from service.metrics import Metrics

BYTES = "BYTES"


class Checked(NamedTuple):
    """A request's inputs as `check_inputs` passed them: the version they were checked against
    (looked up once, and the one that runs them), the arrays, and their batch size."""

    handle: LoadedVersion
    arrays: dict[str, np.ndarray]
    rows: int


@dataclass(frozen=True)
class Answer:
    """A finished inference: which version ran, its outputs, and each image input's
    geometries (one per row; None without images) for postprocessing."""

    version: LoadedVersion
    outputs: dict[str, np.ndarray]
    geometries: dict[str, list[Geometry]] | None = None


def _shape_fits(expected: tuple[int, ...], given: tuple[int, ...]) -> bool:
    return len(expected) == len(given) and all(
        want in (-1, got) for want, got in zip(expected, given))


def check_inputs(handle: LoadedVersion, arrays: Mapping[str, np.ndarray],
                 datatypes: Mapping[str, str] | None = None) -> int:
    """400 unless `arrays` are exactly the config's inputs, with its datatypes and shapes
    (BYTES for an input with a preprocess pipeline: images or texts), agreeing on a batch size
    in 1..max_batch_size; that batch size. `datatypes` must be given for BYTES tensors (object
    arrays).

    The one check of a request's inputs: the batcher takes them as they are (its ``rows``),
    and the model checks each new shape once, when it compiles its plan.
    """
    specs = text_inputs.request_specs(handle, arrays)
    if arrays.keys() != specs.keys():
        _refuse_names(handle, arrays)
    max_rows = handle.config.max_batch_size
    for name, array in arrays.items():
        spec = specs[name]
        given = datatypes[name] if datatypes is not None else codecs.datatype_of(array.dtype)
        if (given != spec.datatype or not _shape_fits(spec.shape, array.shape)
                or array.shape[0] > max_rows):
            # Images for a pipeline input are checked here, off the plain tensors' path.
            if given == BYTES and name in handle.pipelines:
                _check_images(handle, spec, array)
            else:
                _refuse_tensor(handle, spec, array, given)
    sizes = {array.shape[0] for array in arrays.values()}  # ranks >= 1: config shapes are
    if len(sizes) != 1 or 0 in sizes:                       # [-1, ...]
        _refuse_rows(handle, arrays)
    return sizes.pop()


def _refuse_rows(handle: LoadedVersion, arrays: Mapping[str, np.ndarray]) -> NoReturn:
    """The 400 for inputs of no rows, or disagreeing on their number (as the batcher words
    it for its own callers)."""
    where = _where(handle)
    if len(arrays) > 1 and len({array.shape[0] for array in arrays.values()}) > 1:
        raise BadRequest(f"{where}: inputs disagree on the batch size (first dimension): "
                         + ", ".join(f"{name} {array.shape[0]}"
                                     for name, array in arrays.items()))
    raise BadRequest(f"{where}: batch size 0 is outside 1..max_batch_size "
                     f"{handle.config.max_batch_size}; send at least one row")


def _check_images(handle: LoadedVersion, spec: TensorConfig, array: np.ndarray) -> None:
    """400 unless a pipeline input's BYTES tensor is 1 to max_batch_size images, one a row:
    shape ``[N]`` or ``[N, 1]``."""
    where, rows = _where(handle), array.shape[0] if array.ndim else 0
    if array.ndim not in (1, 2) or array.ndim == 2 and array.shape[1] != 1 or rows == 0:
        raise BadRequest(f"{where}: input {spec.name!r} has BYTES shape {list(array.shape)}; "
                         "expected [N] or [N, 1], one encoded image per batch row, N >= 1")
    if rows > handle.config.max_batch_size:
        raise BadRequest(f"{where}: input {spec.name!r} has {rows} images; max_batch_size is "
                         f"{handle.config.max_batch_size}, split the request")


def _refuse_names(handle: LoadedVersion, arrays: Mapping[str, np.ndarray]) -> NoReturn:
    """The 400 for inputs that are not the config's: unknown names first, then missing."""
    specs = handle.input_specs
    unknown = [name for name in arrays if name not in specs]
    if unknown:
        raise BadRequest(f"{_where(handle)} has no input {codecs.names(unknown)}; its inputs "
                         f"are {codecs.names(list(specs))}"
                         f"{_renamed(handle.config.inputs, unknown[0], 'input')}")
    spec = next(spec for name, spec in specs.items() if name not in arrays)
    raise BadRequest(f"{_where(handle)}: missing input {spec.name!r}, which takes "
                     f"{_wire(handle, spec)}{_filled_by(handle, spec.name)}")


def _wire(handle: LoadedVersion, spec: TensorConfig) -> str:
    """What an input takes, for an error: its tensor, or for a pipeline input the BYTES it
    takes too."""
    tensor = f"{spec.datatype} {list(spec.shape)}"
    pipeline = handle.pipelines.get(spec.name)
    if pipeline is None:
        return tensor
    if isinstance(pipeline, TextPipeline):
        return f"BYTES (texts: one a row, or [N, 2] for pairs) or {tensor} (token ids)"
    return f"BYTES (encoded images, one a row) or {tensor}"


def _filled_by(handle: LoadedVersion, name: str) -> str:
    """For an error about input `name`: the text input whose texts would fill it, if any."""
    filler = next((text for text, pipeline in handle.pipelines.items()
                   if isinstance(pipeline, TextPipeline) and name in pipeline.options.filled),
                  None)
    return "" if filler is None else (f"; it is filled when input {filler!r} is sent as texts "
                                      "(BYTES), else send it as a tensor")


def _refuse_tensor(handle: LoadedVersion, spec: TensorConfig, array: np.ndarray,
                   given: str) -> NoReturn:
    """The 400 for an input of the wrong datatype, shape or number of rows."""
    where, name = _where(handle), spec.name
    if given != spec.datatype:
        wanted = _wire(handle, spec) if name in handle.pipelines else spec.datatype
        hint = "" if given != BYTES or name in handle.pipelines else (
            " (BYTES is for inputs with a preprocess pipeline: encoded images or texts)")
        raise BadRequest(f"{where}: input {name!r} has datatype {given}; expected "
                         f"{wanted}{hint}")
    if not _shape_fits(spec.shape, array.shape):
        raise BadRequest(f"{where}: input {name!r} has shape {list(array.shape)}; expected "
                         f"{list(spec.shape)} (-1: any size)")
    raise BadRequest(f"{where}: input {name!r} has {array.shape[0]} rows; max_batch_size is "
                     f"{handle.config.max_batch_size}, split the request")


def _renamed(tensors: Sequence[TensorConfig] | None, name: str, kind: str) -> str:
    """For an error: that `name` is the graph's name of a renamed tensor, if it is."""
    renamed = next((tensor.name for tensor in tensors or () if tensor.source == name), None)
    return "" if renamed is None else (f" ({name!r} is the graph's name of {kind} {renamed!r}, "
                                       "which config.json renames)")


def _where(handle: LoadedVersion) -> str:
    return f"model {handle.name!r} version {handle.version}"


def answerable(handle: LoadedVersion) -> Sequence[str]:
    """The tensors a V2 request may name in its outputs, as model metadata lists them: the
    outputs, and the extra tensors of their postprocesses (``NAME_index``, ``NAME_label``)."""
    if not handle.postprocesses:
        return handle.output_names
    return list(handle.tensor_owners)


def check_requested(handle: LoadedVersion, names: Sequence[str],
                    classified: Collection[str]) -> None:
    """400 unless every requested name is a tensor model metadata lists, and every one asked
    for as a classification is an output (not a postprocess's extra tensor)."""
    available = answerable(handle)
    for name in names:
        if name not in available:
            raise BadRequest(f"{_where(handle)} has no output {name!r}; its outputs are "
                             f"{codecs.names(list(available))}"
                             f"{_renamed(handle.config.outputs, name, 'output')}")
    extras = [name for name in classified if name not in handle.output_names]
    if extras:
        raise BadRequest(f"{_where(handle)}: output {extras[0]!r} is computed by a "
                         "postprocess; the classification extension applies to the model's "
                         f"outputs {codecs.names(handle.output_names)}")


# What a body no check foresaw could still make NumPy or a parser raise; a 400, never a 500.
UNFORESEEN = (ValueError, TypeError, LookupError, RecursionError, OverflowError)


def undecodable(what: str, error: Exception) -> BadRequest:
    """The 400 for a body that broke decoding in a way no check named."""
    return BadRequest(f"{what} could not be decoded: {type(error).__name__}: {error}")


class InferenceService:
    """Runs requests on a repository's models and records them in the metrics."""

    def __init__(self, repository: ModelRepository, metrics: Metrics,
                 max_tensor_elements: int, image_threads: int = 2) -> None:
        self.repository = repository
        self.metrics = metrics
        self.max_tensor_elements = max_tensor_elements
        self.images = ImageInputs(image_threads)

    def close(self) -> None:
        """Stop the image pool's threads."""
        self.images.close()

    async def run(self, checked: Checked, timeout_s: float | None = None) -> Answer:
        """Run checked inputs on the version they were checked against, images and texts
        preprocessed first; shape failures inside are the input's."""
        handle, arrays, geometries = checked.handle, checked.arrays, None
        if handle.pipelines:
            arrays, geometries = await self.images.prepare(handle, arrays)
        started = time.perf_counter()
        ok = False
        try:
            outputs = await self.repository.infer(handle.name, arrays, version=handle.version,
                                                  timeout_s=timeout_s, handle=handle,
                                                  rows=checked.rows)
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
        request = codecs.decode_predict(body)
        handle = self.repository.get(request.model, request.version)
        ranks = {name: len(spec.shape) for name, spec in handle.input_specs.items()}
        texts = text_inputs.predict_texts(handle, request.inputs) if handle.pipelines else {}
        arrays = codecs.predict_arrays(request, handle.input_dtypes, self.max_tensor_elements,
                                       ranks)
        arrays.update(texts)
        datatypes = text_inputs.datatypes_of(arrays) if texts else None
        return Checked(handle, arrays, check_inputs(handle, arrays, datatypes))

    def predict_images(self, body: bytes, content_type: str, query: str) -> Checked:
        """A ``POST /predict`` body of images (raw ``image/*`` or multipart) as BYTES tensors,
        checked."""
        request = image_forms.read_image_request(body, content_type, query)
        handle = self.repository.get(request.model, request.version)
        if request.images is None:
            if len(handle.pipelines) != 1:
                raise BadRequest(f"{_where(handle)} has {len(handle.pipelines)} inputs with a "
                                 "preprocess pipeline; a raw image body serves models with "
                                 "exactly one (send multipart files named after the inputs, "
                                 "or JSON)")
            images = {next(iter(handle.pipelines)): [request.raw]}
        else:
            images = request.images
        arrays = image_forms.as_tensors(images)
        return Checked(handle, arrays, check_inputs(handle, arrays,
                                                    {name: BYTES for name in arrays}))

    async def predict(self, body: bytes, content_type: str | None = None,
                      query: str = "") -> dict[str, object]:
        """``POST /predict``: the response body. JSON, or images when `content_type` says so."""
        if content_type is not None and image_forms.is_image_body(content_type):
            checked = self.predict_images(body, content_type, query)
        else:
            checked = self.predict_inputs(body)
        answer = await self.run(checked)
        return {"model": answer.version.name, "version": answer.version.version,
                "outputs": postprocess_outputs.predict_outputs(answer.version, answer.outputs,
                                                               answer.geometries)}

    async def infer_v2(self, name: str, version: str | None, body: bytes,
                       header_length: int | None) -> tuple[bytes, int | None]:
        """``POST /v2/models/{name}[/versions/{v}]/infer``: body and binary header length."""
        try:
            checked, request = self._v2_inputs(name, version, body, header_length)
        except (ServiceError, EngineError):
            raise
        except UNFORESEEN as error:
            raise undecodable("inference request", error) from error
        handle = checked.handle
        binary, classes = self._requested_outputs(handle, request)
        timeout = None if request.timeout_us is None else request.timeout_us / 1e6
        answer = await self.run(checked, timeout)
        outputs, binary = postprocess_outputs.v2_outputs(handle, answer.outputs, binary, classes,
                                                         answer.geometries)
        return codecs.encode_v2_response(handle.name, handle.version, outputs, binary,
                                         request.id)

    def _v2_inputs(self, name: str, version: str | None, body: bytes,
                   header_length: int | None) -> tuple[Checked, codecs.V2Request]:
        """A V2 request decoded, and its inputs checked against the version it names."""
        if header_length == 0:
            handle = self.repository.get(name, version or None)
            request = self._raw_request(handle, body)
        else:
            request = codecs.decode_v2_request(body, header_length, self.max_tensor_elements)
            handle = self.repository.get(name, version or None)
        rows = check_inputs(handle, request.inputs, request.datatypes)
        return Checked(handle, request.inputs, rows), request

    def _raw_request(self, handle: LoadedVersion, body: bytes) -> codecs.V2Request:
        """A raw binary request: the body is the tensor of the model's only input."""
        specs = list(handle.input_specs.values())
        if len(specs) != 1:
            raise BadRequest(f"{_where(handle)} has {len(specs)} inputs "
                             f"({codecs.names([spec.name for spec in specs])}); a raw binary "
                             "request (Inference-Header-Content-Length 0) serves models of one "
                             "input only, send a JSON header naming each input")
        spec = specs[0]
        return codecs.decode_raw_request(body, spec.name, spec.datatype, spec.shape,
                                         self.max_tensor_elements)

    @staticmethod
    def _requested_outputs(handle: LoadedVersion, request: codecs.V2Request
                           ) -> tuple[dict[str, bool], dict[str, int]]:
        """Tensors to return, in order, with whether each goes as binary data (every tensor
        model metadata lists when the request names none, else exactly those it names); and
        the class count of the outputs asked for as classifications."""
        if request.outputs is None:
            return dict.fromkeys(answerable(handle), request.binary_output), {}
        classes = {output.name: output.classification for output in request.outputs
                   if output.classification is not None}
        check_requested(handle, [output.name for output in request.outputs], classes)
        return {output.name: request.binary_output if output.binary is None else output.binary
                for output in request.outputs}, classes
