"""What the kernels written in LLVM IR share: the `spin_pool` task's frame, loops, splats and
the masked vector intrinsics.

A task is ``name(context, part, parts)``: ``context`` the address of an int64 array the bind
fills (addresses, sizes, and clamp bounds as float64 bits), ``part`` of ``parts`` the share of
the work this call takes. `task` declares one and returns its entry builder; `fields` reads the
context's words by name.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import llvmlite.ir as ir

F32, F64, I64, I32, I1 = (ir.FloatType(), ir.DoubleType(), ir.IntType(64), ir.IntType(32),
                          ir.IntType(1))


def task(module: ir.Module, name: str) -> tuple[ir.Function, ir.IRBuilder, Any, Any, Any]:
    """``name(context, part, parts)`` declared in ``module``: the function, a builder at its
    entry block, and its three arguments."""
    function = ir.Function(module, ir.FunctionType(ir.VoidType(), [I64] * 3), name=name)
    context, part, parts = function.args
    return function, ir.IRBuilder(function.append_basic_block("entry")), context, part, parts


def fields(builder: ir.IRBuilder, context: Any,
           names: Iterable[str] | Mapping[str, int]) -> dict[str, Any]:
    """The context's int64 words by name: ``names`` in order, or a mapping of name to
    position."""
    positions = names if isinstance(names, Mapping) else {
        name: index for index, name in enumerate(names)}
    words = builder.inttoptr(context, I64.as_pointer())
    return {name: builder.load(builder.gep(words, [I64(index)]), align=8)
            for name, index in positions.items()}


def as_float(builder: ir.IRBuilder, word: Any) -> Any:
    """A context word holding a float64's bits, as a float32 (a clamp bound)."""
    return builder.fptrunc(builder.bitcast(word, F64), F32)


def splat(builder: ir.IRBuilder, scalar: Any, vector: ir.VectorType) -> Any:
    """``scalar`` in every lane of ``vector``."""
    undefined = ir.Constant(vector, ir.Undefined)
    single = builder.insert_element(undefined, scalar, I32(0))
    return builder.shuffle_vector(single, undefined,
                                  ir.Constant(ir.VectorType(I32, vector.count), [0] * vector.count))


def masked_load(module: ir.Module, vector: ir.VectorType, element: str) -> ir.Function:
    """``llvm.masked.load`` of ``vector`` (``element`` names its lanes' type, as "f32")."""
    mask = ir.VectorType(I1, vector.count)
    return ir.Function(module, ir.FunctionType(vector, [vector.as_pointer(), I32, mask, vector]),
                       name=f"llvm.masked.load.v{vector.count}{element}.p0")


def masked_store(module: ir.Module, vector: ir.VectorType, element: str) -> ir.Function:
    """``llvm.masked.store`` of ``vector``."""
    mask = ir.VectorType(I1, vector.count)
    return ir.Function(module, ir.FunctionType(ir.VoidType(), [vector, vector.as_pointer(), I32,
                                                               mask]),
                       name=f"llvm.masked.store.v{vector.count}{element}.p0")


class loop:  # noqa: N801 - used as a context manager, like a function's result
    """``for index in range(start, stop, step)`` around the body built inside the block;
    entering gives the index. `carrying_loop` carries values from one iteration to the next."""

    def __init__(self, builder: ir.IRBuilder, function: ir.Function, start: Any, stop: Any,
                 name: str, step: int = 1, carried: Iterable[Any] = ()) -> None:
        self.builder, self.function, self.start, self.stop = builder, function, start, stop
        self.name, self.step, self.initial = name, step, list(carried)
        self.following: list[Any] = []

    def __enter__(self) -> Any:
        self._open()
        return self.index

    def _open(self) -> None:
        builder = self.builder
        self.before = builder.block
        self.body = self.function.append_basic_block(self.name)
        self.after = self.function.append_basic_block(f"{self.name}_done")
        builder.cbranch(builder.icmp_signed("<", self.start, self.stop), self.body, self.after)
        builder.position_at_end(self.body)
        self.index = builder.phi(I64)
        self.carried = [builder.phi(value.type) for value in self.initial]

    def carry(self, values: Iterable[Any]) -> None:
        """The carried values the next iteration starts with."""
        self.following = list(values)

    def __exit__(self, *exception: object) -> None:
        builder = self.builder
        following = builder.add(self.index, I64(self.step))
        self.index.add_incoming(self.start, self.before)
        self.index.add_incoming(following, builder.block)
        for phi, first, then in zip(self.carried, self.initial, self.following, strict=True):
            phi.add_incoming(first, self.before)
            phi.add_incoming(then, builder.block)
        builder.cbranch(builder.icmp_signed("<", following, self.stop), self.body, self.after)
        builder.position_at_end(self.after)


class carrying_loop(loop):  # noqa: N801 - a context manager, as `loop`
    """`loop` with values carried from one iteration to the next: ``carried`` their first
    values; entering gives the loop itself (``.index``, ``.carried``: this iteration's), and
    `carry` sets the next iteration's."""

    def __enter__(self) -> carrying_loop:
        self._open()
        return self


class BlockTiles:
    """A task's share of a direct convolution's tiles, each a (filter block, image, tile of
    the image), numbered filter blocks outside, so that a block's weights stay in cache while
    every image's tiles meet them: ``blocks`` blocks of ``per_block`` tiles (``batch`` images
    of ``image_tiles``), part ``part`` of ``parts`` taking a run of them (`each`)."""

    def __init__(self, builder: ir.IRBuilder, blocks: Any, batch: Any, image_tiles: Any,
                 part: Any, parts: Any) -> None:
        self.builder, self.image_tiles = builder, image_tiles
        self.per_block = builder.mul(batch, image_tiles)
        total = builder.mul(blocks, self.per_block)
        self.first = builder.sdiv(builder.mul(part, total), parts)
        self.last = builder.sdiv(builder.mul(builder.add(part, I64(1)), total), parts)

    @contextmanager
    def each(self, function: ir.Function) -> Iterator[tuple[Any, Any, Any, Any]]:
        """The loop over the share: entering gives a tile's block, its number within the
        block, its image and its number within the image."""
        builder = self.builder
        with loop(builder, function, self.first, self.last, "tile") as index:
            block = builder.sdiv(index, self.per_block)
            within = builder.sub(index, builder.mul(block, self.per_block))
            image = builder.sdiv(within, self.image_tiles)
            yield block, within, image, builder.sub(within,
                                                    builder.mul(image, self.image_tiles))


@contextmanager
def when(builder: ir.IRBuilder, function: ir.Function, condition: Any,
         name: str) -> Iterator[None]:
    """The code built inside runs only where ``condition`` holds."""
    then = function.append_basic_block(name)
    done = function.append_basic_block(f"{name}_done")
    builder.cbranch(condition, then, done)
    builder.position_at_end(then)
    yield
    builder.branch(done)
    builder.position_at_end(done)


class FloatVectors:
    """What a kernel of float32 vectors of ``lanes`` lanes (16 unless told) builds with: the
    vector, mask and index types, and the masked load and store of float32 vectors, declared
    in ``built``."""

    LANES = 16

    def __init__(self, built: ir.Module, lanes: int = LANES) -> None:
        self.module = built
        self.lanes = lanes
        self.floats = ir.VectorType(F32, lanes)
        self.mask = ir.VectorType(I1, lanes)
        self.indices = ir.VectorType(I64, lanes)
        self.masked_load = masked_load(built, self.floats, "f32")
        self.masked_store = masked_store(built, self.floats, "f32")
