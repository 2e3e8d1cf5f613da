"""The driver's decoder-pool bookkeeping, driven event by event without Ray."""
from __future__ import annotations

from pipeline.dispatch import Pool


def test_pool_grows_to_the_work_left_within_its_bounds_and_shrinks_by_idle_actors() -> None:
    pool = Pool(lo=1, hi=3)
    assert pool.to_start(work_left=10) == 3
    for a in ("a", "b", "c"):
        pool.started(a)
    assert pool.to_start(10) == 0 and pool.next_actor() is None  # nothing is ready: nothing is sent
    pool.became_ready("a")
    pool.became_ready("b")
    pool.sent("a")
    assert pool.to_stop(work_left=1) == ["b"]  # idle and beyond the work left; "c" is still starting
    assert pool.to_stop(work_left=5) == []
    pool.stopped("b")
    pool.stopped("c")
    assert pool.size == 1 and pool.to_stop(0) == []  # never below lo
    assert Pool(lo=2, hi=4).to_start(work_left=1) == 2  # lo actors even for a little work


def test_least_loaded_ready_actor_gets_the_next_item_up_to_depth() -> None:
    pool = Pool(lo=2, hi=2, depth=2)
    for a in ("a", "b"):
        pool.started(a)
        pool.became_ready(a)
    sent = []
    while (a := pool.next_actor()) is not None:
        pool.sent(a)
        sent.append(a)
    assert sorted(sent) == ["a", "a", "b", "b"]
    assert sent[:2] in (["a", "b"], ["b", "a"])  # spread before stacking
    pool.returned("b")
    assert pool.next_actor() == "b"


def test_a_unit_is_retried_until_it_fails_max_attempts_times() -> None:
    pool = Pool(lo=1, hi=1, max_attempts=3)
    assert pool.failed_attempt("u1", "actor died")
    assert pool.failed_attempt("u1", "actor died")
    assert not pool.failed_attempt("u1", "ArrowInvalid: bad page")
    assert pool.failed == {"u1": "ArrowInvalid: bad page"}
    assert pool.failed_attempt("u2", "x")  # counted per unit


def test_a_restarting_actor_gets_nothing_until_ready_again() -> None:
    pool = Pool(lo=1, hi=1)
    pool.started("a")
    pool.became_ready("a")
    pool.sent("a")
    pool.stopped("a")  # its item came back with the actor's death
    pool.started("a")  # probed again
    pool.returned("a")  # a second lost item of the dead incarnation: ignored
    assert pool.next_actor() is None and pool.size == 1
    pool.became_ready("a")
    assert pool.ready == {"a": 0}
