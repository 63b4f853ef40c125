"""Texts in: the request side of an input's ``text`` pipeline.

A text input takes a ``BYTES`` tensor: shape ``[N]`` or ``[N, 1]`` for one text a batch row,
``[N, 2]`` for a pair (two sentences) a row; in JSON each element is the text itself, in binary
data its UTF-8 bytes. The inputs the pipeline fills (token types, valid length) are then not
sent. Tokenisation runs off the event loop (`ImageInputs`' pool), giving the model's three
tensors; the request then goes to the batcher like any other.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from engine.errors import InputError
from engine.serving.config import TensorConfig
from engine.serving.loaded import LoadedVersion
from engine.serving.text import TextPipeline, text_rows
from service import codecs, json_tensors
from service.errors import BadRequest

BYTES = "BYTES"


def _where(handle: LoadedVersion) -> str:
    return f"model {handle.name!r} version {handle.version}"


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
                raise BadRequest(f"{_where(handle)}: input {filled!r} is filled from the texts "
                                 f"of input {name!r}; send {name!r} alone, or every input as "
                                 "tensors")
            specs.pop(filled, None)
        array = arrays[name]
        _check_shape(handle, name, array)
        specs[name] = specs[name].model_copy(update={"datatype": BYTES, "shape": array.shape})
    return specs


def _check_shape(handle: LoadedVersion, name: str, array: np.ndarray) -> None:
    rows = array.shape[0] if array.ndim else 0
    if array.ndim not in (1, 2) or (array.ndim == 2 and array.shape[1] not in (1, 2)) or not rows:
        raise BadRequest(f"{_where(handle)}: input {name!r} has BYTES shape "
                         f"{list(array.shape)}; expected [N] or [N, 1] (one text a batch row) "
                         "or [N, 2] (a pair of texts a row), N >= 1")
    if rows > handle.config.max_batch_size:
        raise BadRequest(f"{_where(handle)}: input {name!r} has {rows} rows of text; "
                         f"max_batch_size is {handle.config.max_batch_size}, split the request")


def datatypes_of(arrays: Mapping[str, np.ndarray]) -> dict[str, str]:
    """The V2 datatype of each array: BYTES for object arrays (texts)."""
    return {name: BYTES if array.dtype == object else codecs.datatype_of(array.dtype)
            for name, array in arrays.items()}


def predict_texts(handle: LoadedVersion, inputs: dict[str, object]) -> dict[str, np.ndarray]:
    """Take the text inputs of a ``/predict`` JSON body out of `inputs` (modified): a list of
    strings (one a row) or of ``[first, second]`` pairs, as BYTES object arrays."""
    texts = {}
    for name, pipeline in handle.pipelines.items():
        if not isinstance(pipeline, TextPipeline) or name not in inputs:
            continue
        value = json_tensors.plain(inputs[name])
        rows = _rows_of(value)
        if rows is None:
            continue  # not texts (token ids, say): a tensor, checked as such
        if len({len(row) for row in rows}) > 1:
            raise BadRequest(f"{_where(handle)}: input {name!r} mixes single texts and pairs; "
                             "send one kind a request")
        del inputs[name]
        array = np.empty((len(rows), len(rows[0])), object)
        array[:] = rows
        texts[name] = array
    return texts


def _rows_of(value: object) -> list[tuple[str, ...]] | None:
    """A /predict text input's rows: a string, or a list of strings or of ``[first, second]``
    lists; None when it is not texts."""
    rows = []
    for row in [value] if isinstance(value, str) else value if isinstance(value, list) else []:
        if isinstance(row, str):
            rows.append((row,))
        elif isinstance(row, list) and len(row) in (1, 2) and all(
                isinstance(text, str) for text in row):
            rows.append(tuple(row))
        else:
            return None
    return rows or None


def text_tensors(pipeline: TextPipeline, array: np.ndarray, where: str) -> dict[str, np.ndarray]:
    """The filled inputs' tensors from a checked BYTES tensor (runs on a worker thread).

    Raises:
        InputError: a text is not UTF-8; the message names the input and the batch row.
    """
    columns = array.shape[1] if array.ndim == 2 else 1
    try:
        rows = text_rows(array.reshape(-1), columns)
    except InputError as error:
        raise InputError(f"{where}, {error}") from None
    return pipeline.encode(rows)
