"""What the data plane answers: server and model metadata, repository rows and details.

Pydantic models, so that REST returns them as they are (they are part of its OpenAPI document,
beside the HTTP bodies of `service.rest.schemas`) and gRPC copies them into its messages.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class ServerMetadata(BaseModel):
    """``GET /v2``."""

    name: str
    version: str
    extensions: list[str]


class TensorMetadata(BaseModel):
    """A model input or output: name, V2 datatype, shape (-1: any size)."""

    name: str
    datatype: str
    shape: list[int]


class ModelMetadata(BaseModel):
    """``GET /v2/models/{name}[/versions/{v}]``."""

    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class ModelReady(BaseModel):
    """``GET /v2/models/{name}[/versions/{v}]/ready`` (not ready: 400, as Triton answers)."""

    name: str
    ready: bool


class VersionStatus(BaseModel):
    """A version's state: READY, LOADING, UNLOADING or UNAVAILABLE (with the reason)."""

    name: str
    version: str
    state: str
    reason: str = ""


class VersionInfo(BaseModel):
    """A model version in the management API."""

    version: int
    state: str
    reason: str = ""


class ModelSummary(BaseModel):
    """An entry of ``GET /models``."""

    name: str
    versions: list[VersionInfo]


class CheckRan(BaseModel):
    """One validation check: whether it ran, and why not when it did not."""

    ran: bool
    reason: str | None = None


class ShapeInferenceCheck(CheckRan):
    """Shape inference over the graph; the input axes it left open (checked per request)."""

    variable_dims: dict[str, list[int]] = Field(default_factory=dict)


class BatchAxesCheck(BaseModel):
    """Where the batch lies in each input and output (found from the graph on load or given
    in config.json), or why the model takes no batch (max_batch_size 0)."""

    batched: bool
    inputs: dict[str, int] = Field(default_factory=dict)
    outputs: dict[str, int] = Field(default_factory=dict)
    reason: str | None = None


class TestInferenceCheck(CheckRan):
    """One synthetic run of the model; the input shapes it ran at."""

    inputs: dict[str, list[int]] | None = None


class MemoryCheck(CheckRan):
    """The memory estimate at max_batch_size against the server's budget."""

    estimated_bytes: int | None = None


class CompiledPlan(BaseModel):
    """One plan the load compiled: what it is for, its inputs, its batch bucket, how many
    copies were compiled, how long that took and the bytes it holds."""

    purposes: list[str] = Field(description="what needs it: the test inference, a batch "
                                "bucket, the max_batch_size memory measurement")
    inputs: dict[str, list[int]]
    dtypes: dict[str, str]
    bucket: int | None = None
    copies: int = Field(description="copies compiled now (a spare for a second batch "
                        "included); 0 where another target compiled them")
    seconds: float
    planned_bytes: int
    workspace_bytes: int


class SkippedTarget(BaseModel):
    """A plan the load did not compile, and why."""

    purpose: str
    reason: str


class CompileCheck(CheckRan):
    """The load's compile step: every plan compiled before the first request, and its time."""

    seconds: float | None = None
    plans: list[CompiledPlan] = Field(default_factory=list)
    skipped: list[SkippedTarget] = Field(default_factory=list)


class WarmupRun(BaseModel):
    """One ``model_warmup`` sample the load ran."""

    name: str
    batch_size: int
    runs: int
    seconds: float


class WarmupCheck(CheckRan):
    """The config's warm-up samples, each run before the version was READY."""

    samples: list[WarmupRun] = Field(default_factory=list)


class PreprocessCheck(CheckRan):
    """The inputs' preprocess pipelines: checked against the graph, dry-run on a synthetic image
    (row shapes by input), and warnings (e.g. a graph that already normalises its input)."""

    inputs: dict[str, list[int]] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)


class PostprocessCheck(CheckRan):
    """The outputs' postprocesses: checked against the graph and run on the test inference's
    outputs (each output's kind, by name)."""

    outputs: dict[str, str] = Field(default_factory=dict)


