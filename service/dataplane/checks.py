"""A request's tensors against its model version's config: the one check, for REST and gRPC.

`check_inputs` passes the inputs once (names, datatypes, shapes, one batch size); the batcher
takes them as they are, and the model checks each new shape once, when it compiles its plan.
`check_requested` passes the outputs a request names. Each refusal is a 400 naming the model
version and what it takes.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import NamedTuple, NoReturn

import numpy as np

from engine.serving.config import TensorConfig, datatype_of
from engine.serving.loaded import LoadedVersion
from engine.serving.text import TextPipeline
from service.errors import BadRequest
from service.tensors.datatypes import BYTES

# What a body no check foresaw could still make NumPy or a parser raise; a 400, never a 500.
UNFORESEEN = (ValueError, TypeError, LookupError, RecursionError, OverflowError)


class Checked(NamedTuple):
    """A request's inputs as `check_inputs` passed them: the version they were checked against
    (looked up once, and the one that runs them), the arrays, and their batch size."""

    handle: LoadedVersion
    arrays: dict[str, np.ndarray]
    rows: int


def where(handle: LoadedVersion) -> str:
    """A model version as error messages name it."""
    return f"model {handle.name!r} version {handle.version}"


def names(values: Sequence[str]) -> str:
    """Names quoted for an error message."""
    return ", ".join(repr(value) for value in values)


def undecodable(what: str, error: Exception) -> BadRequest:
    """The 400 for a body that broke decoding in a way no check named."""
    return BadRequest(f"{what} could not be decoded: {type(error).__name__}: {error}")


def _shape_fits(expected: tuple[int, ...], given: tuple[int, ...]) -> bool:
    return len(expected) == len(given) and all(
        want in (-1, got) for want, got in zip(expected, given))


def check_inputs(handle: LoadedVersion, arrays: Mapping[str, np.ndarray],
                 datatypes: Mapping[str, str] | None = None) -> int:
    """400 unless `arrays` are exactly the config's inputs, with its datatypes and shapes
    (BYTES for an input with a preprocess pipeline: images or texts), agreeing on a batch size
    (each along its batch axis) in 1..max_batch_size; that batch size (1 with max_batch_size
    0: whole shapes, no batch). `datatypes` must be given for BYTES tensors (object arrays).

    The one check of a request's inputs: the batcher takes them as they are (its ``rows``),
    and the model checks each new shape once, when it compiles its plan.
    """
    specs = request_specs(handle, arrays)
    if arrays.keys() != specs.keys():
        _refuse_names(handle, arrays)
    max_rows = handle.config.max_batch_size
    for name, array in arrays.items():
        spec = specs[name]
        given = datatypes[name] if datatypes is not None else datatype_of(array.dtype)
        if (given != spec.datatype or not _shape_fits(spec.shape, array.shape)
                or (max_rows and _rows_of(spec, array) > max_rows)):
            # Images for a pipeline input are checked here, off the plain tensors' path.
            if given == BYTES and name in handle.pipelines:
                _check_rows(handle, spec.name, array, (1,), "[N] or [N, 1], one encoded image "
                            "per batch row", "images")
            else:
                _refuse_tensor(handle, spec, array, given)
    if not max_rows:
        return 1
    # Each shape fits its config's, which has a dimension at its batch axis.
    sizes = {_rows_of(specs[name], array) for name, array in arrays.items()}
    if len(sizes) != 1 or 0 in sizes:
        _refuse_rows(handle, arrays, specs)
    return sizes.pop()


def _rows_of(spec: TensorConfig, array: np.ndarray) -> int:
    """The rows of a request's tensor: its size along the config's batch axis (a BYTES
    tensor for a pipeline: its first)."""
    axis = spec.axis if spec.axis < array.ndim else 0
    return array.shape[axis] if array.ndim else 0


def texts_sent(handle: LoadedVersion, arrays: Mapping[str, np.ndarray]
               ) -> dict[str, TextPipeline]:
    """The text pipelines whose input the request sends as BYTES (object arrays), by name."""
    return {name: pipeline for name, pipeline in handle.pipelines.items()
            if isinstance(pipeline, TextPipeline) and name in arrays
            and arrays[name].dtype == object}


def request_specs(handle: LoadedVersion, arrays: Mapping[str, np.ndarray]
                  ) -> Mapping[str, TensorConfig]:
    """The inputs a request must send: the config's, less those a text pipeline fills when its
    input comes as texts, whose entry then takes the BYTES tensor (checked here).

    Raises:
        BadRequest: a filled input is sent too, or a text tensor's shape or row count is wrong.
    """
    texts = texts_sent(handle, arrays) if handle.pipelines else {}
    if not texts:
        return handle.input_specs
    specs = dict(handle.input_specs)
    for name, pipeline in texts.items():
        for filled in pipeline.options.filled:
            if filled in arrays:
                raise BadRequest(f"{where(handle)}: input {filled!r} is filled from the texts "
                                 f"of input {name!r}; send {name!r} alone, or every input as "
                                 "tensors")
            specs.pop(filled, None)
        array = arrays[name]
        _check_rows(handle, name, array, (1, 2), "[N] or [N, 1] (one text a batch row) or "
                    "[N, 2] (a pair of texts a row)", "rows of text")
        specs[name] = specs[name].model_copy(update={"datatype": BYTES, "shape": array.shape})
    return specs


def _check_rows(handle: LoadedVersion, name: str, array: np.ndarray, widths: tuple[int, ...],
                expected: str, rows_are: str) -> None:
    """400 unless a pipeline input's BYTES tensor is 1 to max_batch_size rows: shape ``[N]``,
    or ``[N, W]`` for a width W in `widths` (what `expected` says, and `rows_are` counts)."""
    rows = array.shape[0] if array.ndim else 0
    if array.ndim not in (1, 2) or (array.ndim == 2 and array.shape[1] not in widths) or not rows:
        raise BadRequest(f"{where(handle)}: input {name!r} has BYTES shape "
                         f"{list(array.shape)}; expected {expected}, N >= 1")
    if rows > handle.config.max_batch_size:
        raise BadRequest(f"{where(handle)}: input {name!r} has {rows} {rows_are}; "
                         f"max_batch_size is {handle.config.max_batch_size}, split the request")


def _refuse_rows(handle: LoadedVersion, arrays: Mapping[str, np.ndarray],
                 specs: Mapping[str, TensorConfig]) -> NoReturn:
    """The 400 for inputs of no rows, or disagreeing on their number (as the batcher words
    it for its own callers)."""
    rows = {name: _rows_of(specs[name], array) for name, array in arrays.items()}
    if len(arrays) > 1 and len(set(rows.values())) > 1:
        first = all(specs[name].axis == 0 for name in arrays)
        raise BadRequest(f"{where(handle)}: inputs disagree on the batch size ("
                         f"{'first dimension' if first else 'batch axes'}): "
                         + ", ".join(f"{name} {count}" for name, count in rows.items()))
    raise BadRequest(f"{where(handle)}: batch size 0 is outside 1..max_batch_size "
                     f"{handle.config.max_batch_size}; send at least one row")


def check_input_name(handle: LoadedVersion, name: str) -> None:
    """400 when the version has no input `name`. Decoders call it as they read each input's
    name, before its datatype, shape and data: a request to a wrong name is told so, whatever
    else is wrong with its tensor."""
    if name not in handle.input_specs:
        _refuse_unknown(handle, [name])


def _refuse_unknown(handle: LoadedVersion, unknown: Sequence[str]) -> NoReturn:
    _refuse_state(handle, unknown[0], "input")
    raise BadRequest(f"{where(handle)} has no input {names(unknown)}; its inputs are "
                     f"{names(list(handle.input_specs))}"
                     f"{_renamed(handle.config.inputs, unknown[0], 'input')}")


def _refuse_names(handle: LoadedVersion, arrays: Mapping[str, np.ndarray]) -> NoReturn:
    """The 400 for inputs that are not the config's: unknown names first, then missing."""
    specs = handle.input_specs
    unknown = [name for name in arrays if name not in specs]
    if unknown:
        _refuse_unknown(handle, unknown)
    spec = next(spec for name, spec in specs.items() if name not in arrays)
    raise BadRequest(f"{where(handle)}: missing input {spec.name!r}, which takes "
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
    name = spec.name
    if given != spec.datatype:
        wanted = _wire(handle, spec) if name in handle.pipelines else spec.datatype
        hint = "" if given != BYTES or name in handle.pipelines else (
            " (BYTES is for inputs with a preprocess pipeline: encoded images or texts)")
        raise BadRequest(f"{where(handle)}: input {name!r} has datatype {given}; expected "
                         f"{wanted}{hint}")
    if not _shape_fits(spec.shape, array.shape):
        raise BadRequest(f"{where(handle)}: input {name!r} has shape {list(array.shape)}; "
                         f"expected {list(spec.shape)} (-1: any size)")
    axis = "" if spec.axis == 0 else f" (along its batch axis {spec.axis})"
    raise BadRequest(f"{where(handle)}: input {name!r} has {_rows_of(spec, array)} rows{axis}; "
                     f"max_batch_size is {handle.config.max_batch_size}, split the request")


def _refuse_state(handle: LoadedVersion, name: str, kind: str) -> None:
    """The 400 for a request naming a sequence's implicit state, which the server keeps."""
    sequences = handle.sequences
    if sequences is not None and name in (sequences.state_inputs if kind == "input"
                                          else sequences.state_outputs):
        raise BadRequest(f"{where(handle)}: {kind} {name!r} is a sequence's implicit state "
                         "(sequence_batching.state), which the server keeps between a "
                         f"sequence's requests; leave it out")


def _renamed(tensors: Sequence[TensorConfig] | None, name: str, kind: str) -> str:
    """For an error: that `name` is the graph's name of a renamed tensor, if it is."""
    renamed = next((tensor.name for tensor in tensors or () if tensor.source == name), None)
    return "" if renamed is None else (f" ({name!r} is the graph's name of {kind} {renamed!r}, "
                                       "which config.json renames)")


def answerable(handle: LoadedVersion) -> Sequence[str]:
    """The tensors a V2 request may name in its outputs, as model metadata lists them: the
    outputs, and the extra tensors of their postprocesses (``NAME_index``, ``NAME_label``)."""
    if not handle.postprocesses:
        return handle.output_names
    return list(handle.tensor_owners)


def check_requested(handle: LoadedVersion, requested: Sequence[str],
                    classified: Collection[str]) -> None:
    """400 unless every requested name is a tensor model metadata lists, and every one asked
    for as a classification is an output (not a postprocess's extra tensor)."""
    available = answerable(handle)
    for name in requested:
        if name not in available:
            _refuse_state(handle, name, "output")
            raise BadRequest(f"{where(handle)} has no output {name!r}; its outputs are "
                             f"{names(list(available))}"
                             f"{_renamed(handle.config.outputs, name, 'output')}")
    extras = [name for name in classified if name not in handle.output_names]
    if extras:
        raise BadRequest(f"{where(handle)}: output {extras[0]!r} is computed by a "
                         "postprocess; the classification extension applies to the model's "
                         f"outputs {names(handle.output_names)}")
