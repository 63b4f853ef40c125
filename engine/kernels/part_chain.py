"""One `spin_pool` job whose parts each run steps of their own in order, with no wait between.

A layer bound as two jobs (im2col's gather, then the product reading it) waits at the end of
the first until every core's part is done, and a part of the second reads patches another core
gathered. Where the work cuts into independent shares (a convolution's runs of output rows:
each share's patches, then their product), a chain runs it as one job: each part runs its
shares' steps one after the other on one thread (each step a job bound over that share alone,
run whole), so a gather's output is still in its core's cache when its product reads it, and
the layer waits once, at the end.

The shares' steps are bound twice: once for the job run in its parts (armed: the shares of
one part may reuse one scratch region, those of different parts may not, as they run at once)
and once for the job run as one part on one thread (unarmed, the pool runs every job so),
where every share may reuse the same region, which then stays in cache: a ResNet-18 stem
whose eight shares each had a region of their own took 1.4× as long on one thread as the
bands reusing one.

The chain's task is a few lines of LLVM IR (`_module`): its context holds the steps' task and
context addresses, share by share, for both ways, and a part calls each of its shares' steps
in order as ``task(context, 0, 1)`` (every step's task runs all of its own work when asked for
part 0 of 1).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from engine.cpu import compiled, llvm_jit, spin_pool

_state: dict[str, Any] = {}
# The context's first words: steps per share, shares; then per way (in parts, then as one
# part), per share, per step: its task's address, then its context's.
HEADER_WORDS = 2
WORDS_PER_STEP = 2

Shares = list[list[Any]]


def chain(in_parts: Sequence[Sequence[Any]], alone: Sequence[Sequence[Any]],
          parts: int) -> Chain | None:
    """The job of ``parts`` parts, part ``p`` running the steps of shares ``p · S // parts``
    up to ``(p + 1) · S // parts`` (of ``S``) from ``in_parts``, each share's in order; run as
    one part (unarmed), every share's steps from ``alone``. A step is a bound
    `spin_pool.Job`, or a call wrapping one, as a `gemm_kernel.Product` is. None where the
    chain cannot run here (no JIT, no pool, a step that is no job, shares of unequal steps,
    ``alone`` not shaped as ``in_parts``, more parts than shares or than a job may have)."""
    shares = [list(steps) for steps in in_parts]
    single = [list(steps) for steps in alone]
    if (not shares or not shares[0] or not 1 <= parts <= min(len(shares), spin_pool.MAX_PARTS)
            or {len(steps) for steps in shares + single} != {len(shares[0])}
            or len(single) != len(shares) or not spin_pool.available()
            or any(_task_of(step) is None for steps in shares + single for step in steps)):
        return None
    task = _task()
    if task is None:
        return None
    return Chain.of(shares, single, parts, task)


class Chain(partial):
    """A bound chain (`chain`): a `spin_pool.Job` over its shares. A step taking an epilogue
    or a residual (`gemm_kernel.Product`) takes it through the chain, which is rebound over
    the new steps (`with_epilogue`, `with_residual`), so that the chain stands where the
    products stood in a layer's calls (`gemm_bind`)."""

    in_parts: Shares
    alone: Shares
    keep: tuple[Any, ...]
    leaves_blas_alone = True  # native steps on the pool's threads (`cpu.parts`)

    @classmethod
    def of(cls, in_parts: Shares, alone: Shares, parts: int, task: int) -> Chain:
        shares, steps = len(in_parts), len(in_parts[0])
        context = np.zeros(HEADER_WORDS + 2 * shares * steps * WORDS_PER_STEP, np.int64)
        context[:HEADER_WORDS] = steps, shares
        words = context[HEADER_WORDS:].reshape(2, shares, steps, WORDS_PER_STEP)
        for way, table in enumerate((in_parts, alone)):
            for share, share_steps in enumerate(table):
                for index, step in enumerate(share_steps):
                    words[way, share, index] = _task_of(step)
        job = spin_pool.job(task, context, parts, keep=(in_parts, alone))
        bound = cls(job.func, *job.args)
        bound.in_parts, bound.alone, bound.keep = in_parts, alone, job.keep
        return bound

    @property
    def parts(self) -> int:
        """The parts the job runs in where armed."""
        return int(self.args[-1])

    def _rebound(self, change: Callable[[Any], Any]) -> Chain:
        def changed(table: Shares) -> Shares:
            return [[change(step) if _is_product(step) else step for step in steps]
                    for steps in table]

        return Chain.of(changed(self.in_parts), changed(self.alone), self.parts, _task())

    def with_epilogue(self, bias_rows: Any = None, bias_columns: Any = None,
                      low: float = -np.inf, high: float = np.inf) -> Chain:
        """This chain with each of its products adding the biases (per row or column of its
        own C: a convolution's shares each compute every filter, so each takes the layer's
        bias per row) and clamping to [low, high]."""
        return self._rebound(lambda step: step.with_epilogue(bias_rows, bias_columns, low,
                                                             high))

    def writes_within(self, out: Any) -> bool:
        """Whether every product of the chain writes inside ``out``."""
        products = self.products()
        return bool(products) and all(step.writes_within(out) for step in products)

    def with_residual(self, out: Any, other: Any) -> Chain:
        """This chain with each product adding ``other`` (laid out as ``out``)."""
        return self._rebound(lambda step: step.with_residual(out, other))

    def products(self) -> list[Any]:
        """The chain's products, both ways, share by share."""
        return [step for table in (self.in_parts, self.alone) for steps in table
                for step in steps if _is_product(step)]