class CalibrationRecord(BaseModel):
    """What calibrated an int8 model's ranges: the uploaded calibration.npz or random sample
    rows, how many rows, and the calibration mode."""

    source: str
    rows: int
    mode: str
    num_bins: int


class PrecisionOutput(BaseModel):
    """One output of a reduced-precision model against float32."""

    relative_error: float
    top1_agreement: float | None = None
    judged_by: str = Field(description="top1_agreement (a classifier's output) or "
                           "relative_error")


class PrecisionCheck(CheckRan):
    """A reduced-precision model (bf16, int8) against the float32 reference at load: the
    precision asked for and running, each output's drift, the thresholds it passed, and for
    int8 what calibrated it."""

    asked: str
    running: str
    calibration: CalibrationRecord | None = None
    weights: str | None = Field(None, description="int8: how the weights were quantized "
                                "(within ±127, or ±63 in the convolutions where the host's "
                                "int8 GEMM runs 7-bit weights faster: AVX2 without VNNI)")
    samples: int | None = None
    inputs: str | None = Field(None, description="what the check ran on: random rows, or "
                               "the uploaded calibration inputs")
    outputs: dict[str, PrecisionOutput] = Field(default_factory=dict)
    thresholds: dict[str, float] | None = None


class ValidationChecks(BaseModel):
    """What was checked when the version was loaded (loading fails at the first failed check)."""

    parsed: bool = Field(description="the symbol JSON and the params file decoded")
    ops_known: bool = Field(description="every op of the graph is implemented")
    params_match: bool = Field(description="parameters and graph variables match in names "
                               "and shapes")
    shape_inference: ShapeInferenceCheck
    batch_axes: BatchAxesCheck | None = None
    test_inference: TestInferenceCheck
    memory_estimate: MemoryCheck
    compile: CompileCheck | None = None
    warmup: WarmupCheck | None = Field(None, description="absent: the config has no "
                                       "model_warmup")
    preprocess: PreprocessCheck | None = None
    postprocess: PostprocessCheck | None = None
    precision: PrecisionCheck | None = None


class CacheStats(BaseModel):
    """One of a model's per-signature caches (plans, checked signatures, inferred shapes)."""

    entries: int
    capacity: int
    evictions: int


class ModelDetail(BaseModel):
    """``GET /models/{name}``: versions, and the config and tensors of the newest ready one."""

    name: str
    versions: list[VersionInfo]
    ready_version: int | None
    config: dict[str, Any] | None
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]
    checks: ValidationChecks | None = None
    caches: dict[str, CacheStats] | None = Field(
        None, description="the ready version's per-signature caches, each bounded "
        "(--plan-cache-size)")


class VersionDetail(BaseModel):
    """A single version: its state, config and tensors (answer of an upload)."""

    name: str
    version: int
    state: str
    reason: str = ""
    config: dict[str, Any] | None
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]
    checks: ValidationChecks | None = None


class TensorChange(BaseModel):
    """An input or output that differs between two versions: added (no `before`), removed
    (no `after`), or with another datatype or shape."""

    kind: str = Field(description="input or output")
    name: str
    before: TensorMetadata | None
    after: TensorMetadata | None


class UploadDetail(VersionDetail):
    """An upload's answer: the version, and what changed for clients of the model's name."""

    previous_version: int | None = Field(
        description="the newest version serving before the upload: the one requests that name "
        "no version reached (null: none served)")
    stopped_serving: list[int] = Field(
        description="versions that served before the upload and no longer do (the version "
        "policy, by default the latest 1, keeps only the newest)")
    inputs_changed: bool = Field(description="the inputs differ from previous_version's in "
                                 "names, datatypes or shapes")
    outputs_changed: bool = Field(description="the outputs differ from previous_version's")
    tensor_changes: list[TensorChange] = Field(
        description="each input or output added, removed or changed against previous_version")


