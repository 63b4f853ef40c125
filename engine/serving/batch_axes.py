"""Where the batch lies in a model's tensors, as a load settles it from the config and `probe`.

`engine.serving.validate` asks `probe_config` (the config's stated axes and ranks kept, the
rest found from the graph), completes the inputs with `settled`, and the outputs with
`outputs_batch_axes`; `batch_record` is what the upload's checks say about it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.serving.config import ModelConfig, TensorConfig
from engine.serving.probe import Probe, probe


def probe_config(model: Any, config: ModelConfig, inputs: Sequence[TensorConfig]) -> Probe:
    """`probe` for the completed `inputs` (under their graph names): ranks the config does not
    give may grow, batch axes it gives are kept, and none is looked for with
    ``max_batch_size`` 0."""
    given = {tensor.graph_name for tensor in config.inputs or () if tensor.shape is not None}
    flexible = frozenset(tensor.name for tensor in inputs) - given
    output_axes = {tensor.graph_name: tensor.batch_axis for tensor in config.outputs or ()
                   if tensor.batch_axis is not None}
    return probe(model, inputs, batching=config.max_batch_size != 0, flexible=flexible,
                 output_axes=output_axes)


def settled(inputs: Sequence[TensorConfig], found: Probe) -> tuple[TensorConfig, ...]:
    """`inputs` (clients' names) with the shapes and batch axes `probe` settled."""
    probed = {tensor.name: tensor for tensor in found.inputs}
    return tuple(tensor.model_copy(update={
        "shape": probed[tensor.graph_name].shape,
        "batch_axis": probed[tensor.graph_name].batch_axis or None})  # 0 goes unsaid
        for tensor in inputs)


def outputs_batch_axes(config: ModelConfig, output_names: Sequence[str], found: Probe
                       ) -> dict[str, int]:
    """Each output's batch axis by graph name: the config's, else the probe's, else 0."""
    given = {tensor.graph_name: tensor.batch_axis for tensor in config.outputs or ()
             if tensor.batch_axis is not None}
    probed = found.output_axes or {}
    return {name: given.get(name, probed.get(name, 0)) for name in output_names}


def batch_record(config: ModelConfig, unbatched: str | None) -> dict[str, Any]:
    """The `Checks` fields saying where the batch lies, or why there is none (`unbatched`)."""
    if config.max_batch_size > 0:
        return {"batch_axes": {
            "inputs": {tensor.name: tensor.axis for tensor in config.inputs or ()},
            "outputs": {tensor.name: tensor.axis for tensor in config.outputs or ()}}}
    return {"unbatched": unbatched}
