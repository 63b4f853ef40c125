"""The ``preprocess`` of a ``config.json`` input: how an encoded image becomes the input tensor.

Pure data, validated when the config is parsed (unknown keys are errors). An input gives either
a preset's name or an object::

    {"name": "data", "preprocess": "imagenet"}
    {"name": "data", "preprocess": {"image": {
        "resize": {"letterbox": [416, 416], "pad_value": 114},
        "scale": 0.00392156862745098, "layout": "NCHW", "dtype": "FP32"}}}

`engine.serving.preprocess` runs the pipeline; docs/preprocessing.md describes every key.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StrictBool,
    StrictInt,
    field_validator,
    model_serializer,
    model_validator,
)

from engine.serving.text_config import TextPreprocess

# Pillow's own bomb check warns past about 89.5 million pixels (`Image.MAX_IMAGE_PIXELS`); a
# cap at or under it means that warning only ever fires for images refused anyway.
PILLOW_WARNING_PIXELS = 89_478_485
DEFAULT_MAX_PIXELS = 40_000_000
# Pixel sizes a pipeline may produce: past this, a single batch row is hundreds of MB.
MAX_SIDE = 8192

Size = tuple[Annotated[StrictInt, Field(ge=1, le=MAX_SIDE)],
             Annotated[StrictInt, Field(ge=1, le=MAX_SIDE)]]
Number = Annotated[float, BeforeValidator(lambda value: _number(value))]


def _number(value: Any) -> Any:
    """JSON numbers only: `true` where a scale belongs is a mistake, not 1.0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number, got {value!r}")
    return float(value)


