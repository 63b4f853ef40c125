"""Texts in: the request side of an input's ``text`` pipeline.

A text input takes a ``BYTES`` tensor: shape ``[N]`` or ``[N, 1]`` for one text a batch row,
``[N, 2]`` for a pair (two sentences) a row; in JSON each element is the text itself, in binary
data its UTF-8 bytes. The inputs the pipeline fills (token types, valid length) are then not
sent (`service.dataplane.checks.request_specs` leaves them out). Tokenisation runs off the event
loop (`service.tensors.images.ImageInputs`' pool), giving the model's three tensors; the request
then goes to the batcher like any other.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from engine.errors import InputError
from engine.serving.config import datatype_of
from engine.serving.loaded import LoadedVersion
from engine.serving.text import TextPipeline, text_rows
from service.errors import BadRequest
from service.tensors import json
from service.tensors.datatypes import BYTES


def datatypes_of(arrays: Mapping[str, np.ndarray]) -> dict[str, str]:
    """The V2 datatype of each array: BYTES for object arrays (texts)."""
    return {name: BYTES if array.dtype == object else datatype_of(array.dtype)
            for name, array in arrays.items()}


def predict_texts(handle: LoadedVersion, inputs: dict[str, object]) -> dict[str, np.ndarray]:
    """Take the text inputs of a ``/predict`` JSON body out of `inputs` (modified): a list of
    strings (one a row) or of ``[first, second]`` pairs, as BYTES object arrays."""
    texts = {}
    for name, pipeline in handle.pipelines.items():
        if not isinstance(pipeline, TextPipeline) or name not in inputs:
            continue
        value = json.plain(inputs[name])
        rows = _rows_of(value)
        if rows is None:
            continue  # not texts (token ids, say): a tensor, checked as such
        if len({len(row) for row in rows}) > 1:
            raise BadRequest(f"model {handle.name!r} version {handle.version}: input {name!r} "
                             "mixes single texts and pairs; send one kind a request")
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
