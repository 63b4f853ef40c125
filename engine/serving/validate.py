"""Load a version directory and prove it serves: parse, bind, infer shapes, one synthetic run.

The config is completed here: inputs and outputs left out of ``config.json`` are taken from the
graph (and from the synthetic run for outputs); what cannot be inferred is an `InvalidModel`
that names the field to write.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from engine.errors import EngineError
from engine.serving.config import ModelConfig, TensorConfig, datatype_of
from engine.serving.errors import InvalidModel, ServingError
from engine.serving.manifest import PARAMS_NAME, SYMBOL_NAME


class Spec(Protocol):
    """What the repository reads of `engine.TensorSpec`."""

    name: str
    shape: tuple[int, ...] | None
    dtype: np.dtype


class ServableModel(Protocol):
    """What the repository needs of `engine.Model`."""

    input_names: list[str]
    output_names: list[str]
    inputs: Sequence[Spec]
    outputs: Sequence[Spec]
    param_bytes: int

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...


Loader = Callable[..., ServableModel]


@dataclass(frozen=True)
class Validated:
    """A loaded model and its complete config (inputs and outputs filled in)."""

    model: ServableModel
    config: ModelConfig


def default_loader(symbol: Any, params: Any, *, device: str = "cpu") -> ServableModel:
    """`engine.load_model`, imported on first use."""
    import engine

    return engine.load_model(symbol, params, device=device)


def load_and_validate(version_dir: Path, config: ModelConfig, *, loader: Loader,
                      device: str, where: str, memory_cap_bytes: int | None = None) -> Validated:
    """Load ``version_dir``'s files, complete `config` and run one synthetic batch of 1 row.

    With ``memory_cap_bytes``, a model whose parameters plus activations at ``max_batch_size``
    would need more is refused from shape inference alone, before the test run allocates.

    Raises:
        InvalidModel: any failure; the message starts with `where` and names the cause.
    """
    try:
        model = loader(version_dir / SYMBOL_NAME, version_dir / PARAMS_NAME, device=device)
    except ServingError:
        raise
    except (EngineError, ValueError, TypeError, OSError) as error:
        raise InvalidModel(f"{where}: cannot load the model: {error}") from error
    inputs = complete_inputs(config.inputs, model, where)
    if memory_cap_bytes is not None:
        check_memory(model, inputs, config.max_batch_size, memory_cap_bytes, where)
    sample = synthetic_inputs(inputs)
    try:
        outputs = model.infer(sample)
    except Exception as error:  # noqa: BLE001 - any failure of the test run refuses the model
        given = ", ".join(f"{name} {array.shape} {array.dtype}" for name, array in sample.items())
        raise InvalidModel(f"{where}: test inference on synthetic input ({given}) failed: "
                           f"{error}") from error
    outputs_config = complete_outputs(config.outputs, model, outputs, where)
    full = ModelConfig.model_validate({**config.model_dump(), "inputs": inputs,
                                       "outputs": outputs_config})
    return Validated(model, full)


def check_memory(model: ServableModel, inputs: Sequence[TensorConfig], max_batch_size: int,
                 cap: int, where: str) -> None:
    """Refuse a model whose estimated memory at ``max_batch_size`` is over ``cap`` bytes."""
    estimate = getattr(model, "estimate_activation_bytes", None)
    if estimate is None:
        return
    shapes = {tensor.name: (max_batch_size, *(max(dim, 1) for dim in tensor.shape[1:]))
              for tensor in inputs}
    try:
        needed = model.param_bytes + estimate(shapes)
    except EngineError as error:
        raise InvalidModel(f"{where}: cannot infer shapes at max_batch_size "
                           f"{max_batch_size}: {error}") from error
    if needed > cap:
        raise InvalidModel(f"{where}: the model would need about {needed} bytes of memory "
                           f"(parameters and activations at max_batch_size {max_batch_size}); "
                           f"the memory cap is {cap} bytes")


def complete_inputs(given: Sequence[TensorConfig] | None, model: ServableModel,
                    where: str) -> tuple[TensorConfig, ...]:
    """The config's inputs, checked against the model, or inferred from its input specs."""
    specs = {spec.name: spec for spec in model.inputs}
    if given is not None:
        names = [tensor.name for tensor in given]
        if sorted(names) != sorted(specs):
            raise InvalidModel(f"{where}: config inputs {names} do not match the model's inputs "
                               f"{list(specs)}")
        for index, tensor in enumerate(given):
            _check_known_dims(f"inputs.{index}.shape", tensor.shape, specs[tensor.name], where)
        return tuple(given)
    return tuple(_infer_input(index, spec, where) for index, spec in enumerate(model.inputs))


