"""The driver's decoder-pool bookkeeping, driven event by event without Ray."""
from __future__ import annotations

from raymt.pipeline.orchestration.dispatch import Health, Pool, Verdict


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


def test_a_busy_actor_gets_no_second_item_that_an_actor_still_starting_could_take() -> None:
    pool = Pool(lo=2, hi=2, depth=2)
    for a in ("a", "b"):
        pool.started(a)
    pool.became_ready("a")  # "a" loaded its model first
    assert pool.next_actor(waiting=2) == "a"
    pool.sent("a")
    assert pool.next_actor(waiting=1) is None  # the last unit waits for "b"
    assert pool.next_actor(waiting=2) == "a"  # more units than starting actors: "a" queues one ahead
    pool.became_ready("b")
    assert pool.next_actor(waiting=1) == "b"
    pool.sent("b")
    assert pool.next_actor(waiting=1) in ("a", "b")  # nobody is starting: queue ahead as before
    pool.stopped("b")
    pool.started("c")
    pool.stopped("c")  # a decoder that never started holds nothing back
    assert pool.next_actor(waiting=1) == "a"


def test_a_unit_is_retried_until_it_fails_max_attempts_times() -> None:
    pool = Pool(lo=1, hi=1, max_attempts=3)
    assert pool.failed_attempt("u1", "actor died")
    assert pool.failed_attempt("u1", "actor died")
    assert not pool.failed_attempt("u1", "ArrowInvalid: bad page")
    assert pool.failed == {"u1": "ArrowInvalid: bad page"}
    assert pool.failed_attempt("u2", "x")  # counted per unit


def test_a_unit_whose_last_attempt_died_with_its_actor_is_lost_not_bad_data() -> None:
    """``--skip-corrupt`` writes only a unit's own errors as unreadable rows: a unit whose decoders
    kept being killed is failed (rerun retries it), never committed untranslated."""
    pool = Pool(lo=1, hi=1, max_attempts=2)
    assert pool.failed_attempt("bad", "ArrowInvalid: bad page") and pool.failed_attempt("killed", "ArrowInvalid: x")
    assert not pool.failed_attempt("bad", "ArrowInvalid: bad page")
    assert not pool.failed_attempt("killed", "actor died", lost=True)
    assert set(pool.failed) == {"bad", "killed"} and pool.lost == {"killed"}


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


def ready_pool(*actors: str, **health) -> Pool:
    pool = Pool(lo=len(actors), hi=len(actors), health=Health(**health))
    for a in actors:
        pool.started(a)
        pool.became_ready(a)
    return pool


def test_a_death_counts_once_however_many_items_it_lost() -> None:
    pool = ready_pool("a")
    pool.sent("a", now=0.0)
    pool.sent("a", now=0.0)
    incarnation = pool.incarnation["a"]
    pool.returned("a", incarnation, now=1.0)
    assert pool.died("a", incarnation, now=1.0) is True  # the first lost item: a death
    pool.returned("a", incarnation, now=1.0)
    assert pool.died("a", incarnation, now=1.0) is False  # its second lost item: the same death
    assert pool.deaths["a"] == 1 and "a" in pool.down and pool.next_actor() is None
    assert pool.size == 1  # still counted: no second actor is created while it restarts


def test_a_dead_actor_is_probed_with_back_off_then_replaced_after_the_restart_timeout() -> None:
    pool = ready_pool("a", backoff_s=1.0, max_backoff_s=4.0, restart_timeout_s=20.0)
    pool.sent("a", now=0.0)
    pool.died("a", 0, now=0.0)
    assert pool.probes_due(0.5) == [] and pool.probes_due(1.0) == ["a"]
    assert pool.probes_due(1.0) == []  # one probe at a time
    delays, now = [], 1.0
    for _ in range(4):
        assert pool.probe_failed("a", now) is Verdict.RETRY
        delays.append(pool.down["a"].next_probe - now)
        now = pool.down["a"].next_probe
        assert pool.probes_due(now) == ["a"]
    assert delays == [2.0, 4.0, 4.0, 4.0]  # doubled, capped
    assert pool.probe_failed("a", 20.0) is Verdict.REPLACE  # down for the whole restart timeout


def test_a_restarted_actor_comes_back_with_nothing_in_flight_unless_it_died_too_often() -> None:
    pool = ready_pool("a", max_deaths=2)
    pool.sent("a", now=0.0)
    pool.died("a", 0, now=0.0)
    pool.probes_due(10.0)
    assert pool.probe_ok("a", now=10.0) is Verdict.RETRY
    assert pool.ready["a"] == 0 and pool.next_actor() == "a"
    pool.returned("a", 0, now=11.0)  # a late error of the old incarnation changes nothing
    assert pool.ready["a"] == 0 and pool.died("a", 0, now=11.0) is False
    pool.sent("a", now=12.0)
    assert pool.died("a", 1, now=13.0) is True
    pool.probes_due(20.0)
    assert pool.probe_ok("a", now=20.0) is Verdict.REPLACE  # second death: a fresh actor instead


def test_stalled_actors_and_the_bound_on_waiting_for_any_decoder() -> None:
    pool = ready_pool("a", "b", stall_timeout_s=100.0)
    pool.sent("a", now=0.0)
    assert pool.stalled(99.0) == [] and pool.stalled(100.0) == ["a"]  # "b" is idle: never stalled
    pool.returned("a", 0, now=100.0)
    assert pool.stalled(150.0) == []
    assert pool.waited_for_decoders(0.0, work_left=5) == 0.0
    pool.died("a", 0, 0.0) or pool.stopped("a")
    pool.stopped("b")
    assert pool.waited_for_decoders(10.0, work_left=5) == 0.0  # the clock starts now
    assert pool.waited_for_decoders(70.0, work_left=5) == 60.0
    assert pool.waited_for_decoders(80.0, work_left=0) == 0.0  # nothing left: no wait


def test_a_failed_unit_lost_with_its_decoder_is_named_as_such() -> None:
    from raymt.pipeline.orchestration.run import UnitsFailed
    message = str(UnitsFailed({"u1": "ArrowInvalid: bad page", "u2": "actor died"}, {"u2"}))
    assert "u1: ArrowInvalid: bad page" in message and "u2: lost with its decoder (not bad data): actor died" in message