def _square(value: Any) -> Any:
    """``224`` is shorthand for ``[224, 224]``."""
    return [value, value] if isinstance(value, int) and not isinstance(value, bool) else value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ResizeConfig(_Strict):
    """Exactly one of: the shorter side to N pixels (aspect kept), an exact ``[height, width]``
    (aspect not kept), or a letterbox ``[height, width]`` (aspect kept, the rest padded with
    `pad_value`; other kinds ignore it)."""

    shorter_side: StrictInt | None = Field(None, ge=1, le=MAX_SIDE)
    exact: Size | None = None
    letterbox: Size | None = None
    pad_value: tuple[Annotated[StrictInt, Field(ge=0, le=255)], ...] = (0, 0, 0)
    interpolation: Literal["nearest", "bilinear", "bicubic"] = "bilinear"

    @field_validator("pad_value", mode="before")
    @classmethod
    def _grey(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return [value] * 3
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> ResizeConfig:
        kinds = [kind for kind in ("shorter_side", "exact", "letterbox")
                 if getattr(self, kind) is not None]
        if len(kinds) != 1:
            raise ValueError(f"give exactly one of shorter_side, exact, letterbox; got "
                             f"{', '.join(kinds) or 'none'}")
        if len(self.pad_value) != 3:
            raise ValueError(f"pad_value {list(self.pad_value)}: one value, or one per channel")
        return self

    @property
    def fixed_size(self) -> tuple[int, int] | None:
        """The ``(height, width)`` every image is resized to, or None (shorter side)."""
        return self.exact or self.letterbox


class ImagePreprocess(_Strict):
    """Decode, resize, crop, normalise and lay out one image: ``(pixel * scale - mean) / std``
    per channel, channels in `color` order (``L``: one grey channel)."""

    color: Literal["RGB", "BGR", "L"] = "RGB"
    resize: ResizeConfig | None = None
    center_crop: Size | None = None
    scale: Number = 1.0
    mean: tuple[Number, Number, Number] = (0.0, 0.0, 0.0)
    std: tuple[Number, Number, Number] = (1.0, 1.0, 1.0)
    layout: Literal["NCHW", "NHWC"] = "NCHW"
    dtype: Literal["FP32", "FP16", "UINT8"] = "FP32"
    jpeg_draft: StrictBool = False
    max_pixels: StrictInt = Field(DEFAULT_MAX_PIXELS, ge=1, le=PILLOW_WARNING_PIXELS)

    @field_validator("resize", mode="before")
    @classmethod
    def _resize_shorthand(cls, value: Any) -> Any:
        """``256`` is the shorter side; ``[h, w]`` is exact."""
        if isinstance(value, int) and not isinstance(value, bool):
            return {"shorter_side": value}
        if isinstance(value, list | tuple):
            return {"exact": value}
        return value

    @field_validator("center_crop", mode="before")
    @classmethod
    def _crop_square(cls, value: Any) -> Any:
        return _square(value)

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype_upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @field_validator("mean", "std", mode="before")
    @classmethod
    def _one_for_all(cls, value: Any) -> Any:
        """One number stands for the same value on every channel."""
        if isinstance(value, int | float) and not isinstance(value, bool):
            return [value] * 3
        return value

    @field_validator("std")
    @classmethod
    def _nonzero(cls, std: tuple[float, float, float]) -> tuple[float, float, float]:
        if any(value == 0 for value in std):
            raise ValueError(f"std {list(std)}: every value must be non-zero (it divides)")
        return std

    @model_validator(mode="after")
    def _consistent(self) -> ImagePreprocess:
        if self.output_size is None:
            raise ValueError("the pipeline must give every image the same size, so that they "
                             "batch: add center_crop, or resize with exact or letterbox")
        resized = self.resize.fixed_size if self.resize is not None else None
        short = self.resize.shorter_side if self.resize is not None else None
        crop = self.center_crop
        if crop is not None and resized is not None and (crop[0] > resized[0]
                                                         or crop[1] > resized[1]):
            raise ValueError(f"center_crop {list(crop)} is larger than the resized image "
                             f"{list(resized)}")
        if crop is not None and short is not None and max(crop) > short:
            raise ValueError(f"center_crop {list(crop)} is larger than the shorter side "
                             f"{short} after resize")
        for name in ("mean", "std"):
            values = getattr(self, name)
            if self.color == "L" and len(set(values)) > 1:
                raise ValueError(f"color L has one channel: {name} {list(values)} must be one "
                                 "number")
        if self.dtype == "UINT8" and not self.is_identity:
            raise ValueError("dtype UINT8 keeps the pixels as they are: scale, mean and std "
                             "must be left out")
        return self

    @property
    def output_size(self) -> tuple[int, int] | None:
        """The ``(height, width)`` of every image the pipeline gives (None: it varies)."""
        if self.center_crop is not None:
            return self.center_crop
        return None if self.resize is None else self.resize.fixed_size

    @property
    def channels(self) -> int:
        """Channels of a row: 1 for ``L`` (grey), else 3."""
        return 1 if self.color == "L" else 3

    @property
    def output_shape(self) -> tuple[int, int, int]:
        """One row's shape: ``(C, H, W)`` for NCHW, ``(H, W, C)`` for NHWC; C is `channels`."""
        assert self.output_size is not None  # checked on validation
        height, width = self.output_size
        channels = self.channels
        return (channels, height, width) if self.layout == "NCHW" else (height, width, channels)

    @property
    def is_identity(self) -> bool:
        """Whether the pixel values pass unchanged (no scale, mean or std)."""
        return self.scale == 1.0 and self.mean == (0.0, 0.0, 0.0) and self.std == (1.0, 1.0, 1.0)


class Preprocess(_Strict):
    """An input's pipeline: exactly one of ``image`` and ``text``."""

    image: ImagePreprocess | None = None
    text: TextPreprocess | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Preprocess:
        if (self.image is None) == (self.text is None):
            raise ValueError("give exactly one of image, text")
        return self

    @model_serializer(mode="wrap")
    def _its_kind_only(self, write: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The completed config shows the kind given, not the other as null."""
        return {kind: value for kind, value in write(self).items() if value is not None}


IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

PRESETS: dict[str, Preprocess] = {
    # torchvision's and GluonCV's ImageNet evaluation transform.
    "imagenet": Preprocess(image=ImagePreprocess(
        resize=ResizeConfig(shorter_side=256), center_crop=(224, 224), scale=1 / 255,
        mean=IMAGENET_MEAN, std=IMAGENET_STD)),
}


def _preset(value: Any) -> Any:
    """A preset's name stands for its pipeline (the completed config shows it in full)."""
    if isinstance(value, str):
        if value not in PRESETS:
            raise ValueError(f"unknown preprocess preset {value!r}; presets are "
                             f"{sorted(PRESETS)}, or give an object {{\"image\": {{...}}}} or "
                             "{\"text\": {...}}")
        return PRESETS[value]
    return value


PreprocessField = Annotated[Preprocess, BeforeValidator(_preset)]