def _is_product(step: Any) -> bool:
    return callable(getattr(step, "with_epilogue", None))


def _task_of(step: Any) -> tuple[int, int] | None:
    """(task address, context address) of a bound job: `spin_pool.job` binds its
    ``(…, task, context, parts)`` last, on the pool or alone."""
    args = getattr(step, "args", None)
    if (not isinstance(step, partial) or args is None or len(args) < 3
            or not all(isinstance(value, (int, np.integer)) for value in args[-3:])):
        return None
    return int(args[-3]), int(args[-2])


def _task() -> int | None:
    engine = compiled.made_once(_state, "engine", lambda: llvm_jit.compile_for_host(_module))
    return None if engine is None else engine.get_function_address("chain")


def _module() -> Any:
    """``chain(context, part, parts)``: for each share of part ``part`` of ``parts``, for each
    of its steps in order, ``task(step_context, 0, 1)``, from the second table where the job
    runs as one part."""
    import llvmlite.ir as ir

    from engine.kernels.task_ir import I64, loop, task

    module = ir.Module(name="part_chain")
    function, builder, context, part, parts = task(module, "chain")
    words = builder.inttoptr(context, I64.as_pointer())
    steps = builder.load(words, align=8)
    shares = builder.load(builder.gep(words, [I64(1)]), align=8)
    first = builder.sdiv(builder.mul(part, shares), parts)
    last = builder.sdiv(builder.mul(builder.add(part, I64(1)), shares), parts)
    per_share = builder.mul(steps, I64(WORDS_PER_STEP))
    table = builder.select(builder.icmp_signed("==", parts, I64(1)),
                           builder.mul(shares, per_share), I64(0))
    step_type = ir.FunctionType(ir.VoidType(), [I64] * 3)
    with loop(builder, function, first, last, "shares") as share:
        start = builder.add(builder.add(I64(HEADER_WORDS), table),
                            builder.mul(share, per_share))
        with loop(builder, function, I64(0), steps, "steps") as step:
            at = builder.add(start, builder.mul(step, I64(WORDS_PER_STEP)))
            address = builder.load(builder.gep(words, [at]), align=8)
            step_context = builder.load(builder.gep(words, [builder.add(at, I64(1))]), align=8)
            builder.call(builder.inttoptr(address, step_type.as_pointer()),
                         [step_context, I64(0), I64(1)])
    builder.ret_void()
    return module
