"""What a oneDNN fused node (``_sg_mkldnn_conv``, ``_sg_mkldnn_fully_connected``) carries in
its subgraph: the main layer's attributes, BatchNorm's, and the activations before and after
the residual sum. The subgraph's nodes are read as data; it is never run."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.errors import ModelFormatError
from engine.ops.math.stable_functions import erf
from engine.ops.registry import Attrs

ACTIVATIONS = ("Activation", "LeakyReLU", "clip")
# Activations whose results are never negative: a calibrated output is then uint8.
NON_NEGATIVE = ("relu", "sigmoid", "softrelu", "bounded_relu")


@dataclass(frozen=True)
class Activation:
    """One activation of a fused chain, as oneDNN's eltwise algorithm names it."""

    kind: str  # relu, sigmoid, tanh, softrelu, bounded_relu, leaky, elu, gelu
    alpha: float = 0.0

    def apply(self, values: np.ndarray) -> np.ndarray:
        """The activation on float32 ``values``."""
        return _FORMULAS[self.kind](values, np.float32(self.alpha)).astype(np.float32)


_FORMULAS: dict[str, Callable[[np.ndarray, np.float32], np.ndarray]] = {
    "relu": lambda x, a: np.maximum(x, 0),
    "sigmoid": lambda x, a: 1 / (1 + np.exp(-x)),
    "tanh": lambda x, a: np.tanh(x),
    "softrelu": lambda x, a: np.logaddexp(0, x),
    "bounded_relu": lambda x, a: np.clip(x, 0, a),
    "leaky": lambda x, a: np.where(x > 0, x, a * x),
    "elu": lambda x, a: np.where(x > 0, x, a * np.expm1(x)),
    "gelu": lambda x, a: 0.5 * x * (1 + erf(np, x / np.float32(math.sqrt(2)))),
}


@dataclass(frozen=True)
class FusedChain:
    """The subgraph of a fused node, read once."""

    main: Attrs  # Convolution's or FullyConnected's attributes
    batchnorm: Attrs | None
    act: Activation | None  # before the sum (or the only one)
    postsum_act: Activation | None


def read_chain(attrs: Attrs, main_op: str, op: str) -> FusedChain:
    """The chain of ``attrs``'s one subgraph, checked against the node's flags."""
    graphs = attrs.get("subgraphs", ())
    if len(graphs) != 1:
        raise ModelFormatError(f"{op}: needs one subgraph; the node has {len(graphs)}")
    main = batchnorm = None
    acts: list[Activation] = []
    for node in graphs[0].nodes:
        if node.op == main_op:
            main = node.params
        elif node.op == "BatchNorm":
            batchnorm = node.params
        elif node.op in ACTIVATIONS:
            acts.append(_activation(node.op, node.params, op))
        elif node.op not in ("null", "elemwise_add", "_plus", "_Plus", "add_n"):
            raise ModelFormatError(f"{op}: its subgraph holds {node.op!r}, which oneDNN does "
                                   f"not fuse into {main_op}")
    if main is None:
        raise ModelFormatError(f"{op}: its subgraph has no {main_op} node")
    with_act = any(attrs.get(flag, False) for flag in ("with_act", "with_eltwise", "with_relu"))
    act = acts.pop(0) if with_act and acts else None
    with_postsum = attrs.get("with_postsum_act", False) or attrs.get("with_postsum_relu", False)
    postsum = acts.pop(0) if with_postsum and acts else None
    return FusedChain(main, batchnorm, act, postsum)


def _activation(name: str, params: Any, op: str) -> Activation:
    if name == "clip":
        if params.a_min != 0:
            raise ModelFormatError(f"{op}: a fused clip must start at 0; got a_min={params.a_min}")
        return Activation("bounded_relu", params.a_max)
    if name == "Activation":
        return Activation(params.act_type)
    kind = params.act_type
    if kind not in ("leaky", "elu", "gelu"):
        raise ModelFormatError(f"{op}: LeakyReLU act_type {kind!r} is not fused by oneDNN")
    return Activation(kind, params.slope)


def fold_batchnorm(weight: np.ndarray, bias: np.ndarray | None, chain: FusedChain,
                   stats: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray | None]:
    """Weight and bias with inference BatchNorm folded in, in float32 as MXNet folds them
    (the scale ``gamma / sqrt(var + eps)`` taken in double, as its C++ does)."""
    if chain.batchnorm is None:
        return weight.astype(np.float32), None if bias is None else bias.astype(np.float32)
    gamma, beta, mean, var = (np.asarray(value, dtype=np.float32) for value in stats)
    if chain.batchnorm.fix_gamma:
        gamma = np.ones_like(gamma)
    alpha = (gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + chain.batchnorm.eps)
             ).astype(np.float32)
    base = np.zeros_like(mean) if bias is None else np.asarray(bias, dtype=np.float32)
    folded_bias = (beta + alpha * (base - mean)).astype(np.float32)
    shape = (-1,) + (1,) * (weight.ndim - 1)
    return (np.asarray(weight, dtype=np.float32) * alpha.reshape(shape)).astype(np.float32), \
        folded_bias
