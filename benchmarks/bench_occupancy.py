"""Slot occupancy of a decoder's scheduler over a corpus cut into work units: the GPU's batching defaults.

    python -m benchmarks.bench_occupancy --lines 50000 --out docs/results/occupancy      # ~2 min on 2 cores
    python -m benchmarks.bench_occupancy --lines 200 --sample 40 --capacities 8 --unit-rows 50,0 \\
        --out /tmp/occupancy                                                   # smoke

A static decoder step (``workers/decoder/static_step.py``, a CUDA graph on a GPU) costs the same whatever
share of its slots is live, so its throughput is its occupancy: live sentences per step ÷ slots.
That depends on the scheduler, not on the model, and the scheduler has no torch: this runs the real
``raymt.workers.decoder.scheduler.Scheduler`` over each sentence's decode length, as a decoder actor would see
the corpus (work units of ``--unit-rows`` rows, each sorted by source length and decoded to its
end before the next; 0 = the whole corpus as one stream), with the static step's deferred readback
(a sentence done on the device frees its slot at the next readback only).

Decode lengths: the demo model translates ``--sample`` lines of each set once (beam 5, on the CPU)
and each sentence's steps are taken as its translation's token count (beam search may run a step
or two past its best hypothesis: a lower bound); the corpus is those sentences drawn again in a
seeded shuffle up to ``--lines``. Reports steps, occupancy and steps ÷ the one-stream run's.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
from dataclasses import dataclass

from benchmarks.reports import SETS, read_lines, write_report
from raymt.pipeline.reports.stats_tables import markdown_table
from raymt.workers.config import SearchConfig
from raymt.workers.decoder.scheduler import Policy, Request, Scheduler, SchedulerConfig, StepOutput


@dataclass(frozen=True, slots=True)
class Sentence:
    source_tokens: int
    steps: int  # decoder steps until it is done on the device


@dataclass(frozen=True, slots=True)
class Occupancy:
    steps: int
    sentence_steps: int  # live (not yet done) sentences summed over steps
    slots: int

    @property
    def occupancy(self) -> float:
        return self.sentence_steps / (self.steps * self.slots) if self.steps else 0.0


def simulate(sentences: list[Sentence], *, unit_rows: int, capacity: int, policy: Policy = Policy.TOPUP,
             refill_threshold: float = 0.5, readback_every: int = 1, late: bool = False) -> Occupancy:
    """The scheduler over ``sentences`` in units of ``unit_rows`` (0: one unit), each unit sorted by
    source length and run to its end, as ``CoreDecoder.decode_ids`` does per unit. A sentence is done
    on the device after its ``steps``; the host hears of it at the next readback (every
    ``readback_every`` steps, and whenever every slot is done), when its slot frees; ``late``, one
    step after that (``StaticStep.late``: the readback is read once the next step is queued)."""
    unit_rows = unit_rows or len(sentences)
    steps = live = 0
    for start in range(0, len(sentences), unit_rows):
        unit = sorted(sentences[start: start + unit_rows], key=lambda s: s.source_tokens)
        cfg = SchedulerConfig(policy=policy, max_batch_sentences=capacity, capacity=capacity,
                              refill_threshold=refill_threshold)
        scheduler = Scheduler(cfg)
        for i, s in enumerate(unit):
            scheduler.add(Request(i, s.source_tokens))
        left: dict[int, int] = {}  # running sentence -> steps it still needs (0: done, awaiting a readback)
        unread, in_flight = 0, None  # late: the readback copied at the last due step
        while scheduler.has_work:
            plan = scheduler.schedule()
            for i in plan.admit:
                left[i] = unit[i].steps
            for i in plan.expand:
                if left[i]:
                    live += 1
                    left[i] -= 1
            steps, unread = steps + 1, unread + 1
            done = [i for i in scheduler.running if left[i] == 0]
            due = unread >= readback_every or len(done) == len(scheduler.running)
            read: tuple[int, ...] = ()
            if late:
                read, in_flight = in_flight or (), None
                if due:
                    in_flight = tuple(i for i in done if i not in read)
            elif due:
                read = tuple(done)
            unread = 0 if due else unread
            scheduler.update(plan, StepOutput(read))
            for i in read:
                del left[i]
    return Occupancy(steps, live, capacity)


def decode_lengths(model: str, lines: list[str], beam: int) -> list[Sentence]:
    """Each line's source token count and its translation's token count (the model on the CPU)."""
    from raymt.workers.decoder.core_decoder import CoreDecoder  # (torch: only here)
    from raymt.workers.decoder.decode_config import DecodeRequest
    translator = CoreDecoder.load(model)
    sources = translator.encode(lines)
    hyps = translator.decode_ids(sources, DecodeRequest(SearchConfig(beam_size=beam))).hypotheses
    return [Sentence(len(s), max(len(h[0].tokens), 1)) for s, h in zip(sources, hyps)]


def corpus(sample: list[Sentence], lines: int, seed: int) -> list[Sentence]:
    """``lines`` sentences: the sample reshuffled (seeded) as often as it takes."""
    rng, out = random.Random(seed), []
    while len(out) < lines:
        out += rng.sample(sample, len(sample))
    return out[:lines]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="models/demo-de-en")
    p.add_argument("--data", default=os.environ.get("RAYMT_SHARED_DATA", "../shared/data"))
    p.add_argument("--sets", default="multi30k,wmt22")
    p.add_argument("--sample", type=int, default=0, help="lines of each set translated for their lengths (0: all)")
    p.add_argument("--lines", type=int, default=50000, help="corpus size, in sentences")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--capacities", default="32,256,1024", help="slots (sentences)")
    p.add_argument("--unit-rows", default="2500,10000,50000,0", help="rows per work unit (0: one stream)")
    p.add_argument("--refill-thresholds", default="0.5,0.25,0.05", help="top-up: refill once this share is empty")
    p.add_argument("--readbacks", default="1,4", help="the static step's readback every N steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="docs/results/occupancy")
    args = p.parse_args(argv)
    capacities = [int(x) for x in args.capacities.split(",")]
    units = [int(x) for x in args.unit_rows.split(",")]
    thresholds = [float(x) for x in args.refill_thresholds.split(",")]
    readbacks = [int(x) for x in args.readbacks.split(",")]
    report: dict = {"args": vars(args), "tables": {}}
    md = ["# Slot occupancy over work units (`benchmarks.bench_occupancy`)\n",
          f"{args.lines} sentences per set, decode lengths of `{args.model}` at beam {args.beam}; top-up policy; "
          f"steps = decoder steps (a static step's cost is the same at any occupancy).\n",
          f"Command: `python -m benchmarks.bench_occupancy {' '.join(sys.argv[1:] if argv is None else argv)}`\n"]
    for name in args.sets.split(","):
        lines = read_lines(os.path.join(args.data, SETS[name][0]), args.sample)
        sentences = corpus(decode_lengths(args.model, lines, args.beam), args.lines, args.seed)
        rows = []
        for c in capacities:
            stream = simulate(sentences, unit_rows=0, capacity=c)
            for u in units:
                r = simulate(sentences, unit_rows=u, capacity=c)
                rows.append({"slots": c, "unit_rows": u or "one stream", "steps": r.steps,
                             "occupancy": round(r.occupancy, 3), "steps_vs_one_stream": round(r.steps / stream.steps, 3)})
        report["tables"][f"{name}/units"] = rows
        md += [f"## {name}: work unit size (refill at half empty, readback every step)\n", markdown_table(rows), ""]
        rows = []
        c, u = capacities[-1], max(units)
        for t in thresholds:
            for n in readbacks:
                for late in (False, True):
                    r = simulate(sentences, unit_rows=u, capacity=c, refill_threshold=t, readback_every=n, late=late)
                    rows.append({"slots": c, "unit_rows": u or "one stream", "refill_threshold": t,
                                 "readback_every": n, "read": "a step late" if late else "at once",
                                 "steps": r.steps, "occupancy": round(r.occupancy, 3)})
        report["tables"][f"{name}/refill"] = rows
        md += [f"## {name}: refill threshold and readback interval\n", markdown_table(rows), ""]
        write_report(args.out, report, md, echo=False)
    print("\n".join(md))


if __name__ == "__main__":
    main()