class Done(BaseModel):
    """A management action finished."""

    name: str
    version: int | None = None
    action: str


class TritonReshape(BaseModel):
    """The shape a tensor has inside the model where it differs from `dims`."""

    shape: list[int]


class TritonTensor(BaseModel):
    """An input or output of Triton's model configuration: its element type (``TYPE_FP32``;
    V2's BYTES is ``TYPE_STRING``) and its shape without the batch dimension."""

    name: str
    data_type: str
    dims: list[int]
    reshape: TritonReshape | None = None
    label_filename: str | None = Field(None, description="outputs only: the class labels of "
                                       "the classification extension")


class TritonQueuePolicy(BaseModel):
    """How long a request may wait and how many may queue (0: unbounded)."""

    timeout_action: str = "REJECT"
    default_timeout_microseconds: int = 0
    allow_timeout_override: bool = True
    max_queue_size: int


class TritonDynamicBatching(BaseModel):
    """The batching policy, in Triton's names."""

    preferred_batch_size: list[int]
    max_queue_delay_microseconds: int
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: TritonQueuePolicy
    priority_queue_policy: dict[int, TritonQueuePolicy] | None = None


class TritonInitialState(BaseModel):
    """A state's start: zeros (the only one served)."""

    zero_data: bool = True


class TritonSequenceState(BaseModel):
    """An implicit state: the input fed and the output kept, with its type and dims (the
    batch dimension left out)."""

    input_name: str
    output_name: str
    data_type: str
    dims: list[int]
    initial_state: list[TritonInitialState]


class TritonStrategyDirect(BaseModel):
    """One batch slot a sequence."""

    max_queue_delay_microseconds: int
    minimum_slot_utilization: float


class TritonStrategyOldest(BaseModel):
    """The oldest candidate sequences' next steps batched together."""

    max_candidate_sequences: int
    preferred_batch_size: list[int]
    max_queue_delay_microseconds: int


class TritonSequenceBatching(BaseModel):
    """Stateful sequences, in Triton's names (exactly one strategy is set)."""

    max_sequence_idle_microseconds: int
    direct: TritonStrategyDirect | None = None
    oldest: TritonStrategyOldest | None = None
    state: list[TritonSequenceState]


class TritonWarmupInput(BaseModel):
    """An input of a warm-up sample: its type and dims (without the batch dimension) and
    where its data came from (exactly one of the three)."""

    data_type: str
    dims: list[int]
    zero_data: bool | None = None
    random_data: bool | None = None
    input_data_file: str | None = Field(None, description="a file in the version's folder")


class TritonModelWarmup(BaseModel):
    """A request the version ran before it was READY."""

    name: str
    batch_size: int
    inputs: dict[str, TritonWarmupInput]
    count: int


class TritonInstanceGroup(BaseModel):
    """Where the model runs (``KIND_CPU`` or ``KIND_GPU``) and how many batches at once."""

    name: str
    kind: str
    count: int


class TritonModelConfig(BaseModel):
    """``GET /v2/models/{name}[/versions/{v}]/config`` and gRPC's ``ModelConfig``: a version's
    completed config in the form of Triton's model configuration, as Triton's clients and tools
    (perf_analyzer, model analyzer) read it. HybridServe's own form, with what Triton has no
    field for (batch buckets, pipelines, graph names), is ``config`` of ``GET /models/{name}``."""

    name: str
    platform: str
    version_policy: dict[str, dict[str, Any]] = Field(
        description="exactly one of latest (num_versions), all, specific (versions)")
    max_batch_size: int
    input: list[TritonTensor]
    output: list[TritonTensor]
    # One of the two, as Triton's scheduling choice: a sequence model has sequence_batching.
    dynamic_batching: TritonDynamicBatching | None = None
    sequence_batching: TritonSequenceBatching | None = None
    instance_group: list[TritonInstanceGroup]
    model_warmup: list[TritonModelWarmup] | None = Field(
        None, description="the requests the version ran before it was READY (none: absent)")
