"""The front ends' namespaces: every registry op as a module function, and the NumPy-mode
sub-namespaces (``F.npx``, ``F.np``) resolving names to registry ops.

`fill_module` fills `engine.nd` or `engine.sym` with one function per op and gives it the
module ``__getattr__`` that makes the rest on first use. ``F.npx.relu`` looks for ``_npx_relu``
and then ``relu``; ``F.np.add`` for ``_np_add``, ``_npi_add`` and then ``add``. The same code
serves `nd` (imperative functions) and `sym` (symbolic ones): it only needs a way to make the
function for a registered name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from engine.ops.registry import OpDef, all_ops, get_op, has_op

NPX_PREFIXES = ("_npx_", "")
NP_PREFIXES = ("_np_", "_npi_", "")

OpFunction = Callable[[str, OpDef], Callable[..., Any]]


def fill_module(namespace: dict[str, Any], module: str, op_function: OpFunction,
                handwritten: set[str]) -> tuple[Callable[[str], Any], Callable[[str], Any]]:
    """Put a function for every registered op in ``namespace`` (a front end's globals), except
    the ``handwritten`` names it defines itself. Returns ``(make, module_getattr)``: the
    function for a registered name (the module's own where it has one), and the module's
    ``__getattr__``, which makes a function for a name registered later."""
    for name, opdef in all_ops().items():
        if name not in handwritten and name.isidentifier():
            namespace[name] = op_function(name, opdef)

    def make(name: str) -> Callable[..., Any]:
        if name in namespace and name not in handwritten:
            return namespace[name]
        return op_function(name, get_op(name))

    def module_getattr(name: str) -> Any:
        if not name.startswith("__") and has_op(name):
            namespace[name] = function = op_function(name, get_op(name))
            return function
        raise AttributeError(f"module {module!r} has no attribute {name!r} (and no registry op "
                             "of that name)")

    return make, module_getattr


class OpNamespace:
    """Attribute access resolves ``name`` to the first registered ``prefix + name``."""

    def __init__(self, name: str, prefixes: tuple[str, ...],
                 make: Callable[[str], Callable[..., Any]],
                 extra: Mapping[str, Any] | None = None) -> None:
        self.__name__ = name
        self._prefixes = prefixes
        self._make = make
        self._extra = dict(extra or {})
        self._cache: dict[str, Callable[..., Any]] = {}

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        if attribute in self._extra:
            return self._extra[attribute]
        if attribute not in self._cache:
            for prefix in self._prefixes:
                if has_op(prefix + attribute):
                    self._cache[attribute] = self._make(prefix + attribute)
                    break
            else:
                tried = ", ".join(prefix + attribute for prefix in self._prefixes)
                raise AttributeError(f"{self.__name__} has no operator {attribute!r} "
                                     f"(looked for registry ops {tried})")
        return self._cache[attribute]

    def __dir__(self) -> list[str]:
        names = set(self._extra)
        for registered in all_ops():
            for prefix in self._prefixes:
                if prefix and registered.startswith(prefix):
                    names.add(registered[len(prefix):])
        return sorted(names)

    def __repr__(self) -> str:
        return f"<namespace {self.__name__}>"
