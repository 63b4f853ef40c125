"""``model_warmup`` in config.json: samples a version runs before it is READY, as Triton's.

Each sample is a request the load runs straight through the model (no batcher), ``count``
times, after the compile step and the test inference; the version serves only once every
sample ran. A sample names itself, its ``batch_size`` and, per input, where its data comes
from: ``zero_data``, ``random_data`` or ``input_data_file`` (a file in the version's folder).
Inputs a sample leaves out get zeros. ``data_type`` and ``dims`` (the shape without the batch
dimension) may be left out: the model's completed config gives them. Example::

    "model_warmup": [
      {"name": "one image", "batch_size": 1},
      {"name": "batch of 8", "batch_size": 8, "count": 2,
       "inputs": {"data": {"dims": [3, 224, 224], "random_data": true}}},
      {"name": "a real image", "batch_size": 1,
       "inputs": {"data": {"data_type": "TYPE_FP32", "input_data_file": "warmup/cat.npy"}}}]

``warmup`` is accepted as another name for the field (`ModelConfig`). The samples are checked
against the completed config, and run, by `engine.serving.warmup`.
"""

from __future__ import annotations

from pathlib import PurePosixPath, PureWindowsPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator

MAX_SAMPLES = 256  # warm-up runs before serving: a long list is a mistake, not a plan
MAX_COUNT = 1000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WarmupInput(_Strict):
    """One input of a warm-up sample: exactly one source of data (none: zeros)."""

    data_type: str | None = None
    dims: tuple[StrictInt, ...] | None = Field(None, max_length=32)
    zero_data: StrictBool | None = None
    random_data: StrictBool | None = None
    input_data_file: str | None = Field(None, min_length=1, max_length=1024)

    @field_validator("data_type", mode="before")
    @classmethod
    def _data_type(cls, value: Any) -> Any:
        # Triton spells datatypes TYPE_FP32; V2 and this config's inputs spell them FP32.
        if isinstance(value, str):
            return value.upper().removeprefix("TYPE_")
        return value

    @field_validator("dims")
    @classmethod
    def _dims(cls, dims: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if dims is not None and any(dim < 1 for dim in dims):
            raise ValueError(f"dims {list(dims)}: a warm-up sample's dimensions are all >= 1")
        return dims

    @field_validator("input_data_file")
    @classmethod
    def _inside_folder(cls, path: str | None) -> str | None:
        if path is None:
            return None
        # A path relative to the version's folder that cannot leave it, on any platform's
        # reading of it; links are checked where the file is read.
        posix, windows = PurePosixPath(path), PureWindowsPath(path)
        if posix.is_absolute() or windows.is_absolute() or windows.drive or "\\" in path:
            raise ValueError(f"input_data_file {path!r} must be a path relative to the "
                             "model version's folder (no leading '/', drive or '\\')")
        if ".." in posix.parts:
            raise ValueError(f"input_data_file {path!r} must stay inside the model version's "
                             "folder (no '..')")
        return path

    @property
    def source(self) -> str:
        """Where the data comes from: ``zero_data``, ``random_data`` or ``input_data_file``."""
        chosen = self.chosen()
        return chosen[0] if chosen else "zero_data"

    def chosen(self) -> list[str]:
        """The sources this entry names (at most one is valid)."""
        return [name for name in ("zero_data", "random_data", "input_data_file")
                if getattr(self, name) not in (None, False)]


class WarmupSample(_Strict):
    """One warm-up request: its name (for logs and errors), batch size, inputs and count
    (Triton's 0 and 1 both run it once)."""

    name: str = Field(min_length=1, max_length=256)
    batch_size: StrictInt = Field(1, ge=1, le=65536)
    inputs: dict[str, WarmupInput] = Field(default_factory=dict, max_length=256)
    count: StrictInt = Field(1, ge=0, le=MAX_COUNT)

    @field_validator("inputs")
    @classmethod
    def _one_source(cls, inputs: dict[str, WarmupInput]) -> dict[str, WarmupInput]:
        for name, entry in inputs.items():
            if len(chosen := entry.chosen()) > 1:
                raise ValueError(f"input {name!r}: give one of zero_data, random_data, "
                                 f"input_data_file; got {', '.join(chosen)}")
        return inputs

    @property
    def runs(self) -> int:
        """How many times the sample runs."""
        return max(1, self.count)


def check_samples(samples: tuple[WarmupSample, ...], max_batch_size: int) -> None:
    """The samples against each other and the batch policy: names unique, batch sizes within
    ``max_batch_size`` (1 where the model has no batch dimension, as Triton's).

    Raises:
        ValueError: the first problem, naming the sample.
    """
    if len(samples) > MAX_SAMPLES:
        raise ValueError(f"model_warmup: at most {MAX_SAMPLES} samples, got {len(samples)}")
    names = [sample.name for sample in samples]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"model_warmup: sample names must be unique; {repeated} repeated")
    limit = max(1, max_batch_size)
    for index, sample in enumerate(samples):
        if sample.batch_size > limit:
            why = ("the model has no batch dimension (max_batch_size 0)" if max_batch_size == 0
                   else f"max_batch_size is {max_batch_size}")
            raise ValueError(f"model_warmup.{index} ({sample.name!r}): batch_size "
                             f"{sample.batch_size} is more than {limit}: {why}")
