"""Triton's classification extension: an output answered as its top classes, not its values.

A requested output with ``"parameters": {"classification": K}`` comes back as a BYTES tensor of
shape ``[batch, min(K, classes)]`` (classes: the elements of one row), each element
``"<value>:<index>[:<label>]"`` for the K highest values of its row, highest first. Values are
printed as C++'s ``std::to_string`` prints them, as Triton does: ``%f`` (six decimals) for
floating point, plain decimal for integers. Triton sorts with ``std::sort``, which leaves the
order of equal values unspecified; here equal values keep their index order (lower first).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.serving.config import datatype_of
from service.errors import BadRequest

# The datatypes Triton classifies; it refuses the others (BOOL, FP16, BYTES).
CLASSIFIABLE = frozenset({"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
                          "INT64", "FP32", "FP64"})


def count_of(value: object, where: str) -> int | None:
    """The ``classification`` parameter of a requested output: None when absent or 0 (raw
    values, as Triton takes 0), else a positive count; 400 for anything but an integer."""
    if value is None or (type(value) is int and value == 0):
        return None
    if type(value) is not int or value < 0:
        raise BadRequest(f"{where}: parameters.classification must be a non-negative integer "
                         f"(how many top classes to return), got {value!r:.50}")
    return value


def classify(array: np.ndarray, count: int, labels: Sequence[str] | None,
             where: str) -> np.ndarray:
    """The top `count` classes of each row of `array` (batch first) as an object array of
    UTF-8 byte strings, shape ``[rows, min(count, classes)]``."""
    datatype = datatype_of(array.dtype)
    if datatype not in CLASSIFIABLE:
        raise BadRequest(f"{where}: class result not available for an output of datatype "
                         f"{datatype}; classification takes {', '.join(sorted(CLASSIFIABLE))}")
    rows = array.reshape(array.shape[0], -1)
    classes = rows.shape[1]
    # Descending and stable: sort the reversed row ascending, then read it backwards.
    order = classes - 1 - np.argsort(rows[:, ::-1], axis=1, kind="stable")[:, ::-1]
    top = order[:, :min(count, classes)]
    text = _float_text if array.dtype.kind == "f" else _integer_text
    result = np.empty(top.shape, dtype=object)
    for row, indices in enumerate(top):
        for column, index in enumerate(indices.tolist()):
            element = f"{text(rows[row, index])}:{index}"
            if labels is not None:
                element += f":{labels[index]}"
            result[row, column] = element.encode("utf-8")
    return result


def _float_text(value: np.floating) -> str:
    # std::to_string(float) widens to double and prints "%f"; so does this.
    return f"{float(value):f}"


def _integer_text(value: np.integer) -> str:
    return str(int(value))
