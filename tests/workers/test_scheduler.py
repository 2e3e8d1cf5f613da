"""Scheduler unit tests: schedule -> update with hand-built step outputs, no model, no torch."""
from __future__ import annotations

import pytest

from raymt.workers.decoder.scheduler import (CapacityUnit, Policy, Request, Scheduler, SchedulerConfig, Status, StepOutput,
                               StepPlan)


def make(policy: Policy, n: int = 4, beam_size: int = 1, **kwargs) -> Scheduler:
    cfg = SchedulerConfig(policy=policy, max_batch_sentences=n, capacity=kwargs.pop("capacity", n), **kwargs)
    return Scheduler(cfg, beam_size=beam_size)


def feed(s: Scheduler, lengths: list[int], source_lengths: list[int] | None = None) -> None:
    for i, _ in enumerate(lengths):
        s.add(Request(i, source_lengths[i] if source_lengths else 5))


def drive(s: Scheduler, target_lengths: dict[int, int], max_steps: int = 1000) -> list[StepPlan]:
    """Run to completion: request i finishes after ``target_lengths[i]`` of its own expansions."""
    plans = []
    for _ in range(max_steps):
        if not s.has_work:
            return plans
        plan = s.schedule()
        plans.append(plan)
        done = tuple(i for i in plan.expand if s.running[i].length + 1 >= target_lengths[i])
        s.update(plan, StepOutput(finished=done))
    raise AssertionError("did not finish")


def test_fixed_admits_a_batch_and_waits_for_all_of_it() -> None:
    s = make(Policy.FIXED, n=2)
    feed(s, [1, 3, 1])
    plans = drive(s, {0: 1, 1: 3, 2: 1})
    assert [p.admit for p in plans] == [(0, 1), (), (), (2,)]
    assert [p.expand for p in plans] == [(0, 1), (1,), (1,), (2,)]
    assert s.stats.refills == 2 and s.stats.batch_sizes == [2, 1, 1, 1]


def test_var_batch_schedules_like_fixed() -> None:
    a, b = make(Policy.FIXED, n=3), make(Policy.VAR_BATCH, n=3)
    lengths = {i: 1 + (i * 7) % 5 for i in range(8)}
    feed(a, list(lengths)), feed(b, list(lengths))
    assert drive(a, lengths) == drive(b, lengths)


def test_var_stream_refills_at_epsilon_and_expands_only_the_shortest() -> None:
    s = make(Policy.VAR_STREAM, n=4, epsilon=0.25)  # refill by m = 3 once <= 1 sentence remains
    feed(s, [0] * 7)
    plan = s.schedule()
    assert plan.admit == (0, 1, 2) and plan.expand == (0, 1, 2) and len(s.waiting) == 4
    s.update(plan, StepOutput(finished=(0, 1)))  # one left (2, at length 1): <= epsilon * n
    plan = s.schedule()
    assert plan.admit == (3, 4, 5)
    assert plan.expand == (3, 4, 5)  # 2 is longer: it waits until the new ones catch up
    s.update(plan, StepOutput())
    plan = s.schedule()
    assert plan.admit == () and plan.expand == (2, 3, 4, 5)  # all at length 1 now
    assert s.running[2].status is Status.RUNNING and len(s.waiting) == 1


@pytest.mark.parametrize("flush_every, expected", [(0, (2, 3)), (2, (1, 2, 3))])
def test_var_stream_flush_expands_everyone_periodically(flush_every: int, expected: tuple) -> None:
    s = make(Policy.VAR_STREAM, n=4, epsilon=0.5, flush_every=flush_every)  # m = 2
    feed(s, [0] * 4)
    p1 = s.schedule()
    assert p1.admit == (0, 1)
    s.update(p1, StepOutput(finished=(0,)))
    p2 = s.schedule()  # 1 is at length 1, the new 2 and 3 at 0; every 2nd step flushes
    assert p2.admit == (2, 3) and p2.expand == expected


def test_fifo_fills_capacity_in_beams_from_the_longest() -> None:
    s = make(Policy.FIFO, n=8, capacity=6, capacity_unit=CapacityUnit.BEAMS, beam_size=3)
    feed(s, [0] * 5)
    plan = s.schedule()
    assert plan.admit == (0, 1)  # 2 sentences x 3 reserved beams = capacity 6
    s.update(plan, StepOutput(widths={0: 3, 1: 1}))
    plan = s.schedule()
    assert plan.admit == ()  # load 3 + 3 reserved... admission accounts full beam width
    s.update(plan, StepOutput(finished=(0,), widths={1: 2}))
    plan = s.schedule()
    assert plan.admit == (2,)
    assert plan.expand[0] == 1  # the longest first


def test_topup_refills_only_when_half_empty() -> None:
    s = make(Policy.TOPUP, n=4, refill_threshold=0.5)
    feed(s, [0] * 8)
    plan = s.schedule()
    assert plan.admit == (0, 1, 2, 3)
    s.update(plan, StepOutput(finished=(0,)))
    assert s.schedule().admit == ()  # 1 of 4 empty: no top-up yet
    s.update(StepPlan((), (1, 2, 3)), StepOutput(finished=(1,)))
    plan = s.schedule()
    assert plan.admit == (4, 5) and set(plan.expand) == {2, 3, 4, 5}


