"""A model version's config in the form of Triton's model configuration (``model_config.proto``).

Triton's clients and tools ask for it before their first request: perf_analyzer reads the batch
size and the tensors from it, model analyzer the batching and instances. REST answers it as JSON
(``GET /v2/models/{name}/config``) and gRPC as the ``ModelConfig`` message, both from here. The
tensors are those model metadata shows (`metadata.tensors`: what clients send and receive), so
the two answers never disagree.
"""

from __future__ import annotations

from engine.serving.config import (
    DynamicBatchingConfig,
    LatestVersions,
    QueuePolicyConfig,
    VersionPolicy,
)
from engine.serving.loaded import LoadedVersion
from engine.serving.repository import ModelRepository
from engine.serving.sequence_config import DirectStrategy
from service.dataplane import metadata, types
from service.tensors.datatypes import BYTES


def model_config(repository: ModelRepository, name: str,
                 version: str | None) -> types.TritonModelConfig:
    """The configuration of a ready version (the newest when `version` is None or empty)."""
    handle = repository.get(name, version or None)
    config = handle.config
    batching = config.dynamic_batching
    labels = {spec.name: spec.labels for spec in config.outputs or () if spec.labels}
    # Where each tensor's batch lies (Triton's dims leave it out); None: no batch dimension.
    axes = ({spec.name: spec.axis for spec in (*(config.inputs or ()), *(config.outputs or ()))}
            if config.max_batch_size else None)
    return types.TritonModelConfig(
        name=handle.name, platform=metadata.PLATFORM,
        version_policy=_version_policy(config.version_policy),
        max_batch_size=config.max_batch_size,
        input=[_tensor(tensor, axes) for tensor in metadata.tensors(handle.served_inputs)],
        output=[_tensor(tensor, axes, labels.get(tensor.name))
                for tensor in metadata.tensors(handle.served_outputs)],
        dynamic_batching=None if config.sequence_batching else types.TritonDynamicBatching(
            preferred_batch_size=list(batching.preferred_batch_sizes),
            max_queue_delay_microseconds=batching.max_queue_delay_us,
            priority_levels=batching.priority_levels,
            default_priority_level=batching.default_priority_level,
            default_queue_policy=_default_queue_policy(batching),
            priority_queue_policy={
                level: _queue_policy(policy)
                for level, policy in sorted(batching.priority_queue_policy.items())} or None),
        sequence_batching=_sequences(handle),
        instance_group=[_instances(handle)],
        model_warmup=_warmup(handle) or None)


def _warmup(handle: LoadedVersion) -> list[types.TritonModelWarmup]:
    """``model_warmup`` with what the load filled in written out: every input of each sample,
    its type, its dims (the input's, without the batch dimension, where the sample gives
    none; -1 where the load took them from the test inference) and zeros where it named no
    data."""
    config = handle.config
    batched = config.max_batch_size > 0
    samples = []
    for sample in config.model_warmup:
        inputs = {}
        for tensor in handle.served_inputs:
            entry = sample.inputs.get(tensor.name)
            assert tensor.shape is not None and tensor.datatype is not None  # completed
            dims = (list(entry.dims) if entry is not None and entry.dims is not None else
                    [dim for axis, dim in enumerate(tensor.shape)
                     if not batched or axis != tensor.axis])
            data: dict[str, bool | str] = {"zero_data": True}
            if entry is not None and entry.input_data_file is not None:
                data = {"input_data_file": entry.input_data_file}
            elif entry is not None and entry.random_data:
                data = {"random_data": True}
            inputs[tensor.name] = types.TritonWarmupInput(
                data_type=data_type(tensor.datatype), dims=dims, **data)
        samples.append(types.TritonModelWarmup(name=sample.name, batch_size=sample.batch_size,
                                               inputs=inputs, count=sample.count))
    return samples


def _default_queue_policy(batching: DynamicBatchingConfig) -> types.TritonQueuePolicy:
    """The policy of the levels without their own: the config's, else (a model without queue
    policies) its deadline as a timeout a request's own "timeout" parameter shortens."""
    if batching.has_queue_policy:
        return _queue_policy(batching.queue_policy(0))
    return types.TritonQueuePolicy(default_timeout_microseconds=batching.timeout_us or 0,
                                   allow_timeout_override=True,
                                   max_queue_size=batching.max_queue_size)


