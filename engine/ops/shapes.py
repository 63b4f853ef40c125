"""Shape-inference helpers shared by operator definitions.

Shapes are tuples of ints; ``None`` is an unknown shape and a 0 dimension is unknown (MXNet's
legacy convention, which the graph reader also uses for NumPy-mode ``-1``).
"""

from __future__ import annotations

from engine.errors import ShapeError
from engine.ops.registry import Attrs, MaybeShape, Shape

# A shape rule's result: the input shapes (unknown ones filled in where it can), the outputs'.
Inferred = tuple[list[MaybeShape], list[MaybeShape]]


def is_known(shape: MaybeShape) -> bool:
    """A shape with every dimension known."""
    return shape is not None and all(dim > 0 for dim in shape)


def merge(first: MaybeShape, second: MaybeShape, what: str = "shapes") -> MaybeShape:
    """Unify two partially known shapes; raise `ShapeError` when they disagree."""
    if first is None:
        return second
    if second is None:
        return first
    if len(first) != len(second):
        raise ShapeError(f"{what} disagree: {first} vs {second}")
    merged = []
    for a, b in zip(first, second):
        if a and b and a != b:
            raise ShapeError(f"{what} disagree: {first} vs {second}")
        merged.append(a or b)
    return tuple(merged)


def same_shape(attrs: Attrs, shapes: list[MaybeShape]) -> Inferred:
    """Elementwise ops: every input and the output have one shape."""
    common: MaybeShape = None
    for shape in shapes:
        common = merge(common, shape, "elementwise input shapes")
    return [common] * len(shapes), [common]


def broadcast(first: Shape, second: Shape) -> Shape:
    """NumPy broadcasting of two known shapes; raise `ShapeError` if they do not broadcast."""
    length = max(len(first), len(second))
    a = (1,) * (length - len(first)) + tuple(first)
    b = (1,) * (length - len(second)) + tuple(second)
    result = []
    for x, y in zip(a, b):
        if x != y and x != 1 and y != 1:
            raise ShapeError(f"shapes {tuple(first)} and {tuple(second)} do not broadcast")
        result.append(y if x == 1 else x)
    return tuple(result)


def broadcast_shapes(attrs: Attrs,
                     shapes: list[MaybeShape]) -> tuple[list[MaybeShape], list[MaybeShape]]:
    """``broadcast_*`` ops: the output has the broadcast shape of all inputs."""
    if any(shape is None for shape in shapes):
        return shapes, [None]
    if not all(all(shape) for shape in shapes):  # type: ignore[arg-type]
        return shapes, [_broadcast_unknown(shapes)]  # type: ignore[arg-type]
    result: Shape = ()
    for shape in shapes:
        result = broadcast(result, shape)  # type: ignore[arg-type]
    return shapes, [result]


def _broadcast_unknown(shapes: list[Shape]) -> Shape:
    """The broadcast shape where some dimensions are unknown (0): a known size above 1 wins,
    an unknown one stays unknown unless every other size is 1 or unknown."""
    length = max(len(shape) for shape in shapes)
    padded = [(1,) * (length - len(shape)) + tuple(shape) for shape in shapes]
    result = []
    for sizes in zip(*padded):
        known = {size for size in sizes if size > 1}
        if len(known) > 1:
            raise ShapeError(f"shapes {', '.join(map(str, shapes))} do not broadcast")
        result.append(known.pop() if known else 0 if 0 in sizes else 1)
    return tuple(result)


def normalize_axis(axis: int, ndim: int, what: str = "axis") -> int:
    """A non-negative axis; raise `ShapeError` if out of range."""
    if not -ndim <= axis < max(ndim, 1):
        raise ShapeError(f"{what} {axis} is out of range for {ndim} dimensions")
    return axis % ndim if ndim else 0
