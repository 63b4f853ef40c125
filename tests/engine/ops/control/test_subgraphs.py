"""Control-flow operators reach their subgraphs through what the runtime and shape inference
provide (`engine.ops.control.subgraphs`), never by importing them."""

from __future__ import annotations

import pytest

from engine.errors import ExecutionError, ShapeError
from engine.graph import infer
from engine.ops.control import subgraphs
from engine.runtime import interpreter


def test_the_interpreter_and_shape_inference_provide_themselves() -> None:
    # Imported above: each registered itself on import.
    assert subgraphs._provided == {"evaluate": interpreter.evaluate,
                                   "infer_shapes": infer.infer_shapes,
                                   "infer_dtypes": infer.infer_dtypes}


def test_without_a_provider_the_error_says_what_is_missing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subgraphs, "_provided", {})
    with pytest.raises(ExecutionError, match="needs a runtime to run its subgraph"):
        subgraphs.evaluate(object(), {}, None)
    with pytest.raises(ShapeError, match="needs shape inference for its subgraphs"):
        subgraphs.infer_shapes(object(), {})
