"""Request and response bodies of the HTTP API (they are also its OpenAPI document).

The data plane's answers (metadata, repository rows, model details) are its own types,
`service.dataplane.types`, which the routes return as they are.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class ErrorResponse(BaseModel):
    """Every error: a message naming what is wrong."""

    error: str


class Live(BaseModel):
    """``GET /v2/health/live``."""

    live: bool


class Ready(BaseModel):
    """``GET /v2/health/ready``."""

    ready: bool


class V2Parameters(BaseModel):
    """Parameters of a tensor or request; the ones the server reads are listed."""

    binary_data_size: int | None = Field(None, description="bytes of this tensor in the "
                                         "binary section (binary-tensor extension)")
    binary_data: bool | None = Field(None, description="return this output as binary data")
    binary_data_output: bool | None = Field(None, description="return all outputs as binary")
    timeout: int | None = Field(None, description="microseconds: the request's deadline, or "
                                "for a model with queue policies its queue timeout where the "
                                "policy allows an override")
    priority: int | None = Field(None, description="the model's priority level, 1 highest "
                                 "(0 or absent: its default_priority_level)")
    classification: int | None = Field(None, description="return this output as its top N "
                                       "classes, BYTES \"<value>:<index>[:<label>]\" "
                                       "(classification extension)")


class _V2Tensor(BaseModel):
    """A tensor of a V2 request or response (its two kinds below describe it)."""

    name: str
    datatype: str
    shape: list[int]
    parameters: V2Parameters | None = None
    data: list[Any] | None = None


class V2InputTensor(_V2Tensor):
    """An input tensor; `data` is nested or flat row-major, or absent with binary_data_size."""

    datatype: str = Field(description="BOOL, UINT8..UINT64, INT8..INT64, FP16, FP32 or FP64")


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


class V2OutputTensor(_V2Tensor):
    """An output tensor: flat row-major `data`, or binary_data_size bytes after the header."""

    datatype: str = Field(description="the output's datatype, or BYTES for a classification")


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