def _queue_policy(policy: QueuePolicyConfig) -> types.TritonQueuePolicy:
    return types.TritonQueuePolicy(
        timeout_action=policy.timeout_action,
        default_timeout_microseconds=policy.default_timeout_microseconds,
        allow_timeout_override=policy.allow_timeout_override,
        max_queue_size=policy.max_queue_size)


def _sequences(handle: LoadedVersion) -> types.TritonSequenceBatching | None:
    """``sequence_batching`` with its defaults written out: the strategy (direct when none
    is given) and each state's type and dims."""
    config, scheduler = handle.config.sequence_batching, handle.sequences
    if config is None or scheduler is None:
        return None
    inputs = {tensor.name: tensor for tensor in handle.config.inputs or ()}
    batched = handle.config.max_batch_size > 0
    states = []
    for spec in scheduler.states:
        axis = inputs[spec.input_name].axis if batched else None
        states.append(types.TritonSequenceState(
            input_name=spec.input_name, output_name=spec.output_name,
            data_type=data_type(inputs[spec.input_name].datatype or ""),
            dims=[dim for index, dim in enumerate(spec.shape) if index != axis],
            initial_state=[types.TritonInitialState()]))
    oldest = config.oldest
    direct = config.direct or (None if oldest else DirectStrategy())
    return types.TritonSequenceBatching(
        max_sequence_idle_microseconds=config.max_sequence_idle_microseconds,
        direct=None if direct is None else types.TritonStrategyDirect(
            max_queue_delay_microseconds=direct.max_queue_delay_microseconds,
            minimum_slot_utilization=direct.minimum_slot_utilization),
        oldest=None if oldest is None else types.TritonStrategyOldest(
            max_candidate_sequences=scheduler.limit,
            preferred_batch_size=list(config.preferred_batch_sizes(handle.config.max_batch_size)),
            max_queue_delay_microseconds=oldest.max_queue_delay_microseconds),
        state=states)


def data_type(datatype: str) -> str:
    """Triton's configuration name of a V2 datatype: ``FP32`` is ``TYPE_FP32``, ``BYTES`` is
    ``TYPE_STRING``."""
    return "TYPE_STRING" if datatype == BYTES else f"TYPE_{datatype}"


def _tensor(tensor: types.TensorMetadata, axes: dict[str, int] | None,
            labels: str | None = None) -> types.TritonTensor:
    """Triton's `dims` leave the batch dimension out: the first for most models, the one at a
    tensor's batch axis for others (a time-major model's second), none with max_batch_size 0
    (whole shapes). A tensor of the batch dimension alone (one image a row) is Triton's
    ``dims: [1]`` with an empty reshape."""
    if axes is None:
        dims = list(tensor.shape)
    else:
        axis = axes.get(tensor.name, 0)  # a postprocess's extra tensors keep the batch first
        dims = tensor.shape[:axis] + tensor.shape[axis + 1:]
    return types.TritonTensor(name=tensor.name, data_type=data_type(tensor.datatype),
                              dims=dims or [1],
                              reshape=None if dims else types.TritonReshape(shape=[]),
                              label_filename=labels)


def _version_policy(policy: VersionPolicy) -> dict[str, dict[str, object]]:
    """The policy with its default written out (no choice: the newest version)."""
    if policy.latest is None and policy.all is None and policy.specific is None:
        policy = VersionPolicy(latest=LatestVersions())
    return policy.model_dump(mode="json", exclude_none=True)


def _instances(handle: LoadedVersion) -> types.TritonInstanceGroup:
    """One group: the device the version runs on, and how many of its batches run at once."""
    gpu = getattr(handle.model, "device", "cpu") == "gpu"
    return types.TritonInstanceGroup(name=handle.name, kind="KIND_GPU" if gpu else "KIND_CPU",
                                     count=handle.batcher.policy.max_concurrent_batches)
