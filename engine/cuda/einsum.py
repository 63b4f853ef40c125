"""``einsum`` without cuBLAS, for a stream that captures a CUDA graph.

CuPy's einsum contracts through cuBLAS, which CuPy refuses to call during stream capture. Here
every operand becomes a broadcast view over one index space (repeated labels as diagonals), the
views are multiplied and the summed labels reduced: more memory than a contraction, no cuBLAS.
"""

from __future__ import annotations

import string
from typing import Any

_ELLIPSIS_LABELS = "".join(chr(0x3B1 + k) for k in range(24))  # Greek: never a user's label


def einsum(xp: Any, subscripts: str, *operands: Any) -> Any:
    """``numpy.einsum(subscripts, *operands)`` as a multiply and a sum over broadcast views."""
    inputs, output = _parse(subscripts.replace(" ", ""), [a.ndim for a in operands])
    summed = sorted({label for labels in inputs for label in labels} - set(output))
    order = list(output) + summed
    terms = []
    for labels, array in zip(inputs, operands):
        array, labels = _diagonals(xp, array, list(labels))
        present = [label for label in order if label in labels]
        array = array.transpose([labels.index(label) for label in present])
        terms.append(array.reshape([array.shape[present.index(label)] if label in present else 1
                                    for label in order]))
    product = terms[0]
    for term in terms[1:]:
        product = product * term
    if summed:
        product = product.sum(axis=tuple(range(len(output), len(order))))
    shape = [max(t.shape[k] for t in terms) for k in range(len(output))]
    return xp.ascontiguousarray(xp.broadcast_to(product, shape))


def _parse(subscripts: str, ranks: list[int]) -> tuple[list[str], str]:
    """(each operand's labels, the output's labels), ellipses spelled out as Greek labels."""
    left, arrow, right = subscripts.partition("->")
    inputs = left.split(",")
    if len(inputs) != len(ranks):
        raise ValueError(f"einsum subscripts {subscripts!r} name {len(inputs)} operands, "
                         f"got {len(ranks)}")
    widest = 0
    spelled = []
    for labels, rank in zip(inputs, ranks):
        if "..." in labels:
            width = rank - len(labels.replace("...", ""))
            widest = max(widest, width)
            labels = labels.replace("...", _ELLIPSIS_LABELS[len(_ELLIPSIS_LABELS) - width:])
        spelled.append(labels)
    broadcast = _ELLIPSIS_LABELS[len(_ELLIPSIS_LABELS) - widest:]
    if arrow:
        output = right.replace("...", broadcast)
    else:
        counts = "".join(spelled)
        output = broadcast + "".join(sorted(c for c in set(counts) if counts.count(c) == 1
                                            and c in string.ascii_letters))
    return spelled, output


def _diagonals(xp: Any, array: Any, labels: list[str]) -> tuple[Any, list[str]]:
    """``array`` with each repeated label reduced to its diagonal (moved to the last axis)."""
    while len(set(labels)) < len(labels):
        label = next(label for label in labels if labels.count(label) > 1)
        first = labels.index(label)
        second = labels.index(label, first + 1)
        array = xp.diagonal(array, axis1=first, axis2=second)
        labels = [item for k, item in enumerate(labels) if k not in (first, second)] + [label]
    return array, labels