def test_token_capacity_limits_admission_by_source_length() -> None:
    s = make(Policy.TOPUP, n=8, capacity=20, capacity_unit=CapacityUnit.TOKENS)
    feed(s, [0] * 4, source_lengths=[8, 8, 8, 30])
    plan = s.schedule()
    assert plan.admit == (0, 1)  # 16 tokens; a third would make 24 > 20
    s.update(plan, StepOutput(finished=(0, 1)))
    assert s.schedule().admit == (2,)  # 8 + 30 > 20, and 30 waits its turn
    s.update(StepPlan((), (2,)), StepOutput(finished=(2,)))
    assert s.schedule().admit == (3,)  # alone it is admitted even above capacity: never stuck


@pytest.mark.parametrize("policy", list(Policy))
def test_every_policy_finishes_every_request_exactly_once(policy: Policy) -> None:
    s = make(policy, n=3, capacity=9, capacity_unit=CapacityUnit.BEAMS, beam_size=3, flush_every=4)
    lengths = {i: 1 + (i * 5) % 7 for i in range(11)}
    feed(s, list(lengths))
    plans = drive(s, lengths)
    admitted = [i for p in plans for i in p.admit]
    assert sorted(admitted) == list(range(11))
    expansions = {i: sum(i in p.expand for p in plans) for i in lengths}
    assert expansions == lengths  # each expanded exactly its length, never after finishing
    assert s.stats.steps == len(plans)


@pytest.mark.parametrize("kwargs", [dict(max_batch_sentences=0), dict(capacity=0), dict(epsilon=1.0),
                                    dict(refill_threshold=0.0), dict(flush_every=-1), dict(policy="var_stream"),
                                    dict(capacity_unit="beam")])
def test_invalid_config_raises(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        SchedulerConfig(**kwargs)


def test_policy_and_unit_names_are_their_enums() -> None:
    """A string names the same policy and unit as the enum (it once fell through to the token unit:
    VAR-STREAM with capacity_unit="beams" admitted one sentence at a time)."""
    cfg = SchedulerConfig(policy="var-stream", capacity=10, capacity_unit="beams")
    assert cfg.policy is Policy.VAR_STREAM and cfg.capacity_unit is CapacityUnit.BEAMS
    s = Scheduler(cfg, beam_size=5)
    for i in range(4):
        s.add(Request(i, source_length=9))
    assert s.schedule().admit == (0, 1)  # two sentences of 5 beams, not one of 9 source tokens


def test_scheduler_module_does_not_import_torch() -> None:
    import ast
    import pathlib
    tree = ast.parse(pathlib.Path(__file__).parents[2].joinpath("workers", "decoder", "scheduler.py").read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any(name and name.split(".")[0] == "torch" for name in names)


def test_the_scheduler_gives_each_admitted_sentence_a_free_slot_and_takes_it_back() -> None:
    """Driven by hand: top-up over 3 slots; finished sentences free their slots, the next refill takes
    them (never-used slots first), and no two running sentences share one."""
    s = make(Policy.TOPUP, n=3, refill_threshold=0.5)
    feed(s, [0] * 6)
    plan = s.schedule()
    assert plan.admit == (0, 1, 2) and [s.running[i].slot for i in plan.admit] == [0, 1, 2] and s.free == []
    s.update(plan, StepOutput(finished=(1,), widths={0: 1, 2: 1}))
    assert s.free == [1] and s.occupied() == [(0, 0), (2, 2)]
    plan = s.schedule()  # one of three empty: below the threshold, no refill
    assert plan.admit == () and plan.expand == (0, 2)
    s.update(plan, StepOutput(finished=(0, 2)))
    assert sorted(s.free) == [0, 1, 2] and not s.running
    plan = s.schedule()
    assert plan.admit == (3, 4, 5) and [s.slot_of(i).slot for i in plan.admit] == [1, 0, 2]  # in the order freed
    s.update(plan, StepOutput(finished=(3, 4, 5)))
    assert not s.has_work and sorted(s.free) == [0, 1, 2]


def test_the_encode_ahead_queue_encodes_the_next_waiting_sentences_with_the_admitted() -> None:
    """FIFO admits whenever a slot is free: the first admission encodes a whole batch (the admitted
    and the next waiting ones, up to one batch of slots), later admissions of those encode nothing."""
    s = make(Policy.FIFO, n=2)
    feed(s, [0] * 5)
    plan = s.schedule()
    assert plan.admit == (0, 1) and plan.encode == (0, 1)  # (no room ahead: the batch is the admitted)
    s.update(plan, StepOutput(finished=(0,)))
    plan = s.schedule()
    assert plan.admit == (2,) and plan.encode == (2, 3)  # 3 encoded ahead, with 2
    s.update(plan, StepOutput(finished=(1, 2)))
    plan = s.schedule()
    assert plan.admit == (3, 4) and plan.encode == (4,)  # 3 was encoded ahead
    s.update(plan, StepOutput(finished=(3, 4)))
    assert not s.has_work and s.encoded == set()
