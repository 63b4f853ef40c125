"""Containers and basic layers: ``Sequential``, ``HybridSequential``, ``Dense``, ``Dropout``,
``BatchNorm``, ``LayerNorm``, ``InstanceNorm``, ``Embedding``, ``Flatten``, ``Lambda``, ...

Parameter names, node names and node attributes follow MXNet 1.9's Gluon layers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.gluon.block import Block
from engine.gluon.hybrid import HybridBlock
from engine.gluon.nn.activations import Activation


class Sequential(Block):
    """Runs its children one after another (imperatively)."""

    def __init__(self, prefix: str | None = None, params: Any = None) -> None:
        super().__init__(prefix=prefix, params=params)

    def add(self, *blocks: Block) -> None:
        """Append blocks."""
        for block in blocks:
            self.register_child(block)

    def forward(self, x: Any, *args: Any) -> Any:
        for block in self._children.values():
            x = block(x, *args)
            args = ()
        return x

    def __getitem__(self, key: int | slice) -> Any:
        layers = list(self._children.values())[key]
        if not isinstance(key, slice):
            return layers
        net = type(self)(prefix=self.prefix)
        with net.name_scope():
            net.add(*layers)
        return net

    def __len__(self) -> int:
        return len(self._children)


class HybridSequential(HybridBlock):
    """Runs its hybrid children one after another; hybridizes as one graph."""

    def __init__(self, prefix: str | None = None, params: Any = None) -> None:
        super().__init__(prefix=prefix, params=params)

    add = Sequential.add
    __getitem__ = Sequential.__getitem__
    __len__ = Sequential.__len__

    def hybrid_forward(self, F: Any, x: Any, *args: Any) -> Any:  # noqa: N803
        for block in self._children.values():
            x = block(x, *args)
            args = ()
        return x


class Dense(HybridBlock):
    """``activation(dot(x, weight.T) + bias)``; ``in_units`` is learned at the first call if 0."""

    def __init__(self, units: int, activation: str | None = None, use_bias: bool = True,
                 flatten: bool = True, dtype: Any = "float32", weight_initializer: Any = None,
                 bias_initializer: Any = "zeros", in_units: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._units, self._in_units, self._flatten = units, in_units, flatten
        with self.name_scope():
            self.weight = self.params.get("weight", shape=(units, in_units),
                                          init=weight_initializer, dtype=dtype,
                                          allow_deferred_init=True)
            self.bias = (self.params.get("bias", shape=(units,), init=bias_initializer,
                                         dtype=dtype, allow_deferred_init=True)
                         if use_bias else None)
            self.act = Activation(activation, prefix=activation + "_") if activation else None

    def hybrid_forward(self, F: Any, x: Any, weight: Any, bias: Any = None) -> Any:  # noqa: N803
        out = F.FullyConnected(x, weight, bias, no_bias=bias is None, num_hidden=self._units,
                               flatten=self._flatten, name="fwd")
        return self.act(out) if self.act is not None else out

    def __repr__(self) -> str:
        shape = self.weight.shape
        return f"Dense({shape[1] or None} -> {shape[0]}, {self.act or 'linear'})"


class Dropout(HybridBlock):
    """Dropout; the identity at inference."""

    def __init__(self, rate: float, axes: tuple[int, ...] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._rate, self._axes = rate, tuple(axes)

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803
        if self._rate > 0:
            return F.Dropout(x, p=self._rate, axes=self._axes, name="fwd", cudnn_off=False)
        return F.identity(x)


class BatchNorm(HybridBlock):
    """Batch normalization with running statistics (used at inference)."""

    def __init__(self, axis: int = 1, momentum: float = 0.9, epsilon: float = 1e-5,
                 center: bool = True, scale: bool = True, use_global_stats: bool = False,
                 beta_initializer: Any = "zeros", gamma_initializer: Any = "ones",
                 running_mean_initializer: Any = "zeros",
                 running_variance_initializer: Any = "ones", in_channels: int = 0,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._kwargs = {"axis": axis, "eps": epsilon, "momentum": momentum,
                        "fix_gamma": not scale, "use_global_stats": use_global_stats}
        shape = (in_channels,)
        with self.name_scope():
            self.gamma = self.params.get("gamma", grad_req="write" if scale else "null",
                                         shape=shape, init=gamma_initializer,
                                         allow_deferred_init=True, differentiable=scale)
            self.beta = self.params.get("beta", grad_req="write" if center else "null",
                                        shape=shape, init=beta_initializer,
                                        allow_deferred_init=True, differentiable=center)
            self.running_mean = self.params.get("running_mean", grad_req="null", shape=shape,
                                                init=running_mean_initializer,
                                                allow_deferred_init=True, differentiable=False)
            self.running_var = self.params.get("running_var", grad_req="null", shape=shape,
                                               init=running_variance_initializer,
                                               allow_deferred_init=True, differentiable=False)

    def hybrid_forward(self, F: Any, x: Any, gamma: Any, beta: Any, running_mean: Any,  # noqa: N803
                       running_var: Any) -> Any:
        return F.BatchNorm(x, gamma, beta, running_mean, running_var, name="fwd", **self._kwargs)


def _add_gamma_beta(block: HybridBlock, in_channels: int, gamma_initializer: Any,
                    beta_initializer: Any, scale: bool, center: bool) -> None:
    """A normalization layer's per-channel scale ``gamma`` and shift ``beta``."""
    with block.name_scope():
        block.gamma = block.params.get("gamma", shape=(in_channels,), init=gamma_initializer,
                                       allow_deferred_init=True, differentiable=scale)
        block.beta = block.params.get("beta", shape=(in_channels,), init=beta_initializer,
                                      allow_deferred_init=True, differentiable=center)


