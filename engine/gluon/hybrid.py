"""`HybridBlock`: ``hybrid_forward(F, x, ...)`` run imperatively (F = nd) or traced (F = sym).

After ``hybridize()``, the first call traces ``hybrid_forward`` with Symbols, builds a runtime
`Model` from the traced graph and the current parameter values (the same runtime
`engine.load_model` uses), and later calls only convert inputs and run the Model's compiled plan
for their signature. All hybridize state is one value, ``self._cached`` (a `CachedGraph`); a
changed parameter (``set_data``, ``initialize(force_reinit=True)``, loading) makes it rebuild the
Model on the next call.

Calls run on their inputs' context: parameters are read on it (they must have been initialized
there), and the compiled Model runs on that context's device, so a net initialized with
``ctx=engine.gpu(0)`` and called on GPU arrays compiles a GPU Model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine import nd, sym
from engine.context import Context, current_context
from engine.errors import EngineError
from engine.gluon.block import Block
from engine.gluon.parameter import _EPOCH, DeferredInitializationError, Parameter, parameter_epoch
from engine.gluon.trace import Traced, fill_deferred, input_names, rebuild, trace
from engine.nd.ndarray import NDArray
from engine.runtime.model import Model
from engine.sym import Symbol


@dataclass
class CachedGraph:
    """A traced graph, its parameters and the Model compiled for their current values."""

    traced: Traced
    params: list[Parameter]
    model: Model | None = None
    versions: tuple[int, ...] = ()
    epoch: int = -1
    optimize: bool | list[str] = True
    ctx: Context | None = None
    # The Model's input names when they differ from the traced ones (the graph reads its
    # inputs in another order, or not all of them), else None: the feed is reordered to match,
    # so that its signature is the one the Model's checked fast path knows.
    order: tuple[str, ...] | None = None

    def refresh(self, feed: dict[str, np.ndarray], ctx: Context) -> Model:
        """The Model for the current parameter values on ``ctx`` (rebuilt only on a change)."""
        epoch = parameter_epoch()
        if self.model is not None and self.epoch == epoch and self.ctx == ctx:
            return self.model
        graph = self.traced.graph()
        fill_deferred(self.traced, graph, {k: v.shape for k, v in feed.items()}, self.params)
        versions = tuple(param.version for param in self.params)
        if self.model is None or versions != self.versions or self.ctx != ctx:
            arrays = {param.name: _param_array(param, ctx) for param in self.params}
            self.model = Model(graph, arrays, optimize=self.optimize, device=ctx)
            order = tuple(self.model.input_names)
            self.order = None if order == tuple(self.traced.input_names) else order
            self.versions = versions
            self.ctx = ctx
        self.epoch = parameter_epoch()
        return self.model

    def run(self, feed: dict[str, np.ndarray], ctx: Context) -> list[np.ndarray]:
        """Outputs for ``feed`` (host arrays) through the compiled plan of its signature."""
        model = self.model
        if model is None or self.epoch != _EPOCH[0] or (ctx is not self.ctx and ctx != self.ctx):
            model = self.refresh(feed, ctx)
        if self.order is not None:
            feed = {name: feed[name] for name in self.order}
        return model.run(feed)


def _param_array(param: Parameter, ctx: Context) -> np.ndarray:
    """The host value of ``param``, checked to be initialized on ``ctx``."""
    array = param.array()
    if array is None or ctx not in param.list_ctx():
        param.data(ctx)  # raises the error that says how to initialize it (and where)
    return array  # type: ignore[return-value]


def has_symbol(values: Any) -> bool:
    """Whether any (nested) value is a Symbol."""
    for value in values:
        if isinstance(value, Symbol):
            return True
        if isinstance(value, (list, tuple)) and has_symbol(value):
            return True
    return False


class HybridBlock(Block):
    """A block whose ``hybrid_forward(self, F, x, *args, **params)`` works on NDArrays and Symbols.

    Example:
        >>> class Net(HybridBlock):
        ...     def __init__(self, **kwargs):
        ...         super().__init__(**kwargs)
        ...         with self.name_scope():
        ...             self.fc = nn.Dense(2)
        ...     def hybrid_forward(self, F, x):
        ...         return self.fc(F.relu(x))
        >>> net = Net(); net.initialize(); net.hybridize(); y = net(nd.ones((1, 4)))
    """

    def __init__(self, prefix: str | None = None, params: Any = None) -> None:
        super().__init__(prefix, params)
        self._active = False
        self._flags: dict[str, Any] = {}
        self._cached: CachedGraph | None = None

    def hybridize(self, active: bool = True, static_alloc: bool = False,
                  static_shape: bool = False, **kwargs: Any) -> None:
        """Compile this block (and its children) at the next call; ``active=False`` undoes it.

        ``static_alloc``/``static_shape`` are accepted for MXNet compatibility: compiled plans
        always preallocate their buffers and are cached per input signature. ``optimize=``
        (a keyword, default True) selects compiler passes as in `engine.load_model`.
        """
        self._active = active
        self._flags = {"static_alloc": static_alloc, "static_shape": static_shape, **kwargs}
        self._cached = None
        super().hybridize(active, static_alloc=static_alloc, static_shape=static_shape, **kwargs)

    def cast(self, dtype: Any) -> None:
        """Cast parameters to ``dtype`` and drop the compiled graph."""
        self._cached = None
        super().cast(dtype)

    def hybrid_forward(self, F: Any, x: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N803
        """The computation, written once for ``F`` = `engine.nd` and ``F`` = `engine.sym`."""
        raise NotImplementedError(f"{type(self).__name__} must define hybrid_forward()")

    def forward(self, x: Any, *args: Any) -> Any:
        """Symbols in: a Symbol out. Arrays in: run imperatively, or the compiled graph."""
        if isinstance(x, Symbol) or has_symbol(args):
            return self._call_symbolic(x, *args)
        if self._active:
            return self._call_cached(x, *args)
        return self._call_imperative(x, *args)

    def _call_symbolic(self, *args: Any) -> Any:
        with self.name_scope():
            params = {key: param.var() for key, param in self._reg_params.items()}
            return self.hybrid_forward(sym, *args, **params)

    def _call_imperative(self, *args: Any) -> Any:
        ctx = input_context(args, type(self).__name__)
        try:
            params = {key: param.data(ctx) for key, param in self._reg_params.items()}
        except DeferredInitializationError:
            self._infer_deferred(args)
            params = {key: param.data(ctx) for key, param in self._reg_params.items()}
        return self.hybrid_forward(nd, *args, **params)

    def _infer_deferred(self, args: tuple[Any, ...]) -> None:
        """Learn this block's deferred parameter shapes by tracing it on the inputs' shapes."""
        arrays = [arg for arg in args if isinstance(arg, NDArray)]
        traced = self._trace(len(arrays))
        shapes = dict(zip(traced.input_names, (array.shape for array in arrays)))
        fill_deferred(traced, traced.graph(), shapes, list(self._reg_params.values()))

    def _trace(self, count: int) -> Traced:
        return trace(self._call_symbolic, input_names(count))

    def infer_shape(self, *args: Any) -> None:
        """Complete deferred parameter shapes from example inputs (NDArrays)."""
        self._infer_deferred(args)

    # --- the compiled path -----------------------------------------------------------------
    def _call_cached(self, *args: Any) -> Any:
        cached = self._cached
        if cached is None or len(cached.traced.input_names) != len(args):
            cached = self._cached = self._build_cache(len(args))
        ctx = input_context(args, type(self).__name__)
        if ctx.device_type == "cpu":
            feed = {name: arg._data if type(arg) is NDArray else _as_array(arg, name)
                    for name, arg in zip(cached.traced.input_names, args)}
        else:  # the Model's plans take host arrays and stage them onto the device themselves
            feed = {name: arg.asnumpy() if isinstance(arg, NDArray) else _as_array(arg, name)
                    for name, arg in zip(cached.traced.input_names, args)}
        outputs = cached.run(feed, ctx)
        template = cached.traced.template
        if type(template) is int:
            return NDArray(outputs[0], ctx)
        return rebuild(template, [NDArray(output, ctx) for output in outputs])

    def _build_cache(self, count: int) -> CachedGraph:
        traced = self._trace(count)
        graph_vars = set(traced.symbol.list_inputs())
        params = [param for param in self.collect_params().values() if param.name in graph_vars]
        return CachedGraph(traced, params, optimize=self._flags.get("optimize", True))

    def export(self, path: str | os.PathLike[str], epoch: int = 0,
               remove_amp_cast: bool = True) -> tuple[str, str]:
        """Write ``path-symbol.json`` and ``path-EPOCH.params`` (``arg:``/``aux:`` names).

        Raises:
            EngineError: the block has not been hybridized and run once yet.
        """
        from engine.graph.params import save_params

        if self._cached is None:
            raise EngineError(f"{type(self).__name__}.export: nothing to export yet; call "
                              "hybridize() and run a forward pass (net(x)) first, so that the "
                              "graph is traced")
        symbol = self._cached.traced.symbol
        graph = symbol.to_graph()
        aux = set(graph.aux_variable_names())
        variables = set(graph.variable_names())
        arrays = {}
        for param in self.collect_params().values():
            if param.name in variables:
                kind = "aux" if param.name in aux else "arg"
                arrays[f"{kind}:{param.name}"] = param.data().asnumpy()
        base = os.fspath(path)
        symbol_file, params_file = f"{base}-symbol.json", f"{base}-{epoch:04d}.params"
        symbol.save(symbol_file)
        save_params(params_file, arrays)
        return symbol_file, params_file


def input_context(args: tuple[Any, ...], where: str) -> Context:
    """The context of a call's NDArray inputs (the current context when there are none).

    Raises:
        EngineError: the inputs are on different contexts.
    """
    ctx = None
    for position, arg in enumerate(args):
        if isinstance(arg, NDArray):
            if ctx is None:
                ctx, first = arg.context, position
            elif arg.context != ctx:
                raise EngineError(f"{where}: input {position} is on {arg.context} but input "
                                  f"{first} is on {ctx}; all inputs of a block must be on the "
                                  f"same context (move them with .as_in_context({ctx}))")
    return current_context() if ctx is None else ctx


def _as_array(value: Any, name: str) -> np.ndarray:
    if isinstance(value, NDArray):
        return value._data
    if isinstance(value, np.ndarray):
        return value
    raise TypeError(f"input {name!r}: expected an NDArray (or a Symbol to build a graph), got "
                    f"{type(value).__name__}")
