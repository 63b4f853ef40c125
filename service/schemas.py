"""Request and response schemas of the HTTP API (they are also the OpenAPI document)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class ErrorResponse(BaseModel):
    """Every error: a message naming what is wrong."""

    error: str


class ServerMetadata(BaseModel):
    """``GET /v2``."""

    name: str
    version: str
    extensions: list[str]


class Live(BaseModel):
    """``GET /v2/health/live``."""

    live: bool


class Ready(BaseModel):
    """``GET /v2/health/ready``."""

    ready: bool


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


class V2Parameters(BaseModel):
    """Parameters of a tensor or request; the ones the server reads are listed."""

    binary_data_size: int | None = Field(None, description="bytes of this tensor in the "
                                         "binary section (binary-tensor extension)")
    binary_data: bool | None = Field(None, description="return this output as binary data")
    binary_data_output: bool | None = Field(None, description="return all outputs as binary")
    timeout: int | None = Field(None, description="request deadline in microseconds")
    classification: int | None = Field(None, description="return this output as its top N "
                                       "classes, BYTES \"<value>:<index>[:<label>]\" "
                                       "(classification extension)")


class V2InputTensor(BaseModel):
    """An input tensor; `data` is nested or flat row-major, or absent with binary_data_size."""

    name: str
    datatype: str = Field(description="BOOL, UINT8..UINT64, INT8..INT64, FP16, FP32 or FP64")
    shape: list[int]
    parameters: V2Parameters | None = None
    data: list[Any] | None = None


class V2RequestedOutput(BaseModel):
    """An output to return."""

    name: str
    parameters: V2Parameters | None = None


class V2InferRequest(BaseModel):
    """``POST …/infer`` body (or its JSON header when Inference-Header-Content-Length is set)."""

    id: str | None = None
    parameters: V2Parameters | None = None
    inputs: list[V2InputTensor]
    outputs: list[V2RequestedOutput] | None = None


class V2OutputTensor(BaseModel):
    """An output tensor: flat row-major `data`, or binary_data_size bytes after the header."""

    name: str
    datatype: str = Field(description="the output's datatype, or BYTES for a classification")
    shape: list[int]
    parameters: V2Parameters | None = None
    data: list[Any] | None = None


class V2InferResponse(BaseModel):
    """``POST …/infer`` response."""

    model_name: str
    model_version: str
    id: str | None = None
    outputs: list[V2OutputTensor]


class PredictRequest(BaseModel):
    """``POST /predict``."""

    model: str
    version: int | str | None = None
    inputs: dict[str, Any] = Field(description="input name -> nested list of numbers")


class PredictResponse(BaseModel):
    """``POST /predict`` response."""

    model: str
    version: int
    outputs: dict[str, Any] = Field(description="output name -> nested list of numbers")


class IndexRequest(BaseModel):
    """``POST /v2/repository/index`` body."""

    ready: bool | None = Field(None, description="only versions that are (not) ready")


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


class TestInferenceCheck(CheckRan):
    """One synthetic run of the model; the input shapes it ran at."""

    inputs: dict[str, list[int]] | None = None


class MemoryCheck(CheckRan):
    """The memory estimate at max_batch_size against the server's budget."""

    estimated_bytes: int | None = None


class PreprocessCheck(CheckRan):
    """The inputs' preprocess pipelines: checked against the graph, dry-run on a synthetic image
    (row shapes by input), and warnings (e.g. a graph that already normalises its input)."""

    inputs: dict[str, list[int]] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)


class PostprocessCheck(CheckRan):
    """The outputs' postprocesses: checked against the graph and run on the test inference's
    outputs (each output's kind, by name)."""

    outputs: dict[str, str] = Field(default_factory=dict)


class ValidationChecks(BaseModel):
    """What was checked when the version was loaded (loading fails at the first failed check)."""

    parsed: bool = Field(description="the symbol JSON and the params file decoded")
    ops_known: bool = Field(description="every op of the graph is implemented")
    params_match: bool = Field(description="parameters and graph variables match in names "
                               "and shapes")
    shape_inference: ShapeInferenceCheck
    test_inference: TestInferenceCheck
    memory_estimate: MemoryCheck
    preprocess: PreprocessCheck | None = None
    postprocess: PostprocessCheck | None = None


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


class Done(BaseModel):
    """A management action finished."""

    name: str
    version: str | None = None
    action: str
