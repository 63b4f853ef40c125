"""Activation layers: ``Activation``, ``LeakyReLU``, ``PReLU``, ``ELU``, ``SELU``, ``GELU``, ...

Each writes the node MXNet's Gluon layer writes (``relu0_fwd`` as ``Activation``, ``LeakyReLU``
with its ``act_type``), so exported graphs match.
"""

from __future__ import annotations

from typing import Any

from engine.gluon import initializer
from engine.gluon.hybrid import HybridBlock


class Activation(HybridBlock):
    """``F.Activation(x, act_type=...)``; its prefix is the activation's name (``relu0_``)."""

    def __init__(self, activation: str, **kwargs: Any) -> None:
        self._act_type = activation
        super().__init__(**kwargs)

    def _alias(self) -> str:
        return self._act_type

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803
        return F.Activation(x, act_type=self._act_type, name="fwd")

    def __repr__(self) -> str:
        return f"Activation({self._act_type})"


class LeakyReLU(HybridBlock):
    """``max(x, alpha * x)``."""

    def __init__(self, alpha: float, **kwargs: Any) -> None:
        if alpha < 0:
            raise ValueError(f"LeakyReLU: alpha must be >= 0, got {alpha}")
        super().__init__(**kwargs)
        self._alpha = alpha

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803
        return F.LeakyReLU(x, act_type="leaky", slope=self._alpha, name="fwd")


class PReLU(HybridBlock):
    """Leaky ReLU with a learned slope per channel (``alpha``, initialized to 0.25)."""

    def __init__(self, alpha_initializer: Any = None, in_channels: int = 1,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        with self.name_scope():
            self.alpha = self.params.get("alpha", shape=(in_channels,),
                                         init=alpha_initializer or initializer.Constant(0.25))

    def hybrid_forward(self, F: Any, x: Any, alpha: Any) -> Any:  # noqa: N803
        return F.LeakyReLU(x, gamma=alpha, act_type="prelu", name="fwd")


class ELU(HybridBlock):
    """``x`` for x > 0, ``alpha * (exp(x) - 1)`` otherwise."""

    def __init__(self, alpha: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._alpha = alpha

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803
        return F.LeakyReLU(x, act_type="elu", slope=self._alpha)


class SELU(HybridBlock):
    """Scaled ELU."""

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803
        return F.LeakyReLU(x, act_type="selu", name="fwd")


class GELU(HybridBlock):
    """Gaussian error linear unit (erf form)."""

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803
        return F.LeakyReLU(x, act_type="gelu", name="fwd")


class Swish(HybridBlock):
    """``x * sigmoid(beta * x)``."""

    def __init__(self, beta: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._beta = beta

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803
        return x * F.sigmoid(self._beta * x, name="fwd")
