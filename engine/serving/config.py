"""`config.json` of a served model: tensors, batching policy, device and version policy.

On disk it lives at ``REPO/<model>/config.json``; every field is optional, and the missing ones
are completed from the loaded graph (see `engine.serving.validate`). An entry of `inputs` or
`outputs` may rename the graph's tensor (``source``) for clients. Example::

    {"max_batch_size": 32,
     "inputs": [{"name": "data", "datatype": "FP32", "shape": [-1, 512]}],
     "outputs": [{"name": "probabilities", "source": "dense0_fwd_output"}],
     "dynamic_batching": {"max_queue_delay_us": 2000, "preferred_batch_sizes": [8, 16]},
     "precision": "bf16", "precision_check": {"min_top1_agreement": 0.99},
     "version_policy": {"latest": {"num_versions": 1}}}
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from engine.serving.errors import InvalidModel
from engine.serving.manifest import MANIFEST_NAME, PARAMS_NAME, SYMBOL_NAME
from engine.serving.postprocess_config import PostprocessField, check_outputs
from engine.serving.preprocess_config import PreprocessField
from engine.serving.sequence_config import SequenceBatchingConfig
from engine.serving.warmup_config import WarmupSample, check_samples

CONFIG_NAME = "config.json"
# A labels file sits in a version's folder or beside config.json: a plain name, never a path,
# and never the name of a file the repository itself writes there.
LABELS_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# An int8 model's calibration inputs, when the upload gives them (`engine.serving.calibration`).
CALIBRATION_NAME = "calibration.npz"
RESERVED_FILES = frozenset({CONFIG_NAME, MANIFEST_NAME, SYMBOL_NAME, PARAMS_NAME,
                            CALIBRATION_NAME})

# Open Inference Protocol (KServe V2) datatype names and the numpy dtypes they stand for.
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
}
_BY_NUMPY = {dtype: name for name, dtype in DATATYPES.items()}


def datatype_of(dtype: np.dtype | str) -> str:
    """The V2 datatype name (``"FP32"``) of a numpy dtype; `ValueError` if there is none."""
    try:
        return _BY_NUMPY[np.dtype(dtype)]
    except (KeyError, TypeError) as error:
        raise ValueError(f"dtype {dtype!s} has no V2 datatype; expected one of "
                         f"{', '.join(str(d) for d in _BY_NUMPY)}") from error


class _Strict(BaseModel):
    # Integers are StrictInt: JSON `true` or `8.0` where a count belongs is a mistake, not 1 or 8.
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorConfig(_Strict):
    """One input or output: the name clients use, and what is completed from the graph.

    `source` is the graph's name for the tensor when `name` renames it (MXNet calls an output
    ``<node>_output``); left out, the name is the graph's. `datatype` and `shape` (``-1``: batch
    or variable dimension) left out are completed from the graph on load, so a rename alone,
    ``{"name": "probabilities", "source": "dense0_fwd_output"}``, is a whole entry.
    `batch_axis` is the dimension of `shape` that holds the batch (1 for a time-major tensor,
    ``[steps, batch]``); left out, it is found on load (see `engine.serving.batch_axes`), and
    it has no meaning with ``max_batch_size`` 0. `labels`
    (outputs only) names a file of class labels, one a line, for Triton's classification
    extension. `preprocess` (inputs only) turns an encoded image into the tensor (a preset's
    name or a pipeline; see `engine.serving.preprocess_config`). `postprocess` (outputs only):
    softmax, top-k, detection rows, segmentation or embedding (see
    `engine.serving.postprocess_config`).
    """

    name: str = Field(min_length=1, max_length=256)
    source: str | None = Field(None, min_length=1, max_length=256)
    datatype: str | None = None
    shape: tuple[StrictInt, ...] | None = Field(None, min_length=1, max_length=32)
    batch_axis: StrictInt | None = Field(None, ge=0, lt=32)
    labels: str | None = None
    preprocess: PreprocessField | None = None
    postprocess: PostprocessField | None = None

    @field_validator("datatype", mode="before")
    @classmethod
    def _datatype(cls, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, str) and value.upper() in DATATYPES:
            return value.upper()
        if isinstance(value, str):
            try:
                return datatype_of(value)
            except ValueError:
                pass
        raise ValueError(f"unknown datatype {value!r}; expected one of {', '.join(DATATYPES)}")

    @field_validator("shape")
    @classmethod
    def _shape(cls, shape: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if shape is None:
            return None
        if any(dim == 0 or dim < -1 for dim in shape):
            raise ValueError(f"shape {list(shape)}: dimensions must be -1 (variable) or >= 1")
        return shape

    @field_validator("labels")
    @classmethod
    def _labels(cls, labels: str | None) -> str | None:
        if labels is not None and (not LABELS_FILE.fullmatch(labels)
                                   or labels in RESERVED_FILES):
            raise ValueError(f"labels {labels!r} must be a plain file name (letters, digits, "
                             f"'.', '_', '-'; no folders), not one of {sorted(RESERVED_FILES)}")
        return labels

    @property
    def graph_name(self) -> str:
        """The tensor's name in the graph: `source`, else `name`."""
        return self.source or self.name

    @property
    def axis(self) -> int:
        """The batch's dimension in `shape` (`batch_axis`, 0 where it is not given)."""
        return self.batch_axis or 0

    @property
    def dtype(self) -> np.dtype:
        """The numpy dtype of `datatype` (set once the config is completed)."""
        assert self.datatype is not None, f"{self.name!r}: datatype completed on load"
        return DATATYPES[self.datatype]