def _infer_input(index: int, spec: Spec, where: str) -> TensorConfig:
    field = f"inputs.{index}.shape"
    hint = (f"write it in config.json, e.g. \"inputs\": [{{\"name\": \"{spec.name}\", "
            f"\"datatype\": \"FP32\", \"shape\": [-1, ...]}}]")
    if spec.shape is None or len(spec.shape) == 0:
        raise InvalidModel(f"{where}: no config.json, and {field} (input {spec.name!r}) cannot be "
                           f"inferred from the graph; {hint}")
    unknown = [axis for axis, dim in enumerate(spec.shape) if axis > 0 and dim <= 0]
    if unknown:
        raise InvalidModel(f"{where}: no config.json, and {field} (input {spec.name!r}) is only "
                           f"partly known from the graph ({list(spec.shape)}, dimension "
                           f"{unknown[0]} unknown); {hint}")
    try:
        datatype = datatype_of(spec.dtype)
    except ValueError as error:
        raise InvalidModel(f"{where}: inputs.{index}.datatype: {error}") from None
    return TensorConfig(name=spec.name, datatype=datatype, shape=(-1, *spec.shape[1:]))


def complete_outputs(given: Sequence[TensorConfig] | None, model: ServableModel,
                     sample: Mapping[str, np.ndarray], where: str) -> tuple[TensorConfig, ...]:
    """The config's outputs checked against one synthetic run, or inferred from it."""
    names = list(model.output_names)
    if list(sample) != names:
        raise InvalidModel(f"{where}: the test run returned outputs {list(sample)}; the graph "
                           f"names {names}")
    for name, array in sample.items():
        if np.ndim(array) == 0 or np.shape(array)[0] != 1:
            raise InvalidModel(f"{where}: output {name!r} has shape {np.shape(array)} for a "
                               "batch of 1 row; outputs must keep the batch dimension first")
    if given is None:
        specs = {spec.name: spec for spec in model.outputs}
        return tuple(_infer_output(name, sample[name], specs.get(name), where) for name in names)
    given_names = [tensor.name for tensor in given]
    if sorted(given_names) != sorted(names):
        raise InvalidModel(f"{where}: config outputs {given_names} do not match the model's "
                           f"outputs {names}")
    for index, tensor in enumerate(given):
        array = np.asarray(sample[tensor.name])
        if datatype_of(array.dtype) != tensor.datatype:
            raise InvalidModel(f"{where}: outputs.{index}.datatype is {tensor.datatype}, but the "
                               f"model returns {datatype_of(array.dtype)}")
        if len(tensor.shape) != array.ndim or any(
                dim not in (-1, got) for dim, got in zip(tensor.shape[1:], array.shape[1:])):
            raise InvalidModel(f"{where}: outputs.{index}.shape {list(tensor.shape)} does not fit "
                               f"the test run's output shape {list(array.shape)}")
    return tuple(given)


def _infer_output(name: str, array: np.ndarray, spec: Spec | None, where: str) -> TensorConfig:
    array = np.asarray(array)
    shape = [-1, *array.shape[1:]]
    if spec is not None and spec.shape is not None and len(spec.shape) == array.ndim:
        shape = [-1, *(got if dim > 0 else -1 for dim, got in zip(spec.shape[1:],
                                                                  array.shape[1:]))]
    try:
        datatype = datatype_of(array.dtype)
    except ValueError as error:
        raise InvalidModel(f"{where}: output {name!r}: {error}") from None
    return TensorConfig(name=name, datatype=datatype, shape=tuple(shape))


def _check_known_dims(field: str, shape: tuple[int, ...], spec: Spec, where: str) -> None:
    if spec.shape is None:
        return
    if len(spec.shape) != len(shape):
        raise InvalidModel(f"{where}: {field} {list(shape)} has {len(shape)} dimensions; the "
                           f"graph gives input {spec.name!r} {len(spec.shape)}: "
                           f"{list(spec.shape)}")
    for axis, (dim, known) in enumerate(zip(shape, spec.shape)):
        if axis > 0 and dim > 0 and known > 0 and dim != known:
            raise InvalidModel(f"{where}: {field} {list(shape)} has {dim} at dimension {axis}; "
                               f"the graph gives input {spec.name!r} {list(spec.shape)}")


def synthetic_inputs(inputs: Sequence[TensorConfig], rows: int = 1) -> dict[str, np.ndarray]:
    """Zeros of each input's shape with `rows` rows (variable dimensions taken as 1)."""
    return {tensor.name: np.zeros((rows, *(dim if dim > 0 else 1 for dim in tensor.shape[1:])),
                                  tensor.dtype)
            for tensor in inputs}


def input_shapes(inputs: Sequence[TensorConfig], rows: int) -> dict[str, tuple[int, ...]]:
    """Shapes of `synthetic_inputs` (for memory estimates)."""
    return {tensor.name: (rows, *(dim if dim > 0 else 1 for dim in tensor.shape[1:]))
            for tensor in inputs}
