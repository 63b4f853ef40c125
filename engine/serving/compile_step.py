"""The compile step of a load: the plans a version serves with, compiled once, named and timed.

`load_and_validate` calls `compile_at_load` before the test inference. It compiles the plan of
the test run's sample, the plan of every batch bucket (with its spare where the model runs two
batches at once, a GPU), the plans of the batch sizes a CPU load compiles where it has no
buckets (`engine.serving.warmup.compile_sizes`) and the plan of ``max_batch_size`` rows that
the repository measures the version's memory with (`LoadedVersion.memory`). The test run, the
buckets' warm-up runs (`warm_buckets`: on a GPU they capture CUDA graphs) and the measurement
then find their plans compiled. What was compiled, for what and in how long is logged and kept
in the version's `Checks` (``compile``, `compile_record`).

Models without a ``compile`` method (a fake) skip the step: their plans, if any, compile when
first run, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from engine.errors import EngineError
from engine.runtime.compile import CompileFailed
from engine.serving.config import TensorConfig
from engine.serving.errors import InvalidModel, TestRunFailed
from engine.serving.probe import sample_or_ones, with_rows

log = logging.getLogger(__name__)

TEST_RUN = "test inference"  # the purpose of the sample's plan


def compile_at_load(model: Any, inputs: Sequence[TensorConfig],
                    sample: Mapping[str, tuple[int, ...]] | None,
                    buckets: Sequence[int] | None, max_batch_size: int, where: str,
                    names: Mapping[str, str] | None = None,
                    sizes: Sequence[int] = ()) -> dict[str, Any] | None:
    """Compile the plans a load needs (`load_targets`) with ``model.compile``; the record of
    what it compiled for `Checks` (None: the model has no compile step).

    ``inputs`` are under their graph names (as `sample`); ``names`` maps graph names to the
    names clients use, for the record; ``sizes``: batch sizes (not buckets) whose plans a
    call of that many rows runs are compiled too.

    Raises:
        InvalidModel: a plan did not compile; the message names what it was for (the test
            inference, as its own failure would; ``batch bucket N``; ``max_batch_size N``).
    """
    compile_plans = getattr(model, "compile", None)
    if compile_plans is None:
        return None
    try:
        report = compile_plans(load_targets(inputs, sample, buckets, max_batch_size, sizes))
    except CompileFailed as failure:
        if failure.target.purpose == TEST_RUN and sample is not None:
            kind = TestRunFailed if isinstance(failure.error, EngineError) else InvalidModel
            raise kind(f"{where}: test inference on synthetic input "
                       f"({_given(inputs, sample)}) failed: {failure.error}") from failure
        raise InvalidModel(f"{where}: {failure}") from failure
    log.info("%s: %s", where, report.summary())
    return compile_record(report, names or {})


def load_targets(inputs: Sequence[TensorConfig], sample: Mapping[str, tuple[int, ...]] | None,
                 buckets: Sequence[int] | None, max_batch_size: int,
                 sizes: Sequence[int] = ()) -> list[Any]:
    """The `CompileTarget`s of a load, in the order a load used to compile them as it ran: the
    test inference's sample (as the test run calls it), each batch bucket at the sample's
    other dimensions (as a batch of that size calls it, with the spare), each of ``sizes``
    likewise (as a batch of exactly that size calls it, cut into runs of rows), and exactly the
    shapes at ``max_batch_size`` that memory is measured at (skipped when the model does not
    take them, as measuring then finds no plan)."""
    from engine.runtime.compile import CompileTarget

    dtypes = {tensor.name: tensor.dtype for tensor in inputs}
    targets = []
    if sample is not None:
        targets.append(CompileTarget(TEST_RUN, dict(sample), dtypes))
        for rows in buckets or ():
            shapes = with_rows(inputs, sample, rows)
            targets.append(CompileTarget(f"batch bucket {rows}", shapes, dtypes, spare=True))
        for rows in sizes:
            shapes = with_rows(inputs, sample, rows)
            targets.append(CompileTarget(f"batch {rows}", shapes, dtypes))
    largest = with_rows(inputs, sample_or_ones(inputs, sample), max_batch_size or None)
    targets.append(CompileTarget(f"max_batch_size {max_batch_size}", largest, as_called=False,
                                 required=False))
    return targets


def compile_record(report: Any, names: Mapping[str, str]) -> dict[str, Any]:
    """`CompileReport.as_dict` with inputs under the names clients use (``names``: graph name
    to client name; others kept)."""
    record = report.as_dict()
    for plan in record["plans"]:
        for key in ("inputs", "dtypes"):
            plan[key] = {names.get(name, name): value for name, value in plan[key].items()}
    return record


def _given(inputs: Sequence[TensorConfig], shapes: Mapping[str, tuple[int, ...]]) -> str:
    """The synthetic inputs as the test run's failure names them."""
    return ", ".join(f"{tensor.name} {tuple(shapes[tensor.name])} {tensor.dtype}"
                     for tensor in inputs)