class QueuePolicyConfig(_Strict):
    """Triton's ``ModelQueuePolicy``: what happens to a request of one priority level that
    waits in the queue past its timeout (`timeout_action` REJECT: answered 503; DELAY: it
    stays, behind the level's requests still within theirs), the timeout (0: none), whether a
    request's own ``timeout`` parameter may shorten it, and the level's queue bound (0: none
    besides `DynamicBatchingConfig.max_queue_size`)."""

    timeout_action: Literal["REJECT", "DELAY"] = "REJECT"
    default_timeout_microseconds: StrictInt = Field(0, ge=0, le=3_600_000_000)
    allow_timeout_override: bool = False
    max_queue_size: StrictInt = Field(0, ge=0, le=1_000_000)


class DynamicBatchingConfig(_Strict):
    """How requests are queued and combined (see `engine.serving.batcher.DynamicBatcher`).

    The priority fields are Triton's: `priority_levels` queues (1 is served first), the level
    of a request that names none, and each level's queue policy (`priority_queue_policy` by
    level, `default_queue_policy` for the rest). A model that sets none of them has one queue
    whose ``timeout`` (`timeout_us`, or the request's own) is a deadline for the whole
    request; see `has_queue_policy`.
    """

    max_queue_delay_us: StrictInt = Field(1000, ge=0, le=60_000_000)
    preferred_batch_sizes: tuple[StrictInt, ...] = ()
    max_queue_size: StrictInt = Field(1024, ge=1, le=1_000_000)
    timeout_us: StrictInt | None = Field(None, ge=1, le=3_600_000_000)
    priority_levels: StrictInt = Field(0, ge=0, le=1000)
    default_priority_level: StrictInt = Field(0, ge=0, le=1000)
    default_queue_policy: QueuePolicyConfig | None = None
    priority_queue_policy: dict[int, QueuePolicyConfig] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _levels(self) -> DynamicBatchingConfig:
        levels = self.priority_levels
        if levels and not 1 <= self.default_priority_level <= levels:
            raise ValueError(f"default_priority_level {self.default_priority_level} must be "
                             f"within 1..priority_levels {levels}")
        if not levels and self.default_priority_level:
            raise ValueError(f"default_priority_level {self.default_priority_level} needs "
                             "priority_levels")
        outside = sorted(level for level in self.priority_queue_policy
                         if not 1 <= level <= levels)
        if outside:
            raise ValueError(f"priority_queue_policy levels {outside} are outside "
                             f"1..priority_levels {levels}")
        return self

    @property
    def has_queue_policy(self) -> bool:
        """True where the config sets Triton's priorities or queue policies: a request's
        ``timeout`` is then its queue policy's, not a deadline (see `QueuePolicyConfig`)."""
        return bool(self.priority_levels or self.default_queue_policy is not None
                    or self.priority_queue_policy)

    def queue_policy(self, level: int) -> QueuePolicyConfig:
        """The policy of one priority level (Triton's default policy where none is given)."""
        return (self.priority_queue_policy.get(level) or self.default_queue_policy
                or QueuePolicyConfig())

    @field_validator("preferred_batch_sizes")
    @classmethod
    def _preferred(cls, sizes: tuple[int, ...]) -> tuple[int, ...]:
        if any(size < 1 for size in sizes):
            raise ValueError(f"preferred_batch_sizes {list(sizes)}: sizes must be >= 1")
        return tuple(sorted(set(sizes)))


