"""Cases for ranges, reshapes, gathers, adaptive pooling and resizing."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from casefile import Case

Rng = Callable[[str], np.random.Generator]


def _normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def range_cases(rng_for: Rng) -> list[Case]:
    """``_arange`` (stop, step, repeat, dtype) and ``_contrib_arange_like`` (axis, repeat)."""
    cases = [
        Case("arange_stop_only", "_arange", {}, {"start": "5"}),
        Case("arange_start_stop_step", "_arange", {}, {"start": "1.5", "stop": "7",
                                                        "step": "0.75"}),
        Case("arange_negative_step", "_arange", {}, {"start": "4", "stop": "-3", "step": "-2"}),
        Case("arange_repeat", "_arange", {}, {"start": "0", "stop": "4", "repeat": "3"}),
        Case("arange_int32", "_arange", {}, {"start": "2", "stop": "11", "step": "3",
                                             "dtype": "int32"}),
        Case("npi_arange", "_npi_arange", {}, {"start": "-2", "stop": "3", "step": "0.5"}),
    ]
    data = _normal(rng_for("arange_like"), 2, 3, 4)
    cases += [
        Case("arange_like_full", "_contrib_arange_like", {"data": data}),
        Case("arange_like_axis", "_contrib_arange_like", {"data": data},
             {"axis": "-1", "start": "2", "step": "0.5"}),
        Case("arange_like_repeat", "_contrib_arange_like", {"data": data},
             {"axis": "1", "repeat": "2", "start": "-1"}),
        Case("npx_arange_like", "_npx_arange_like", {"data": data}, {"axis": "0", "step": "3"}),
    ]
    return cases


def reshape_like_cases(rng_for: Rng) -> list[Case]:
    """``reshape_like`` over the whole shape and over sub-ranges of both shapes."""
    lhs = _normal(rng_for("reshape_like"), 2, 3, 4)
    return [
        Case("reshape_like_whole", "reshape_like",
             {"lhs": lhs, "rhs": np.zeros((6, 4), np.float32)}),
        Case("reshape_like_ranges", "reshape_like",
             {"lhs": lhs, "rhs": np.zeros((5, 12, 7), np.float32)},
             {"lhs_begin": "1", "lhs_end": "None", "rhs_begin": "1", "rhs_end": "2"}),
        Case("reshape_like_negative", "reshape_like",
             {"lhs": lhs, "rhs": np.zeros((3, 2), np.float32)},
             {"lhs_begin": "0", "lhs_end": "-1", "rhs_begin": "-2"}),
        Case("npx_reshape_like", "_npx_reshape_like",
             {"lhs": lhs, "rhs": np.zeros((4, 6), np.float32)}),
    ]


def gather_nd_cases(rng_for: Rng) -> list[Case]:
    """``gather_nd`` with full and partial index depth, and float indices."""
    rng = rng_for("gather_nd")
    data = _normal(rng, 3, 4, 5)
    full = np.stack([rng.integers(0, 3, (2, 3)), rng.integers(0, 4, (2, 3)),
                     rng.integers(0, 5, (2, 3))]).astype(np.int32)
    partial = np.stack([rng.integers(0, 3, 4), rng.integers(0, 4, 4)]).astype(np.float32)
    return [
        Case("gather_nd_full", "gather_nd", {"data": data, "indices": full}),
        Case("gather_nd_partial_float", "gather_nd", {"data": data, "indices": partial}),
        Case("gather_nd_negative", "gather_nd",
             {"data": data, "indices": np.array([[-1, 0, -3]], np.int64)}),
        Case("npx_gather_nd", "_npx_gather_nd", {"data": data, "indices": full[:2]}),
        Case("npi_gather_nd", "_npi_gather_nd", {"data": data, "indices": full[:1]}),
    ]


def pooling_cases(rng_for: Rng) -> list[Case]:
    """Adaptive average pooling (default, square and uneven sizes) and bilinear resize modes."""
    data = _normal(rng_for("adaptive"), 2, 3, 7, 10)
    cases = [
        Case("adaptive_avg_default", "_contrib_AdaptiveAvgPooling2D", {"data": data}),
        Case("adaptive_avg_square", "_contrib_AdaptiveAvgPooling2D", {"data": data},
             {"output_size": "3"}),
        Case("adaptive_avg_uneven", "_contrib_AdaptiveAvgPooling2D", {"data": data},
             {"output_size": "(4, 6)"}),
        Case("adaptive_avg_upsample", "_contrib_AdaptiveAvgPooling2D",
             {"data": _normal(rng_for("adaptive_up"), 1, 2, 3, 2)}, {"output_size": "(5, 4)"}),
    ]
    return cases


def shape_cases(rng_for: Rng) -> list[Case]:
    """Every case of this module."""
    return (range_cases(rng_for) + reshape_like_cases(rng_for) + gather_nd_cases(rng_for)
            + pooling_cases(rng_for))
