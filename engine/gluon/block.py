"""`Block`: the imperative building unit — children, parameters, name scopes, saving/loading.

Children and parameters are registered by assigning them as attributes. ``save_parameters``
writes structural names (``0.weight``, ``hidden.bias``), as MXNet 1.9 does; ``load_parameters``
reads those, full names (``dense0_weight``, with or without ``arg:``/``aux:``) and the legacy
prefix-stripped names of ``save_params``.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from engine.gluon.parameter import (
    Parameter,
    ParameterDict,
    assign_arrays,
    select_params,
    strip_arg_aux,
)
from engine.gluon.scope import BlockScope, current_scope, make_prefix


class Block:
    """Base class of all layers and models; subclasses define ``forward``.

    Example:
        >>> class Net(Block):
        ...     def __init__(self, **kwargs):
        ...         super().__init__(**kwargs)
        ...         with self.name_scope():
        ...             self.dense = nn.Dense(10)
        ...     def forward(self, x):
        ...         return self.dense(x)
    """

    def __init__(self, prefix: str | None = None, params: ParameterDict | None = None) -> None:
        self._prefix = make_prefix(prefix, self._alias())
        self._name = self._prefix[:-1] if self._prefix.endswith("_") else self._prefix
        self._params = ParameterDict(self._prefix, params)
        self._scope = BlockScope(self._prefix, transparent=prefix == "")
        self._children: OrderedDict[str, Block] = OrderedDict()
        self._reg_params: OrderedDict[str, Parameter] = OrderedDict()
        self._forward_hooks: list[Callable[..., Any]] = []
        self._forward_pre_hooks: list[Callable[..., Any]] = []

    def _alias(self) -> str:
        return type(self).__name__.lower()

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, Block) and "_children" in self.__dict__:
            self.register_child(value, name)
        elif isinstance(value, Parameter) and "_reg_params" in self.__dict__:
            self._reg_params[name] = value
            self._params.update({value.name: value})
        object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}("]
        for key, child in self._children.items():
            body = repr(child).replace("\n", "\n  ")
            lines.append(f"  ({key}): {body}")
        return "\n".join(lines) + "\n)" if self._children else f"{type(self).__name__}()"

    # --- structure -------------------------------------------------------------------------
    @property
    def prefix(self) -> str:
        """The prefix of this block's parameter and node names (``dense0_``)."""
        return self._prefix

    @property
    def name(self) -> str:
        """The prefix without its trailing underscore."""
        return self._name

    @property
    def params(self) -> ParameterDict:
        """This block's own parameters (not its children's)."""
        return self._params

    def name_scope(self) -> BlockScope:
        """``with block.name_scope():`` — blocks created inside get this block's prefix."""
        return self._scope

    def register_child(self, block: Block, name: str | None = None) -> None:
        """Add ``block`` as a child under ``name`` (its position by default)."""
        self._children[name if name is not None else str(len(self._children))] = block

    def collect_params(self, select: str | None = None) -> ParameterDict:
        """This block's and every descendant's parameters; ``select`` is a regex on names."""
        found = ParameterDict(self._prefix)
        found.update(select_params(self._params, select))
        for child in self._children.values():
            found.update(child.collect_params(select))
        return found

    def _collect_params_with_prefix(self, prefix: str = "") -> dict[str, Parameter]:
        if prefix:
            prefix += "."
        found = {prefix + key: param for key, param in self._reg_params.items()}
        for name, child in self._children.items():
            found.update(child._collect_params_with_prefix(prefix + name))
        return found

    def initialize(self, init: Any = None, ctx: Any = None, verbose: bool = False,
                   force_reinit: bool = False) -> None:
        """Initialize every parameter (``init`` defaults to ``Uniform(0.07)`` as in MXNet).

        ``ctx`` (a context or a list; the current context by default) is where the parameters
        live: ``net.initialize(ctx=engine.gpu(0))`` puts them on the first GPU.

        Raises:
            EngineError: ``ctx`` names a GPU and CuPy or the GPU is missing.
        """
        self.collect_params().initialize(init, ctx, verbose, force_reinit)

    def hybridize(self, active: bool = True, **kwargs: Any) -> None:
        """Hybridize every hybrid descendant (a plain Block itself stays imperative)."""
        for child in self._children.values():
            child.hybridize(active, **kwargs)

    def reset_ctx(self, ctx: Any) -> None:
        """Move every parameter of this block and its descendants to ``ctx``."""
        self.collect_params().reset_ctx(ctx)

    def cast(self, dtype: Any) -> None:
        """Cast every parameter to ``dtype``."""
        for child in self._children.values():
            child.cast(dtype)
        for param in self._reg_params.values():
            param.cast(dtype)

    def apply(self, fn: Callable[[Block], Any]) -> Block:
        """Call ``fn`` on every descendant and then on this block."""
        for child in self._children.values():
            child.apply(fn)
        fn(self)
        return self

    # --- calling ---------------------------------------------------------------------------
    def register_forward_hook(self, hook: Callable[..., Any]) -> None:
        """Call ``hook(block, inputs, output)`` after each forward."""
        self._forward_hooks.append(hook)

    def register_forward_pre_hook(self, hook: Callable[..., Any]) -> None:
        """Call ``hook(block, inputs)`` before each forward."""
        self._forward_pre_hooks.append(hook)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not (self._forward_hooks or self._forward_pre_hooks):
            return self.forward(*args, **kwargs)
        for hook in self._forward_pre_hooks:
            hook(self, args)
        out = self.forward(*args, **kwargs)
        for hook in self._forward_hooks:
            hook(self, args, out)
        return out

    def forward(self, *args: Any) -> Any:
        """The computation; override in subclasses."""
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    # --- saving and loading ----------------------------------------------------------------
    def save_parameters(self, filename: str | os.PathLike[str], deduplicate: bool = False) -> None:
        """Write parameters under structural names (``0.weight``) in the .params format."""
        from engine.graph.params import save_params

        arrays: dict[str, Any] = {}
        seen: set[int] = set()
        for name, param in self._collect_params_with_prefix().items():
            if deduplicate and id(param) in seen:
                continue
            seen.add(id(param))
            arrays[name] = param.data().asnumpy()
        save_params(os.fspath(filename), arrays)

    def load_parameters(self, filename: str | os.PathLike[str], ctx: Any = None,
                        allow_missing: bool = False, ignore_extra: bool = False,
                        cast_dtype: bool = False, dtype_source: str = "current") -> None:
        """Load values saved by ``save_parameters``, ``save_params`` or ``export``.

        Raises:
            EngineError: a parameter is missing from the file or the file has extra names
                (unless ``allow_missing``/``ignore_extra``).
            ShapeError: a stored array does not fit the parameter's shape.
        """
        from engine.graph.params import load_params

        source = os.fspath(filename)
        loaded = {strip_arg_aux(name): array
                  for name, array in load_params(source).as_dict().items()}
        structural = self._collect_params_with_prefix()
        full = dict(self.collect_params())
        if any(name in structural for name in loaded) or not full:
            params: dict[str, Parameter] = structural
        elif any(name in full for name in loaded):
            params = full
        else:
            params = {name[len(self.prefix):] if name.startswith(self.prefix) else name: param
                      for name, param in full.items()}
        assign_arrays(params, loaded, source, allow_missing, ignore_extra)
        if ctx is not None:  # otherwise each parameter keeps its contexts (cpu(0) if new)
            for param in params.values():
                param.reset_ctx(ctx)

    def save_params(self, filename: str | os.PathLike[str]) -> None:
        """Legacy: write full names with this block's prefix stripped (MXNet's ``save_params``)."""
        self.collect_params().save(filename, strip_prefix=self.prefix)

    def load_params(self, filename: str | os.PathLike[str], ctx: Any = None,
                    allow_missing: bool = False, ignore_extra: bool = False) -> None:
        """Legacy name of `load_parameters`."""
        self.load_parameters(filename, ctx, allow_missing, ignore_extra)


def in_scope() -> bool:
    """Whether a block scope is entered on this thread."""
    return current_scope() is not None