class LatestVersions(_Strict):
    """Serve the `num_versions` highest version numbers."""

    num_versions: StrictInt = Field(1, ge=1, le=1000)


class AllVersions(_Strict):
    """Serve every version."""


class SpecificVersions(_Strict):
    """Serve exactly the listed versions (those present on disk)."""

    versions: tuple[StrictInt, ...] = Field(min_length=1)

    @field_validator("versions")
    @classmethod
    def _positive(cls, versions: tuple[int, ...]) -> tuple[int, ...]:
        if any(version < 1 for version in versions):
            raise ValueError(f"versions {list(versions)}: versions are positive integers")
        return versions


class VersionPolicy(_Strict):
    """Which versions on disk are loaded: exactly one of `latest`, `all` or `specific`."""

    latest: LatestVersions | None = None
    all: AllVersions | None = None
    specific: SpecificVersions | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> VersionPolicy:
        chosen = [name for name in ("latest", "all", "specific") if getattr(self, name) is not None]
        if len(chosen) > 1:
            raise ValueError(f"give exactly one of latest, all, specific; got {', '.join(chosen)}")
        return self

    def select(self, available: Iterable[int]) -> list[int]:
        """The versions to load, ascending, out of those `available` on disk."""
        versions = sorted(set(available))
        if self.all is not None:
            return versions
        if self.specific is not None:
            return [version for version in versions if version in self.specific.versions]
        count = self.latest.num_versions if self.latest is not None else 1
        return versions[-count:]


class PrecisionCheck(_Strict):
    """How far a reduced-precision model may drift from float32 and still be served: checked
    at load on ``samples`` seeded random rows against the float32 reference interpreter
    (`engine.serving.precision_check`). A classifier's outputs (given class labels, or a
    softmax or top-k postprocess) must pick the same top-1 class on at least
    ``min_top1_agreement`` of the rows; any other output's largest difference, relative to
    its largest magnitude, must stay at most ``max_relative_error``."""

    min_top1_agreement: float = Field(0.99, ge=0.0, le=1.0)
    max_relative_error: float = Field(0.05, gt=0.0)
    samples: StrictInt = Field(16, ge=1, le=1024)


class CalibrationConfig(_Strict):
    """How an int8 model's ranges are calibrated (`engine.serving.calibration`): ``mode``
    naive (each tensor's min and max) or entropy (MXNet's KL-divergence threshold over a
    histogram of ``num_bins`` bins); ``samples`` seeded random rows of the sample inputs when
    the version has no ``calibration.npz``."""

    mode: Literal["naive", "entropy"] = "naive"
    num_bins: StrictInt = Field(8001, ge=511, le=65535)
    samples: StrictInt = Field(32, ge=1, le=1024)

    @model_validator(mode="after")
    def _odd_bins(self) -> CalibrationConfig:
        if self.num_bins % 2 == 0:
            raise ValueError(f"calibration.num_bins must be odd (a bin centred on zero); got "
                             f"{self.num_bins}")
        return self


class InstanceGroup(_Strict):
    """Triton's ``instance_group`` entry: how many batches of the model run at once (`count`,
    each a copy of the plan: on the CPU each on its share of the cores, on a GPU each on a
    stream of its own) and on what (`kind`: ``KIND_AUTO`` is the model's device)."""

    count: StrictInt = Field(ge=1, le=64)
    kind: Literal["KIND_CPU", "KIND_GPU", "KIND_AUTO"] = "KIND_AUTO"


