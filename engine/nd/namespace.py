"""NumPy-mode sub-namespaces (``F.npx``, ``F.np``) resolving names to registry ops.

``F.npx.relu`` looks for ``_npx_relu`` and then ``relu``; ``F.np.add`` for ``_np_add``,
``_npi_add`` and then ``add``. The same class serves `nd` (imperative functions) and `sym`
(symbolic ones): it only needs a way to make the function for a registered name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from engine.ops.registry import all_ops, has_op

NPX_PREFIXES = ("_npx_", "")
NP_PREFIXES = ("_np_", "_npi_", "")


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