class LayerNorm(HybridBlock):
    """Layer normalization over ``axis``."""

    def __init__(self, axis: int = -1, epsilon: float = 1e-5, center: bool = True,
                 scale: bool = True, beta_initializer: Any = "zeros",
                 gamma_initializer: Any = "ones", in_channels: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._axis, self._epsilon = axis, epsilon
        _add_gamma_beta(self, in_channels, gamma_initializer, beta_initializer, scale, center)

    def hybrid_forward(self, F: Any, data: Any, gamma: Any, beta: Any) -> Any:  # noqa: N803
        return F.LayerNorm(data, gamma=gamma, beta=beta, axis=self._axis, eps=self._epsilon)


class InstanceNorm(HybridBlock):
    """Instance normalization (per sample and channel)."""

    def __init__(self, axis: int = 1, epsilon: float = 1e-5, center: bool = True,
                 scale: bool = False, beta_initializer: Any = "zeros",
                 gamma_initializer: Any = "ones", in_channels: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._axis, self._epsilon = axis, epsilon
        _add_gamma_beta(self, in_channels, gamma_initializer, beta_initializer, scale, center)

    def hybrid_forward(self, F: Any, x: Any, gamma: Any, beta: Any) -> Any:  # noqa: N803
        if self._axis == 1:
            return F.InstanceNorm(x, gamma, beta, name="fwd", eps=self._epsilon)
        x = x.swapaxes(1, self._axis) if hasattr(x, "swapaxes") else F.swapaxes(
            x, dim1=1, dim2=self._axis)
        out = F.InstanceNorm(x, gamma, beta, name="fwd", eps=self._epsilon)
        return F.swapaxes(out, dim1=1, dim2=self._axis)


class Embedding(HybridBlock):
    """Looks up rows of a ``(input_dim, output_dim)`` weight by integer index."""

    def __init__(self, input_dim: int, output_dim: int, dtype: Any = "float32",
                 weight_initializer: Any = None, sparse_grad: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._kwargs = {"input_dim": input_dim, "output_dim": output_dim, "dtype": dtype,
                        "sparse_grad": sparse_grad}
        with self.name_scope():
            self.weight = self.params.get("weight", shape=(input_dim, output_dim),
                                          init=weight_initializer, dtype=dtype,
                                          allow_deferred_init=True)

    def hybrid_forward(self, F: Any, x: Any, weight: Any) -> Any:  # noqa: N803
        return F.Embedding(x, weight, name="fwd", **self._kwargs)


class Flatten(HybridBlock):
    """Collapses all axes but the first."""

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803
        return F.Flatten(x)


class Identity(HybridBlock):
    """Returns its input."""

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803
        return x


class Lambda(Block):
    """Wraps a function of NDArrays (or the name of an ``nd`` function) as a Block."""

    def __init__(self, function: Callable[..., Any] | str, prefix: str | None = None) -> None:
        super().__init__(prefix=prefix)
        if isinstance(function, str):
            from engine import nd

            function = getattr(nd, function)
        self._func = function

    def forward(self, *args: Any) -> Any:
        return self._func(*args)


class HybridLambda(HybridBlock):
    """Wraps ``function(F, x, ...)`` (or the name of an op) as a HybridBlock."""

    def __init__(self, function: Callable[..., Any] | str, prefix: str | None = None) -> None:
        super().__init__(prefix=prefix)
        if isinstance(function, str):
            name = function
            self._func: Callable[..., Any] = lambda F, *args: getattr(F, name)(*args)  # noqa: N803
            self._func_name = name
        else:
            self._func = function
            self._func_name = getattr(function, "__name__", "lambda")

    def hybrid_forward(self, F: Any, x: Any, *args: Any) -> Any:  # noqa: N803
        return self._func(F, x, *args)


class Concurrent(Sequential):
    """Runs every child on the same input and concatenates the outputs along ``axis``."""

    def __init__(self, axis: int = -1, prefix: str | None = None, params: Any = None) -> None:
        super().__init__(prefix=prefix, params=params)
        self.axis = axis

    def forward(self, x: Any) -> Any:
        from engine import nd

        return nd.concat(*[block(x) for block in self._children.values()], dim=self.axis)


class HybridConcurrent(HybridSequential):
    """Runs every child on the same input and concatenates the outputs along ``axis``."""

    def __init__(self, axis: int = -1, prefix: str | None = None, params: Any = None) -> None:
        super().__init__(prefix=prefix, params=params)
        self.axis = axis

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803
        return F.concat(*[block(x) for block in self._children.values()], dim=self.axis)
