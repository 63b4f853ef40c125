"""Weight initializers: ``Xavier``, ``MSRAPrelu``, ``Normal``, ``Uniform``, ``Zero``, ``One``, ...

An initializer fills a parameter by its name, as MXNet's do: names ending in ``weight`` get the
initializer's distribution, ``bias``/``beta``/``running_mean`` get zeros and
``gamma``/``running_var`` get ones, unless the initializer is a constant one (``Zero``, ``One``,
``Constant``), which fills everything. ``dumps()`` gives the JSON MXNet stores in ``__init__``.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from engine.nd.random import generator

_ZERO_SUFFIXES = ("bias", "beta", "running_mean", "moving_mean", "moving_avg")
_ONE_SUFFIXES = ("gamma", "running_var", "moving_var", "moving_inv_var")


class Initializer:
    """Base class: ``init(name, shape, dtype)`` returns a new numpy array."""

    def __init__(self, **kwargs: Any) -> None:
        self._kwargs = kwargs

    def dumps(self) -> str:
        """``["<name>", {kwargs}]``, the text MXNet writes in a variable's ``__init__``."""
        return json.dumps([type(self).__name__.lower(), self._kwargs])

    def __call__(self, name: str, shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
        if name.endswith(_ZERO_SUFFIXES):
            return np.zeros(shape, dtype)
        if name.endswith(_ONE_SUFFIXES):
            return np.ones(shape, dtype)
        return np.asarray(self._init_weight(tuple(shape)), dtype=dtype)

    def _init_weight(self, shape: tuple[int, ...]) -> np.ndarray:
        raise NotImplementedError(f"{type(self).__name__} does not initialize weights")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._kwargs})"


class _Filler(Initializer):
    """An initializer that fills every parameter, whatever its name."""

    def __call__(self, name: str, shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
        return np.asarray(self._init_weight(tuple(shape)), dtype=dtype)


class Zero(_Filler):
    """Fills with 0."""

    def _init_weight(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.zeros(shape)


class One(_Filler):
    """Fills with 1."""

    def _init_weight(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.ones(shape)


class Constant(_Filler):
    """Fills with ``value`` (a number, or an array broadcast to the shape)."""

    def __init__(self, value: Any) -> None:
        super().__init__(value=value.tolist() if isinstance(value, np.ndarray) else value)
        self.value = value

    def _init_weight(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.broadcast_to(np.asarray(self.value, np.float64), shape).copy()


class Uniform(Initializer):
    """Weights from U(-scale, scale)."""

    def __init__(self, scale: float = 0.07) -> None:
        super().__init__(scale=scale)
        self.scale = scale

    def _init_weight(self, shape: tuple[int, ...]) -> np.ndarray:
        return generator().uniform(-self.scale, self.scale, shape)


class Normal(Initializer):
    """Weights from N(0, sigma²)."""

    def __init__(self, sigma: float = 0.01) -> None:
        super().__init__(sigma=sigma)
        self.sigma = sigma

    def _init_weight(self, shape: tuple[int, ...]) -> np.ndarray:
        return generator().normal(0.0, self.sigma, shape)


class Xavier(Initializer):
    """Glorot initialization: scale ``sqrt(magnitude / factor)`` from the fans of the shape."""

    def __init__(self, rnd_type: str = "uniform", factor_type: str = "avg",
                 magnitude: float = 3) -> None:
        super().__init__(rnd_type=rnd_type, factor_type=factor_type, magnitude=magnitude)
        if rnd_type not in ("uniform", "gaussian"):
            raise ValueError(f"Xavier: rnd_type must be 'uniform' or 'gaussian', got {rnd_type!r}")
        if factor_type not in ("avg", "in", "out"):
            raise ValueError(f"Xavier: factor_type must be 'avg', 'in' or 'out', "
                             f"got {factor_type!r}")
        self.rnd_type, self.factor_type, self.magnitude = rnd_type, factor_type, float(magnitude)

    def _init_weight(self, shape: tuple[int, ...]) -> np.ndarray:
        if len(shape) < 2:
            raise ValueError(f"Xavier needs a weight with at least 2 dimensions, got shape "
                             f"{shape}; use Normal or Uniform for 1-D parameters")
        receptive = math.prod(shape[2:])
        fan_in, fan_out = shape[1] * receptive, shape[0] * receptive
        factor = {"avg": (fan_in + fan_out) / 2.0, "in": fan_in, "out": fan_out}[self.factor_type]
        scale = math.sqrt(self.magnitude / factor)
        if self.rnd_type == "uniform":
            return generator().uniform(-scale, scale, shape)
        return generator().normal(0.0, scale, shape)


class MSRAPrelu(Xavier):
    """He initialization for (P)ReLU networks: Gaussian Xavier with magnitude 2/(1+slope²)."""

    def __init__(self, factor_type: str = "avg", slope: float = 0.25) -> None:
        super().__init__("gaussian", factor_type, 2.0 / (1 + slope ** 2))
        self._kwargs = {"factor_type": factor_type, "slope": slope}


_BY_NAME: dict[str, type[Initializer]] = {
    "zeros": Zero, "zero": Zero, "ones": One, "one": One, "uniform": Uniform, "normal": Normal,
    "xavier": Xavier, "msraprelu": MSRAPrelu, "constant": Constant}


def create(init: Initializer | str | None) -> Initializer | None:
    """An initializer from an instance, a registered name (``'zeros'``) or its ``dumps()`` text."""
    if init is None or isinstance(init, Initializer):
        return init
    if isinstance(init, str):
        text = init.strip()
        if text.startswith("["):
            name, kwargs = json.loads(text)
            return _BY_NAME[name.lower()](**kwargs)
        if text.lower() in _BY_NAME:
            return _BY_NAME[text.lower()]()
        raise ValueError(f"unknown initializer {init!r}; known names: {', '.join(_BY_NAME)}")
    raise TypeError(f"init must be an Initializer or a name, got {type(init).__name__}")


__all__ = ["Constant", "Initializer", "MSRAPrelu", "Normal", "One", "Uniform", "Xavier", "Zero",
           "create"]
