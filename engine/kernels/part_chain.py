"""One `spin_pool` job whose parts each run steps of their own in order, with no wait between.

A layer bound as two jobs (im2col's gather, then the product reading it) waits at the end of
the first until every core's part is done, and a part of the second reads patches another core
gathered. Where the work cuts into independent shares (a convolution's runs of output rows:
each share's patches, then their product), a chain runs it as one job: each part runs shares'
steps one after the other on one thread (each step a job bound over that share alone, run
whole), so a gather's output is still in its core's cache when its product reads it, and the
layer waits once, at the end.

Armed, the parts claim the shares one at a time from a word in the job's context (part 0 from
the first share on, the others from the last back), so that a core that starts late (a worker
woken from its nap, a vCPU the host lent elsewhere for a while) takes fewer shares, where a
fixed run of shares per part kept the other core waiting for it: MobileNet v2's stem on two
vCPUs shared with other work ran 0.57× its one-thread time at best but 0.90× at the median with
a part of six shares each. Each share's steps are therefore bound once per part, over that
part's scratch region (the shares one part runs reuse its region; parts running at once never
share one), and once more for the job run as one part on one thread (unarmed, the pool runs
every job so), where every share reuses the same region, which then stays in cache: a ResNet-18
stem whose eight shares each had a region of their own took 1.4× as long on one thread as the
bands reusing one.

The chain's task is a few lines of LLVM IR (`_module`): its context holds the claim word
and, table by table (run alone, then each part's), share by share, the steps' task and
context addresses; a part calls each step of a share in order as ``task(context, 0, 1)``
(every step's task runs all of its own work when asked for part 0 of 1). The last part to
find no share left puts the word back to 0 for the next run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from engine.cpu import compiled, llvm_jit, spin_pool

_state: dict[str, Any] = {}
# The context's first words: steps per share, shares, the claim word, the parts that found no
# share left; then per table (run alone, then part 0's, part 1's, …), per share, per step: its
# task's address, then its context's.
HEADER_WORDS = 4
CLAIMED, LEFT = 2, 3
HALF_BITS = 32  # the claim word: shares taken from the front, low; from the back, high
HALF_MASK = (1 << HALF_BITS) - 1
WORDS_PER_STEP = 2

Shares = list[list[Any]]


def chain(by_part: Sequence[Sequence[Sequence[Any]]], alone: Sequence[Sequence[Any]],
          parts: int) -> Chain | None:
    """The job of ``parts`` parts, each claiming shares one at a time (of ``S``: part 0 from
    the first on, the others from the last back) and running share ``s``'s steps from
    ``by_part[p][s]`` in order, ``p`` the part; run as one part (unarmed), every share's
    steps from ``alone``. A step is a bound `spin_pool.Job`, or a call wrapping one, as a
    `gemm_kernel.Product` is. None where the chain cannot run here (no JIT, no pool, a step
    that is no job, shares of unequal steps, a table per part missing or not shaped as
    ``alone``, more parts than shares or than a job may have)."""
    single = [list(steps) for steps in alone]
    tables = [[list(steps) for steps in table] for table in by_part]
    every = [steps for table in (single, *tables) for steps in table]
    if (not single or not single[0] or not 1 <= parts <= min(len(single), spin_pool.MAX_PARTS)
            or len(tables) != parts or {len(table) for table in tables} != {len(single)}
            or {len(steps) for steps in every} != {len(single[0])}
            or not spin_pool.available()
            or any(_task_of(step) is None for steps in every for step in steps)):
        return None
    task = _task()
    if task is None:
        return None
    return Chain.of(tables, single, task)


class Chain(partial):
    """A bound chain (`chain`): a `spin_pool.Job` over its shares. A step taking an epilogue
    or a residual (`gemm_kernel.Product`) takes it through the chain, which is rebound over
    the new steps (`with_epilogue`, `with_residual`), so that the chain stands where the
    products stood in a layer's calls (`gemm_bind`)."""

    by_part: list[Shares]
    alone: Shares
    keep: tuple[Any, ...]
    leaves_blas_alone = True  # native steps on the pool's threads (`cpu.parts`)

    @classmethod
    def of(cls, by_part: list[Shares], alone: Shares, task: int) -> Chain:
        tables = [alone, *by_part]
        shares, steps = len(alone), len(alone[0])
        context = np.zeros(HEADER_WORDS + len(tables) * shares * steps * WORDS_PER_STEP,
                           np.int64)
        context[:2] = steps, shares
        words = context[HEADER_WORDS:].reshape(len(tables), shares, steps, WORDS_PER_STEP)
        for way, table in enumerate(tables):
            for share, share_steps in enumerate(table):
                for index, step in enumerate(share_steps):
                    words[way, share, index] = _task_of(step)
        job = spin_pool.job(task, context, len(by_part), keep=(by_part, alone))
        bound = cls(job.func, *job.args)
        bound.by_part, bound.alone, bound.keep = by_part, alone, job.keep
        return bound

    @property
    def parts(self) -> int:
        """The parts the job runs in where armed."""
        return int(self.args[-1])

    def _rebound(self, change: Callable[[Any], Any]) -> Chain:
        def changed(table: Shares) -> Shares:
            return [[change(step) if _is_product(step) else step for step in steps]
                    for steps in table]

        return Chain.of([changed(table) for table in self.by_part], changed(self.alone),
                        _task())

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
        """The chain's products, every table, share by share."""
        return [step for table in (*self.by_part, self.alone) for steps in table
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
    """``chain(context, part, parts)``: run as one part, every share's steps in order from
    the first table; in parts, share after share claimed from the context's claim word (part
    0 from the front, the others from the back, so that each core's outputs are mostly a run
    of rows, as the pool's parts of the next step are), each share's steps in order from part
    ``part``'s table, the last part to leave putting the words back to 0."""
    import llvmlite.ir as ir

    from engine.kernels.task_ir import I64, loop, task

    module = ir.Module(name="part_chain")
    function, builder, context, part, parts = task(module, "chain")
    words = builder.inttoptr(context, I64.as_pointer())
    steps = builder.load(words, align=8)
    shares = builder.load(builder.gep(words, [I64(1)]), align=8)
    claimed = builder.gep(words, [I64(CLAIMED)])
    left = builder.gep(words, [I64(LEFT)])
    per_share = builder.mul(steps, I64(WORDS_PER_STEP))
    step_type = ir.FunctionType(ir.VoidType(), [I64] * 3)

    def run_share(before: Any, share: Any) -> None:
        """Share ``share``'s steps from the table that follows ``before`` shares."""
        start = builder.add(I64(HEADER_WORDS), builder.mul(builder.add(before, share), per_share))
        with loop(builder, function, I64(0), steps, "steps") as step:
            at = builder.add(start, builder.mul(step, I64(WORDS_PER_STEP)))
            address = builder.load(builder.gep(words, [at]), align=8)
            step_context = builder.load(builder.gep(words, [builder.add(at, I64(1))]), align=8)
            builder.call(builder.inttoptr(address, step_type.as_pointer()),
                         [step_context, I64(0), I64(1)])

    alone, claim, attempt, free, run, leave, reset, done = (
        function.append_basic_block(name)
        for name in ("alone", "claim", "attempt", "free", "run", "leave", "reset", "done"))
    builder.cbranch(builder.icmp_signed("==", parts, I64(1)), alone, claim)

    builder.position_at_end(alone)
    with loop(builder, function, I64(0), shares, "shares") as share:
        run_share(I64(0), share)
    builder.branch(done)

    # The claim word: shares taken from the front (low half), from the back (high half).
    builder.position_at_end(claim)
    first = builder.load_atomic(claimed, "monotonic", 8)
    builder.branch(attempt)
    builder.position_at_end(attempt)
    word = builder.phi(I64)
    word.add_incoming(first, claim)
    front = builder.and_(word, I64(HALF_MASK))
    back = builder.lshr(word, I64(HALF_BITS))
    builder.cbranch(builder.icmp_signed(">=", builder.add(front, back), shares), leave, free)
    builder.position_at_end(free)
    leading = builder.icmp_signed("==", part, I64(0))
    share = builder.select(leading, front, builder.sub(builder.sub(shares, back), I64(1)))
    taken = builder.add(word, builder.select(leading, I64(1), I64(1 << HALF_BITS)))
    swapped = builder.cmpxchg(claimed, word, taken, "monotonic", "monotonic")
    word.add_incoming(builder.extract_value(swapped, 0), builder.block)
    builder.cbranch(builder.extract_value(swapped, 1), run, attempt)
    builder.position_at_end(run)
    # tables: the one run alone, then part 0's, part 1's, …
    run_share(builder.mul(builder.add(part, I64(1)), shares), share)
    builder.branch(claim)

    builder.position_at_end(leave)
    # every part has made its last claim once all have left: the words go back to 0,
    # before the job is finished for the pool (its finish is a release)
    gone = builder.atomic_rmw("add", left, I64(1), "acq_rel")
    builder.cbranch(builder.icmp_signed("==", gone, builder.sub(parts, I64(1))), reset, done)
    builder.position_at_end(reset)
    builder.atomic_rmw("xchg", claimed, I64(0), "monotonic")
    builder.atomic_rmw("xchg", left, I64(0), "monotonic")
    builder.branch(done)

    builder.position_at_end(done)
    builder.ret_void()
    return module