class ModelConfig(_Strict):
    """A model's ``config.json``; `inputs`/`outputs` left out are inferred from the graph."""

    name: str | None = None
    inputs: tuple[TensorConfig, ...] | None = None
    outputs: tuple[TensorConfig, ...] | None = None
    # 0: no batch dimension at all (Triton's meaning): shapes are whole, requests run alone.
    max_batch_size: StrictInt = Field(32, ge=0, le=65536)
    dynamic_batching: DynamicBatchingConfig = DynamicBatchingConfig()
    # Stateful sequences (Triton's sequence batcher); None: every request stands alone. Checked
    # against the completed inputs and outputs on load (`engine.serving.sequences`).
    sequence_batching: SequenceBatchingConfig | None = None
    # Rows a batch is padded up to, so that a few plans serve every batch size (None: on a GPU
    # powers of two up to max_batch_size, since each new size there compiles a plan, builds its
    # cuDNN graphs and captures a CUDA graph; on the CPU exact sizes).
    batch_buckets: tuple[StrictInt, ...] | None = None
    device: Literal["cpu", "gpu", "auto"] | None = None
    # What the Dense and Convolution products compute in (`engine.load_model`'s precision);
    # anything but fp32 is checked against fp32 at load (`precision_check`).
    precision: Literal["fp32", "bf16", "int8", "fp16"] = "fp32"
    precision_check: PrecisionCheck = PrecisionCheck()
    calibration: CalibrationConfig = CalibrationConfig()  # for precision int8
    version_policy: VersionPolicy = VersionPolicy()
    # Never unloaded to make room under the server's memory budget (`engine.serving.control`).
    pinned: bool = False
    # Requests a version runs before it is READY (Triton's name; ``warmup`` is accepted too).
    # Empty: none, and on the CPU the load compiles the plans of a few batch sizes instead
    # (see `engine.serving.warmup`).
    model_warmup: tuple[WarmupSample, ...] = Field(
        (), validation_alias=AliasChoices("model_warmup", "warmup"))

    @model_validator(mode="before")
    @classmethod
    def _one_warmup_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and "model_warmup" in data and "warmup" in data:
            raise ValueError("give model_warmup or warmup (the same field), not both")
        return data
    # Batches of this model run at once; None: the server's default for the device
    # (`engine.serving.validate.concurrent_batches`). One group, as one device serves a model.
    instance_group: tuple[InstanceGroup, ...] | None = None

    @field_validator("instance_group")
    @classmethod
    def _one_group(cls, groups: tuple[InstanceGroup, ...] | None
                   ) -> tuple[InstanceGroup, ...] | None:
        if groups is not None and len(groups) != 1:
            raise ValueError(f"give one group (a model runs on one device); got {len(groups)}")
        return groups

    @model_validator(mode="after")
    def _consistent(self) -> ModelConfig:
        if self.instance_group:
            _check_instance_kind(self.instance_group[0].kind, self.device)
        for field in ("inputs", "outputs"):
            tensors: Sequence[TensorConfig] = getattr(self, field) or ()
            _unique(field, "names", [tensor.name for tensor in tensors])
            _unique(field, "sources (graph names)", [tensor.graph_name for tensor in tensors])
        labelled = [tensor.name for tensor in self.inputs or () if tensor.labels is not None]
        if labelled:
            raise ValueError(f"inputs {labelled}: labels belong to outputs (classification)")
        processed = [tensor.name for tensor in self.outputs or () if tensor.preprocess]
        if processed:
            raise ValueError(f"outputs {processed}: preprocess belongs to inputs")
        processed = [tensor.name for tensor in self.inputs or () if tensor.postprocess]
        if processed:
            raise ValueError(f"inputs {processed}: postprocess belongs to outputs")
        check_outputs(self.outputs or ())
        for field in ("inputs", "outputs"):
            for index, tensor in enumerate(getattr(self, field) or ()):
                _check_batch_axis(f"{field}.{index}", tensor, self.max_batch_size)
        too_big = [size for size in self.dynamic_batching.preferred_batch_sizes
                   if size > self.max_batch_size]
        if too_big:
            raise ValueError(f"dynamic_batching.preferred_batch_sizes {too_big} exceed "
                             f"max_batch_size {self.max_batch_size}")
        buckets = self.batch_buckets or ()
        if any(size < 1 or size > max(1, self.max_batch_size) for size in buckets) or list(
                buckets) != sorted(set(buckets)):
            raise ValueError(f"batch_buckets {list(buckets)}: increasing sizes from 1 to "
                             f"max_batch_size {self.max_batch_size}")
        check_samples(self.model_warmup, self.max_batch_size)
        return self

    @property
    def instances(self) -> int | None:
        """`instance_group`'s count, or None where the config gives none."""
        return self.instance_group[0].count if self.instance_group else None

    def asked_device(self) -> str | None:
        """The device the config asks for: `device`, else the one its instance group's kind
        names (``KIND_GPU``: the GPU); None leaves it to the server."""
        kind = self.instance_group[0].kind if self.instance_group else "KIND_AUTO"
        named = {"KIND_CPU": "cpu", "KIND_GPU": "gpu"}.get(kind)
        return named if self.device in (None, "auto") and named else self.device

    def batch_axes(self) -> dict[str, int] | None:
        """Each input's and output's batch axis by graph name (0 where none is given); None
        with ``max_batch_size`` 0, where tensors have no batch dimension."""
        if self.max_batch_size == 0:
            return None
        return {tensor.graph_name: tensor.axis
                for tensor in (*(self.inputs or ()), *(self.outputs or ()))}

    def to_json(self) -> str:
        """The config as indented JSON, with defaults written out."""
        return self.model_dump_json(indent=2)


