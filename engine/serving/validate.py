"""Load a version directory and prove it serves: parse, bind, infer shapes, compile, one test run.

The config is completed here: inputs and outputs left out of ``config.json`` are taken from the
graph, with -1 for each dimension it leaves open (and from the synthetic run for outputs); what
cannot be inferred is an `InvalidModel` that names the field to write. What ran is recorded per
model (`checks_of`) for the upload's answer. docs/models.md tells the whole story.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from engine.errors import EngineError
from engine.runtime.batch_split import input_dependent
from engine.runtime.loader import load_model
from engine.serving.batch_axes import (
    batch_record,
    outputs_batch_axes,
    probe_config,
    settled,
)
from engine.serving.calibration import load_int8
from engine.serving.compile_step import compile_at_load
from engine.serving.config import ModelConfig, TensorConfig, datatype_of
from engine.serving.errors import InvalidModel, ServingError, TestRunFailed
from engine.serving.labels import read_labels
from engine.serving.manifest import PARAMS_NAME, SYMBOL_NAME
from engine.serving.postprocess_check import check_postprocess
from engine.serving.precision_check import check_precision
from engine.serving.preprocess_check import check_preprocess
from engine.serving.probe import Probe, sample_or_ones, with_rows
from engine.serving.warmup import compile_sizes, warm_up


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
class Checks:
    """What validation ran for a model, for the upload's answer (a refused model has none:
    the first check that failed is the upload's error).

    Loading succeeded, so the symbol parsed, every op is known and the parameters match the
    graph's variables; shape inference from the parameters completed the inputs, and
    `variable_dims` lists the axes it left open (checked per request). `sample` is the shape
    the test inference ran at (None: skipped, `skipped` says why); `memory_bytes` is the
    estimate at max_batch_size (None: not estimated, `memory_skipped` says why); `compile` is
    the compile step's record (`compile_record`: each plan compiled at load, what for, seconds
    and bytes; None: the model has no compile step); `warmup` the ``model_warmup`` samples
    that ran (`warm_up`'s record).
    """

    variable_dims: dict[str, list[int]]
    sample: dict[str, tuple[int, ...]] | None
    skipped: str | None = None
    # Each input's and output's batch axis (None: no batching, `unbatched` says why).
    batch_axes: dict[str, dict[str, int]] | None = None
    unbatched: str | None = None
    memory_bytes: int | None = None
    memory_skipped: str | None = None
    preprocess: dict[str, Any] | None = None  # `check_preprocess`'s record; None: no pipeline
    postprocess: dict[str, Any] | None = None  # `check_postprocess`'s; None: no postprocess
    compile: dict[str, Any] | None = None  # `compile_at_load`'s record; None: no compile step
    precision: dict[str, Any] | None = None  # `check_precision`'s record; None: fp32
    warmup: list[dict[str, Any]] | None = None  # `warm_up`'s record of each sample run

    @classmethod
    def of(cls, inputs: Sequence[TensorConfig], sample: Mapping[str, tuple[int, ...]] | None,
           memory_bytes: int | None, memory_skipped: str | None,
           batched: bool = True) -> Checks:
        """The record of a validation that completed `inputs` and found `sample` (keyed by
        graph names; recorded under the names clients use); `batched` False: the inputs have
        no batch axis (``max_batch_size`` 0), so every open dimension is variable."""
        variable = {tensor.name: [axis for axis, dim in enumerate(tensor.shape)
                                  if dim < 0 and (axis != tensor.axis or not batched)]
                    for tensor in inputs}
        if sample is not None:
            sample = {tensor.name: sample[tensor.graph_name] for tensor in inputs}
        skipped = None if sample is not None else (
            "no small input shape tried fits the graph (see docs/models.md); give the "
            "variable dimensions in config.json to have it run")
        return cls(variable, None if sample is None else dict(sample), skipped,
                   memory_bytes=memory_bytes, memory_skipped=memory_skipped)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: each check with ``ran`` and what it found or why it was skipped."""
        test: dict[str, Any] = {"ran": self.sample is not None}
        if self.sample is not None:
            test["inputs"] = {name: list(shape) for name, shape in self.sample.items()}
        else:
            test["reason"] = self.skipped
        memory: dict[str, Any] = {"ran": self.memory_bytes is not None}
        if self.memory_bytes is not None:
            memory["estimated_bytes"] = self.memory_bytes
        else:
            memory["reason"] = self.memory_skipped
        compiled = ({"ran": True, **self.compile} if self.compile is not None else
                    {"ran": False, "reason": "the model has no compile step: its plans, if "
                     "any, compile when first run"})
        batching: dict[str, Any] = (
            {"batched": True, **self.batch_axes} if self.batch_axes is not None
            else {"batched": False, "reason": self.unbatched})
        checks = {"parsed": True, "ops_known": True, "params_match": True,
                  "shape_inference": {"ran": True, "variable_dims": self.variable_dims},
                  "batch_axes": batching, "test_inference": test, "memory_estimate": memory,
                  "compile": compiled}
        if self.postprocess is not None:
            checks["postprocess"] = self.postprocess
        if self.precision is not None:
            checks["precision"] = self.precision
        if self.warmup:
            checks["warmup"] = {"ran": True, "samples": self.warmup}
        return checks if self.preprocess is None else {**checks, "preprocess": self.preprocess}


# The checks (and class labels) of each validated model, kept beside it rather than on it: the
# repository keeps the model, and the record goes when the model does.
_CHECKS: weakref.WeakKeyDictionary[Any, Checks] = weakref.WeakKeyDictionary()
_LABELS: weakref.WeakKeyDictionary[Any, dict[str, tuple[str, ...]]] = weakref.WeakKeyDictionary()


def checks_of(model: object) -> Checks | None:
    """What `load_and_validate` checked for `model` (None for a model it did not validate)."""
    try:
        return _CHECKS.get(model)
    except TypeError:  # not weakly referenceable: never validated here
        return None


def labels_of(model: object) -> dict[str, tuple[str, ...]]:
    """The class labels `load_and_validate` read for `model`, by output name ({}: none)."""
    try:
        return _LABELS.get(model, {})
    except TypeError:  # not weakly referenceable: never validated here
        return {}


@dataclass(frozen=True)
class Validated:
    """A loaded model and its complete config (inputs and outputs filled in)."""

    model: ServableModel
    config: ModelConfig


def default_loader(symbol: Any, params: Any, *, device: str = "cpu",
                   plan_cache_size: int | None = None, precision: str = "fp32",
                   **int8: Any) -> ServableModel:
    """`engine.load_model` for serving: outputs must keep the batch dimension
    (``keep_batch``); `plan_cache_size` None: its default; ``int8``: the calibration
    arguments."""
    if plan_cache_size is None:
        return load_model(symbol, params, device=device, keep_batch=True, precision=precision,
                          **int8)
    return load_model(symbol, params, device=device, plan_cache_size=plan_cache_size,
                      keep_batch=True, precision=precision, **int8)


def load_and_validate(version_dir: Path, config: ModelConfig, *, loader: Loader,
                      device: str, where: str, memory_cap_bytes: int | None = None) -> Validated:
    """Load ``version_dir``'s files, complete `config`, compile the plans it serves with and
    run one synthetic batch of 1 row.

    Inputs missing from `config` come from the graph, with -1 for every dimension it leaves
    open; the test run takes a small sample shape that shape inference accepts (see
    `engine.serving.probe`), and is skipped, and said to be, when there is none. With
    ``memory_cap_bytes``, a model whose parameters plus activations at ``max_batch_size``
    would need more is refused from shape inference alone, before anything is compiled. The
    compile step (`compile_at_load`) then compiles, by name and timed, the plans of the test
    run, of each batch bucket (on the CPU without buckets or warm-up samples, of the batch
    sizes `compile_sizes` names) and of ``max_batch_size`` (the memory measured later), so
    the runs after it and the measurement compile nothing. The config's ``model_warmup``
    samples run last (`warm_up`): a version is served only after them. What ran is recorded
    in a `Checks` (see `checks_of`).

    Raises:
        InvalidModel: any failure; the message starts with `where` and names the cause.
    """
    # The precision only where the config asks for one: loaders written for fp32 need not
    # take it. An int8 model loads in fp32 first: its calibration may need the sample shapes.
    options = {} if config.precision in ("fp32", "int8") else {"precision": config.precision}
    try:
        model = loader(version_dir / SYMBOL_NAME, version_dir / PARAMS_NAME, device=device,
                       **options)
    except ServingError:
        raise
    except (EngineError, ValueError, TypeError, OSError) as error:
        raise InvalidModel(f"{where}: cannot load the model: {error}") from error
    inputs = complete_inputs(config.inputs, model, where)
    found = probe_config(model, config, as_graph(inputs))
    inputs = settled(inputs, found)
    graph_inputs = as_graph(inputs)
    sample = found.sample
    calibrated = None
    if config.precision == "int8":
        model, calibrated = load_int8(loader, version_dir, config, inputs, sample,
                                      device=device, where=where)
    config, unbatched = _limit_batch(config, model, found, where)
    output_axes = outputs_batch_axes(config, model.output_names, found)
    buckets = _buckets(config, model, inputs, output_axes, where)
    if hasattr(model, "batch_buckets"):  # before the compile step, which pads to them
        model.batch_buckets = buckets
    if hasattr(model, "batch_axes"):  # before any plan runs: what `keep_batch` checks
        model.batch_axes = None if config.max_batch_size == 0 else {
            **{tensor.graph_name: tensor.axis for tensor in inputs}, **output_axes}
    if hasattr(model, "concurrent_runs"):
        model.concurrent_runs = concurrent_batches(model, config.instances)
    memory, memory_skipped = _memory_check(model, graph_inputs, config.max_batch_size,
                                           memory_cap_bytes, where, sample)
    names = {tensor.graph_name: tensor.name for tensor in inputs}
    sizes = () if on_gpu(model) else compile_sizes(config.max_batch_size, buckets,
                                                    config.model_warmup)
    try:
        compiled = compile_at_load(model, graph_inputs, sample, buckets, config.max_batch_size,
                                   where, names, sizes)
        outputs = None if sample is None else synthetic_run(model, graph_inputs, sample, where)
    except TestRunFailed as failure:
        # The model loads: serve it without the run, and say why in its checks.
        sample, outputs = None, None
        found = replace(found, skipped=f"{str(failure).removeprefix(where + ': ')}; give the "
                        "inputs' shapes in config.json to have it run at others")
        compiled = compile_at_load(model, graph_inputs, None, buckets, config.max_batch_size,
                                   where, names)
    if sample is not None and buckets:
        warm_buckets(model, graph_inputs, sample, buckets, where)
    precision = check_precision(model, config, graph_inputs, sample, where, calibrated)
    # Last: the samples run the plans as a client's first requests would, READY only after.
    warmed = warm_up(model, config.model_warmup, inputs, sample, config.max_batch_size,
                     version_dir, where)
    batched = config.max_batch_size > 0
    exact = all(dim > 0 for tensor in inputs for axis, dim in enumerate(tensor.shape)
                if axis != tensor.axis or not batched)
    outputs_config = complete_outputs(config.outputs, model, outputs, where, exact,
                                      None if config.max_batch_size == 0 else output_axes,
                                      graph_inputs)
    outputs_config, postprocess = check_postprocess(inputs, outputs_config, outputs, where)
    labels = read_labels(version_dir, outputs_config, where)
    preprocess = check_preprocess(model, inputs, sample, where, version_dir)
    full = ModelConfig.model_validate({**config.model_dump(), "inputs": inputs,
                                       "outputs": outputs_config, "batch_buckets": buckets})
    checks = Checks.of(inputs, sample, memory, memory_skipped, config.max_batch_size > 0)
    _CHECKS[model] = replace(checks, skipped=found.skipped or checks.skipped,
                             preprocess=preprocess, postprocess=postprocess, compile=compiled,
                             precision=precision, warmup=warmed,
                             **batch_record(full, unbatched))
    if labels:
        _LABELS[model] = labels
    return Validated(model, full)


def _buckets(config: ModelConfig, model: ServableModel, inputs: Sequence[TensorConfig],
             output_axes: Mapping[str, int], where: str) -> tuple[int, ...] | None:
    """The batch buckets: the config's, else the default; none without batching or where a
    batch axis is not the first (buckets pad inputs and cut outputs along axis 0)."""
    later = {**{tensor.name: tensor.axis for tensor in inputs if tensor.axis},
             **{name: axis for name, axis in output_axes.items() if axis}}
    if config.max_batch_size == 0 or later:
        if config.batch_buckets and later:
            name, axis = next(iter(later.items()))
            raise InvalidModel(f"{where}: batch_buckets pad the batch along axis 0, but "
                               f"{name!r} has its batch at axis {axis}; leave batch_buckets out")
        return None
    return config.batch_buckets or default_batch_buckets(config.max_batch_size, model)


def on_gpu(model: Any) -> bool:
    """Whether ``model`` runs on a GPU."""
    return bool(getattr(getattr(model, "backend", None), "is_gpu", False))


def concurrent_batches(model: Any, instances: int | None = None) -> int:
    """Batches a model runs at once, each in a copy of its plan: its config's
    ``instance_group`` count where it gives one, else 2 on a GPU, where one batch's host copies
    and the next batch's requests arriving overlap the other's kernels, and 1 on the CPU,
    where one batch already uses every core and two at once each on half of them measured no
    faster (docs/benchmarks.md, "Instances")."""
    if instances is not None:
        return instances
    return 2 if on_gpu(model) else 1


def warm_buckets(model: ServableModel, inputs: Sequence[TensorConfig],
                 sample: Mapping[str, tuple[int, ...]], buckets: Sequence[int],
                 where: str) -> None:
    """Run the plans of every batch bucket (and their spares) now, at load, rather than on
    the first requests of each size: on a GPU the warm-up runs and the CUDA graph capture,
    which with cuDNN's graphs take hundreds of ms each for ResNet-50. The compile step
    (`compile_at_load`) compiled them before; a model without one compiles them here."""
    warm = getattr(model, "warm", None)
    for rows in buckets:
        shapes = with_rows(inputs, sample, rows)
        if warm is None:
            synthetic_run(model, inputs, shapes, where)
            continue
        arrays = {tensor.name: np.zeros(shapes[tensor.name], tensor.dtype) for tensor in inputs}
        try:
            warm(arrays)
        except Exception as error:  # noqa: BLE001 - like the test run: refuse the model
            raise InvalidModel(f"{where}: warming the plans for batch {rows} failed: "
                               f"{error}") from error


def default_batch_buckets(max_batch_size: int, model: Any) -> tuple[int, ...] | None:
    """Powers of two up to ``max_batch_size`` (and it) for a model on a GPU, None elsewhere."""
    if not on_gpu(model):
        return None
    sizes = {1 << k for k in range(max_batch_size.bit_length()) if 1 << k <= max_batch_size}
    return tuple(sorted(sizes | {max_batch_size}))


def _rows_placed(model: ServableModel) -> str | None:
    """Why a row's result depends on where it sits along axis 0 (an op assigning rows 1:2,
    say), so that rows of different requests joined into one batch would mix; None when no
    node reading the inputs does."""
    graph = getattr(model, "graph", None)
    if graph is None:
        return None
    dependent = input_dependent(graph, set(getattr(model, "input_names", ())))
    for index, node in enumerate(graph.nodes):
        if dependent[index] and not node.is_variable:
            if positions := node.opdef.reads_batch_positions(node.params):
                return f"{node.describe()} {positions}"
    return None


def _limit_batch(config: ModelConfig, model: ServableModel, found: Probe,
                 where: str) -> tuple[ModelConfig, str | None]:
    """`config` with ``max_batch_size`` 1 for a graph that takes one row only, or whose output
    shapes depend on the data (`Model.data_dependent`: a mask or unique over the batch would
    mix the rows of different requests), and 0 where no batch axis can hold (the inputs and
    outputs share none, or an output's row count is the data's); a config that asks for more
    is refused. With it, why the model takes no batch (None: it takes one)."""
    sample = found.sample
    data_dependent = getattr(model, "data_dependent", None)
    if config.max_batch_size == 0:
        return config, "config.json sets max_batch_size 0"
    unbatched = None
    if sample is not None and found.output_axes is None and data_dependent is None:
        unbatched = (f"the inputs and outputs share no batch axis (at 2 and 3 rows, shape "
                     f"inference found none that every output follows from the sample "
                     f"{dict(sample)})")
    elif data_dependent is not None:
        unbatched = _data_sized_rows(model, sample, data_dependent)
    elif all(tensor.batch_axis in (None, 0) for tensor in found.inputs):
        unbatched = _rows_placed(model)
    if unbatched is not None:
        given = "max_batch_size" in config.model_fields_set
        if given or config.dynamic_batching.preferred_batch_sizes:
            raise InvalidModel(f"{where}: {unbatched}, so config.json must not ask for "
                               f"max_batch_size {config.max_batch_size}; set max_batch_size 0 "
                               "to serve whole shapes, or give batch_axis for each input and "
                               "output")
        return (config.model_copy(update={"max_batch_size": 0, "batch_buckets": None}),
                f"{unbatched}, so requests run one at a time with whole shapes "
                "(max_batch_size 0)")
    if data_dependent is None and (sample is None or found.batches):
        return config, None
    if data_dependent is not None:
        why = (f"its output shapes depend on the data ({data_dependent}), so rows of different "
               "requests must not share a batch")
    else:
        why = (f"the graph takes one row per request only (it refuses 2 rows of {dict(sample)}; "
               "e.g. GluonCV's Faster R-CNN fixes its batch)")
    given = "max_batch_size" in config.model_fields_set and config.max_batch_size > 1
    if given or config.dynamic_batching.preferred_batch_sizes not in ((), (1,)):
        raise InvalidModel(f"{where}: {why}, so config.json must not ask for max_batch_size "
                           f"{config.max_batch_size} or preferred_batch_sizes "
                           f"{list(config.dynamic_batching.preferred_batch_sizes)}")
    return config.model_copy(update={"max_batch_size": 1}), None


def _data_sized_rows(model: ServableModel, sample: Mapping[str, tuple[int, ...]] | None,
                     data_dependent: str) -> str | None:
    """Why a graph's output has no row per input row (its row count is set by the data: a
    bare ``nonzero``), or None: a server answering each request by rows cannot serve it so."""
    check = getattr(model, "output_shapes", None)
    if sample is None or check is None:
        return None
    shapes = check(sample)
    unsized = [name for name, shape in shapes.items() if shape and not shape[0]]
    if not unsized:
        return None
    return f"output {unsized[0]!r} has a row count set by the data ({data_dependent})"


def as_graph(tensors: Sequence[TensorConfig]) -> tuple[TensorConfig, ...]:
    """`tensors` under their graph names, for what talks to the model itself."""
    return tuple(tensor if tensor.source is None
                 else tensor.model_copy(update={"name": tensor.source, "source": None})
                 for tensor in tensors)


def _memory_check(model: ServableModel, inputs: Sequence[TensorConfig], max_batch_size: int,
                  cap: int | None, where: str, sample: Mapping[str, tuple[int, ...]] | None
                  ) -> tuple[int | None, str | None]:
    """`check_memory` where it can run: (estimated bytes, None) or (None, why not)."""
    if cap is None:
        return None, "no memory budget is set"
    if sample is None:
        return None, "no input shape known to fit the graph to estimate at"
    needed = check_memory(model, inputs, max_batch_size, cap, where, sample)
    return needed, None if needed is not None else "the model cannot estimate it"


def synthetic_run(model: ServableModel, inputs: Sequence[TensorConfig],
                  sample: Mapping[str, tuple[int, ...]], where: str) -> dict[str, np.ndarray]:
    """Outputs of the model on zeros of the `sample` shapes (its plan compiled already by the
    compile step, where the model has one).

    Raises:
        TestRunFailed: the engine failed (a shape, a kernel); the load goes on without the run.
        InvalidModel: anything else failed (memory, a bug), which refuses the model.
    """
    arrays = {tensor.name: np.zeros(sample[tensor.name], tensor.dtype) for tensor in inputs}
    try:
        return model.infer(arrays)
    except Exception as error:  # noqa: BLE001 - any failure of the test run refuses the model
        given = ", ".join(f"{name} {array.shape} {array.dtype}" for name, array in arrays.items())
        kind = TestRunFailed if isinstance(error, EngineError) else InvalidModel
        raise kind(f"{where}: test inference on synthetic input ({given}) failed: "
                   f"{error}") from error


def check_memory(model: ServableModel, inputs: Sequence[TensorConfig], max_batch_size: int,
                 cap: int, where: str,
                 sample: Mapping[str, tuple[int, ...]] | None = None) -> int | None:
    """Refuse a model whose estimated memory at ``max_batch_size`` is over ``cap`` bytes.

    Variable dimensions take their size in `sample` (else 1); ``max_batch_size`` 0 estimates
    the whole shapes. Returns the estimate, or None when the model cannot estimate.
    """
    estimate = getattr(model, "estimate_activation_bytes", None)
    if estimate is None:
        return None
    shapes = with_rows(inputs, sample_or_ones(inputs, sample), max_batch_size or None)
    try:
        needed = model.param_bytes + estimate(shapes)
    except EngineError as error:
        raise InvalidModel(f"{where}: cannot infer shapes at max_batch_size "
                           f"{max_batch_size}: {error}") from error
    if needed > cap:
        raise InvalidModel(f"{where}: the model would need about {needed} bytes of memory "
                           f"(parameters and activations at max_batch_size {max_batch_size}); "
                           f"the memory cap is {cap} bytes")
    return int(needed)


def complete_inputs(given: Sequence[TensorConfig] | None, model: ServableModel,
                    where: str) -> tuple[TensorConfig, ...]:
    """The config's inputs, checked against the model and completed from its input specs
    (datatype and shape an entry leaves out), or inferred from them when the config has none."""
    if given is None:
        return tuple(_infer_input(index, spec, where) for index, spec in enumerate(model.inputs))
    specs = {spec.name: spec for spec in model.inputs}
    check_sources("inputs", given, list(specs), where)
    completed = []
    for index, tensor in enumerate(given):
        spec = specs[tensor.graph_name]
        if tensor.shape is not None:
            _check_known_dims(f"inputs.{index}.shape", tensor.shape, spec, model, where)
        if tensor.datatype is None or tensor.shape is None:
            tensor = _filled(tensor, _infer_input(index, spec, where, tensor.shape))
        completed.append(tensor)
    return tuple(completed)


def check_sources(field: str, given: Sequence[TensorConfig], graph_names: list[str],
                  where: str) -> None:
    """Refuse `given` unless its entries name each of the graph's tensors exactly once."""
    for index, tensor in enumerate(given):
        if tensor.graph_name not in graph_names:
            named = (f"{tensor.name!r}" if tensor.source is None
                     else f"{tensor.name!r} (source {tensor.source!r})")
            raise InvalidModel(f"{where}: {field}.{index} {named} is not one of the model's "
                               f"{field} {graph_names}; to rename one, write "
                               f"{{\"name\": \"{tensor.name}\", \"source\": \"<graph name>\"}}")
    missing = [name for name in graph_names
               if name not in {tensor.graph_name for tensor in given}]
    if missing:
        raise InvalidModel(f"{where}: config {field} {[tensor.name for tensor in given]} leave "
                           f"out the model's {field} {missing}; list every one (an entry of "
                           f"just {{\"name\": \"{missing[0]}\"}} is enough)")


def _filled(tensor: TensorConfig, inferred: TensorConfig) -> TensorConfig:
    """`tensor` with the datatype and shape it leaves out taken from `inferred`."""
    axis = tensor.batch_axis if tensor.batch_axis is not None else inferred.batch_axis
    return tensor.model_copy(update={"datatype": tensor.datatype or inferred.datatype,
                                     "shape": tensor.shape or inferred.shape,
                                     "batch_axis": axis})


def _infer_input(index: int, spec: Spec, where: str,
                 shape: tuple[int, ...] | None = None) -> TensorConfig:
    """An input's config from the graph: its rank, the dimensions it fixes, -1 for the rest
    (requests are then checked there by shape inference, once per signature); `shape`, when
    the config gives it, is kept."""
    if shape is None and (spec.shape is None or len(spec.shape) == 0):
        raise InvalidModel(
            f"{where}: inputs.{index}.shape (input {spec.name!r}) cannot be inferred from the "
            f"graph (shape inference accepts no rank for it); write it in config.json, e.g. "
            f"\"inputs\": [{{\"name\": \"{spec.name}\", \"datatype\": \"FP32\", "
            f"\"shape\": [-1, ...]}}]")
    try:
        datatype = datatype_of(spec.dtype)
    except ValueError as error:
        raise InvalidModel(f"{where}: inputs.{index}.datatype: {error}") from None
    if shape is None:
        assert spec.shape is not None  # checked above
        # -1 where the graph leaves a dimension open; the batch axis is one of them (or axis
        # 0, opened by `probe`), found later.
        shape = tuple(dim if dim > 0 else -1 for dim in spec.shape)
    return TensorConfig(name=spec.name, datatype=datatype, shape=shape)


def complete_outputs(given: Sequence[TensorConfig] | None, model: ServableModel,
                     sample: Mapping[str, np.ndarray] | None, where: str,
                     exact: bool = False, axes: Mapping[str, int] | None = None,
                     inputs: Sequence[TensorConfig] = ()) -> tuple[TensorConfig, ...]:
    """The config's outputs checked against the test run, or inferred from shape inference and
    the test run (`sample`: its outputs, None when it was skipped). `inputs` (graph names):
    the completed inputs, whose shapes shape inference starts from where given.

    With `exact` (every input dimension was known), the test run's dimensions are the
    outputs'; otherwise a dimension shape inference left open may follow the input's, so -1.
    `axes`: each output's batch axis by graph name (absent: 0); None: no batch dimension.
    """
    names = list(model.output_names)
    if sample is not None:
        _check_sample(names, sample, where, axes)
    specs = {spec.name: spec for spec in model.outputs}
    settled = _settled_output_shapes(model, inputs)

    def inferred(index: int, name: str) -> TensorConfig:
        axis = None if axes is None else axes.get(name, 0)
        spec = specs.get(name)
        known = settled.get(name) or (None if spec is None else spec.shape)
        return _infer_output(index, name, None if sample is None else sample[name], known,
                             None if spec is None else spec.dtype, exact, where, axis)

    if given is None:
        return tuple(inferred(index, name) for index, name in enumerate(names))
    check_sources("outputs", given, names, where)
    completed = []
    for index, tensor in enumerate(given):
        if sample is not None:
            _check_given_output(index, tensor, np.asarray(sample[tensor.graph_name]), where)
        if tensor.datatype is None or tensor.shape is None:
            tensor = _filled(tensor, inferred(index, tensor.graph_name))
        elif tensor.batch_axis is None and axes and axes.get(tensor.graph_name):
            tensor = tensor.model_copy(update={"batch_axis": axes[tensor.graph_name]})
        completed.append(tensor)
    return tuple(completed)


def _check_sample(names: list[str], sample: Mapping[str, np.ndarray], where: str,
                  axes: Mapping[str, int] | None) -> None:
    if list(sample) != names:
        raise InvalidModel(f"{where}: the test run returned outputs {list(sample)}; the graph "
                           f"names {names}")
    if axes is None:
        return
    for name, array in sample.items():
        axis = axes.get(name, 0)
        if np.ndim(array) <= axis or np.shape(array)[axis] != 1:
            where_batch = "first" if axis == 0 else f"at axis {axis}"
            raise InvalidModel(f"{where}: output {name!r} has shape {np.shape(array)} for a "
                               f"batch of 1 row; outputs must keep the batch dimension "
                               f"{where_batch}")


def _check_given_output(index: int, tensor: TensorConfig, array: np.ndarray,
                        where: str) -> None:
    """The datatype and shape `tensor` gives (either may be left out) against the test run's."""
    if tensor.datatype is not None and datatype_of(array.dtype) != tensor.datatype:
        raise InvalidModel(f"{where}: outputs.{index}.datatype is {tensor.datatype}, but the "
                           f"model returns {datatype_of(array.dtype)}")
    if tensor.shape is not None and (len(tensor.shape) != array.ndim or any(
            dim not in (-1, got) for dim, got in zip(tensor.shape, array.shape))):
        raise InvalidModel(f"{where}: outputs.{index}.shape {list(tensor.shape)} does not fit "
                           f"the test run's output shape {list(array.shape)}")


def _settled_output_shapes(model: ServableModel, inputs: Sequence[TensorConfig]
                           ) -> dict[str, tuple[int, ...]]:
    """Output shapes (0: open) from shape inference over the completed inputs, whose ranks the
    probe may have settled above the smallest the graph accepts ({}: none to ask)."""
    check = getattr(model, "output_shapes", None)
    if check is None or not inputs:
        return {}
    try:
        shapes = check({tensor.name: tuple(max(dim, 0) for dim in tensor.shape)
                        for tensor in inputs})
    except EngineError:
        return {}
    return {name: shape for name, shape in shapes.items() if shape}


def _infer_output(index: int, name: str, array: np.ndarray | None,
                  known: tuple[int, ...] | None, dtype: np.dtype | None, exact: bool,
                  where: str, axis: int | None = 0) -> TensorConfig:
    if array is not None:
        array = np.asarray(array)
        if exact or known is None or len(known) != array.ndim:
            known = array.shape if exact else (-1,) * array.ndim
    if not known:
        raise InvalidModel(f"{where}: outputs.{index}.shape (output {name!r}) cannot be "
                           "inferred: shape inference leaves its rank open and there was no "
                           "test run; write the outputs in config.json")
    dtype = array.dtype if array is not None else (dtype or np.dtype(np.float32))
    try:
        datatype = datatype_of(dtype)
    except ValueError as error:
        raise InvalidModel(f"{where}: output {name!r}: {error}") from None
    if axis is not None and axis >= len(known):
        raise InvalidModel(f"{where}: outputs.{index} (output {name!r}) has shape "
                           f"{list(known)}, without a dimension {axis} for the batch")
    return TensorConfig(name=name, datatype=datatype, batch_axis=axis or None, shape=tuple(
        -1 if dim <= 0 or position == axis else dim for position, dim in enumerate(known)))


def _check_known_dims(field: str, shape: tuple[int, ...], spec: Spec, model: ServableModel,
                      where: str) -> None:
    if spec.shape is None:
        return
    if len(spec.shape) != len(shape):
        # The spec's rank may only be the smallest the graph accepts (nothing in an exported
        # graph names the rank of a plain data variable): ask shape inference about this one.
        accepts = getattr(model, "output_shapes", None)
        try:
            if accepts is not None:
                accepts({spec.name: tuple(max(dim, 0) for dim in shape)})  # 0: unknown
                return
            problem = ""
        except EngineError as error:
            problem = f" ({error})"
        raise InvalidModel(f"{where}: {field} {list(shape)} has {len(shape)} dimensions; the "
                           f"graph gives input {spec.name!r} {len(spec.shape)}: "
                           f"{list(spec.shape)}{problem}")
    for axis, (dim, known) in enumerate(zip(shape, spec.shape)):
        if dim > 0 and known > 0 and dim != known:
            raise InvalidModel(f"{where}: {field} {list(shape)} has {dim} at dimension {axis}; "
                               f"the graph gives input {spec.name!r} {list(spec.shape)}")


def input_shapes(inputs: Sequence[TensorConfig], rows: int,
                 model: object | None = None) -> dict[str, tuple[int, ...]]:
    """Input shapes with `rows` rows (at each batch axis; 0: no batch, ``max_batch_size`` 0)
    for memory estimates, by graph name: variable dimensions take the size the upload's test
    run used for `model` (see `Checks.sample`), else 1."""
    checks = None if model is None else checks_of(model)
    sample = None if checks is None or checks.sample is None else {
        tensor.graph_name: checks.sample[tensor.name] for tensor in inputs}
    graph_inputs = as_graph(inputs)
    return with_rows(graph_inputs, sample_or_ones(graph_inputs, sample), rows or None)
