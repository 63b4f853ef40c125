"""CallerReturns: the company a finished batch's callers make, on explicit clocks."""

from __future__ import annotations

from engine.serving.caller_returns import HISTORY, WAIT_FRACTION, CallerReturns


def test_no_wait_before_any_batch_has_shown_its_callers_coming_back() -> None:
    returns = CallerReturns()
    assert returns.wait_until(0.0, 1) is None
    returns.batch_finished(1.0, answered=2, queued=2, compute_s=0.1)
    assert returns.wait_until(1.0, 2) is None  # no history yet


def test_queued_requests_wait_for_the_company_within_a_share_of_the_compute() -> None:
    returns = CallerReturns()
    returns.batch_finished(1.0, answered=2, queued=2, compute_s=0.1)
    returns.arrived(1.012)
    returns.arrived(1.013)  # the batch's two callers, back within 25 ms: a return
    returns.batch_finished(1.1, answered=2, queued=2, compute_s=0.1)
    until = 1.1 + WAIT_FRACTION * 0.1
    assert returns.wait_until(1.101, 2) == until
    returns.arrived(1.11)
    assert returns.wait_until(1.11, 3) == until
    returns.arrived(1.112)
    assert returns.wait_until(1.112, 4) is None  # the company is there
    assert returns.wait_until(until + 0.001, 2) is None  # and its time is up after `until`


def test_callers_that_do_not_come_back_stop_the_waiting() -> None:
    returns = CallerReturns()
    returns.batch_finished(1.0, answered=1, queued=0, compute_s=0.1)
    returns.arrived(1.01)  # one return
    now = 1.1
    for _ in range(HISTORY // 2):
        returns.batch_finished(now, answered=1, queued=1, compute_s=0.1)
        now += 0.05  # nobody arrives within 25 ms
        returns.arrived(now)
    # One return against HISTORY // 2 misses: a request that waited its delay out goes.
    returns.batch_finished(now, answered=1, queued=1, compute_s=0.1)
    assert returns.wait_until(now, 1) is None


def test_a_later_arrival_than_the_bound_is_a_miss() -> None:
    returns = CallerReturns()
    returns.batch_finished(1.0, answered=1, queued=0, compute_s=0.04)  # bound 10 ms
    returns.arrived(1.02)
    returns.batch_finished(1.1, answered=1, queued=1, compute_s=0.04)
    assert returns.wait_until(1.1, 1) is None


def test_once_a_batch_goes_the_next_waits_for_no_company() -> None:
    returns = CallerReturns()
    returns.batch_finished(1.0, answered=1, queued=0, compute_s=0.1)
    returns.arrived(1.01)
    returns.batch_finished(1.1, answered=3, queued=1, compute_s=0.1)
    assert returns.wait_until(1.101, 1) is not None
    returns.dispatched()
    assert returns.wait_until(1.102, 1) is None


def test_a_caller_that_leaves_costs_one_bounded_wait() -> None:
    # Two callers in a loop, each back 5 ms after its answer, batches of 100 ms; then one
    # leaves. The batch after its last answer waits for it until the bound, once: the next
    # batch answered only the one that stays, which is all the company it expects.
    returns = CallerReturns()
    now = 1.0
    for _ in range(4):
        returns.batch_finished(now, answered=2, queued=0, compute_s=0.1)
        returns.arrived(now + 0.005)
        returns.arrived(now + 0.005)
        assert returns.wait_until(now + 0.005, 2) is None  # both back: go
        returns.dispatched()
        now += 0.105
    returns.batch_finished(now, answered=2, queued=0, compute_s=0.1)  # the last of the pair
    returns.arrived(now + 0.005)
    until = returns.wait_until(now + 0.005, 1)
    assert until == now + WAIT_FRACTION * 0.1  # waits for the one who left, to the bound
    assert returns.wait_until(until + 0.001, 1) is None
    returns.dispatched()
    now = until + 0.1
    returns.batch_finished(now, answered=1, queued=0, compute_s=0.1)
    returns.arrived(now + 0.005)
    assert returns.wait_until(now + 0.005, 1) is None  # alone now: no wait