def _check_batch_axis(field: str, tensor: TensorConfig, max_batch_size: int) -> None:
    """A tensor's batch axis against its shape: with batching, a dimension of the shape, and
    -1 there (any batch size); without (max_batch_size 0), none at all."""
    if max_batch_size == 0:
        if tensor.batch_axis is not None:
            raise ValueError(f"{field}.batch_axis {tensor.batch_axis}: max_batch_size 0 means "
                             "no batch dimension; leave batch_axis out")
        return
    if tensor.shape is None:
        return
    axis = tensor.axis
    if axis >= len(tensor.shape):
        raise ValueError(f"{field}.batch_axis {axis} is not a dimension of shape "
                         f"{list(tensor.shape)}")
    if tensor.shape[axis] != -1:
        where = "start with -1" if tensor.batch_axis is None else f"have -1 at axis {axis}"
        raise ValueError(f"{field}.shape {list(tensor.shape)} must {where}, the batch "
                         "dimension (or set batch_axis, or max_batch_size 0 for no batch)")


def _check_instance_kind(kind: str, device: str | None) -> None:
    """A group's kind names the device the config asks for (or leaves it to the group)."""
    wanted = {"KIND_CPU": "cpu", "KIND_GPU": "gpu"}.get(kind)
    if wanted is not None and device not in (None, "auto", wanted):
        raise ValueError(f"instance_group.0.kind {kind} runs on the {wanted.upper()}, but "
                         f"device is {device!r}; make them agree or leave one out")


def _unique(field: str, what: str, values: Sequence[str]) -> None:
    duplicates = sorted({value for value in values if values.count(value) > 1})
    if duplicates:
        raise ValueError(f"{field}: {what} must be unique; {duplicates} repeated")


def parse_config(data: bytes | str | dict[str, Any], where: str) -> ModelConfig:
    """Validate config data; `where` (a path or 'upload') prefixes every error message.

    Raises:
        InvalidModel: the JSON does not parse or a field is invalid; the message names the field.
    """
    try:
        raw = data if isinstance(data, dict) else json.loads(data)
    except (ValueError, UnicodeDecodeError) as error:
        raise InvalidModel(f"{where}: config is not valid JSON: {error}") from None
    if not isinstance(raw, dict):
        raise InvalidModel(f"{where}: config must be a JSON object, got {type(raw).__name__}")
    try:
        return ModelConfig.model_validate(raw)
    except ValidationError as error:
        raise InvalidModel(f"{where}: {describe_validation_error(error)}") from None


def describe_validation_error(error: ValidationError) -> str:
    """One line per problem, each naming the field as a dotted path (``inputs.0.shape``)."""
    lines = []
    for problem in error.errors():
        where = ".".join(str(part) for part in problem["loc"]) or "config"
        message = problem["msg"].removeprefix("Value error, ")
        got = repr(problem.get("input"))
        got = got if len(got) <= 120 else got[:117] + "..."
        lines.append(f"{where}: {message} (got {got})")
    return "; ".join(lines)
