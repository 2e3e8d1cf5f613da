"""The static step: one shape every step, so a CUDA graph captures it once and replays it.

Every slot's K rows run each step, over the cache's full target and source capacity. A slot the
step does not plan (empty, not chosen by the policy, or ended at its cap) runs at a scratch
position (the cache's last) and keeps its state. The step reads its indices from one persistent
device buffer, per slot:

    length     the target position it runs at (scratch when not planned)
    generated  tokens it will have generated after this step (1 when not planned)
    capped     whether this step reaches its length cap (forced EOS)
    planned    whether it runs for real
    cap        its length cap
    forced     the token its first generated step must emit (its target language), -1 otherwise

The host writes the buffer when the plan changes (an admission, a finished sentence read back, a
policy choosing other sentences). Otherwise the step advances the buffer itself on the device
(``advance``, inside the captured graph): a planned slot moves one position on, and stops being
planned at its cap, exactly as the host would have written it. So between changes the host builds
nothing: under top-up the plan changes only at refills and readbacks (and the host rebuilds once
when a planned sentence reaches its cap, to count the step's live rows).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from raymt.workers.decoder.scheduler import Request, StepPlan
from raymt.workers.search.step_index import StepIndex

FIELDS = 6  # length, generated, capped, planned, cap, forced


@dataclass(frozen=True, slots=True)
class StaticStep:
    """The one-shape step. ``readback_every``: the step's outcome is copied to the host every that
    many steps, not every step; in between, a sentence that finished on the device is frozen there
    (its slot runs, changes nothing) until the next readback frees its slot, and the host never
    waits on the device.

    ``late``: the readback is copied behind the step that produced it and read after the next step
    has been queued, so the device runs that step while the host handles the finished sentences
    (their slots refilled one step later). Otherwise the device waits for the host at every
    readback: it has nothing queued while the host reads, frees slots, admits and builds."""

    readback_every: int = 1
    late: bool = False  # each readback copied asynchronously and read one step later, once that step is queued

    def __post_init__(self) -> None:
        if self.readback_every < 1:
            raise ValueError(f"readback_every must be >= 1, got {self.readback_every}")


class StaticIndices:
    """The static step's index buffer (FIELDS x slots int64 on the device) and the ``StepIndex`` of
    views into it that every step reads. ``to_device``: the step's one host-to-device copy
    (``graphs.HostToDevice``: it holds no engine, so no reference cycle keeps a decode's cache).
    The runner keeps one per bucket across decodes (a captured graph reads its buffer); ``reset``
    forgets the last decode's plan."""

    def __init__(self, slots: int, beam_size: int, scratch: int, source_capacity: int, forced_eos: bool,
                 device: torch.device, to_device, forced_first: bool = False) -> None:
        self.slots, self.k, self.scratch = slots, beam_size, scratch
        self.s, self.forced_eos, self.forced_first = source_capacity, forced_eos, forced_first
        self.all_rows = torch.arange(slots * beam_size, device=device)  # (R,)
        self.all_slots = torch.arange(slots, device=device)  # (slots,)
        self.to_device = to_device
        self.buffer: Tensor | None = None  # (FIELDS * slots,)
        self.index: StepIndex | None = None
        self.expand: tuple[int, ...] | None = None  # the plan the buffer holds
        self.age = self.fresh = 0  # steps since the last build; steps that build's planned set lasts
        self.built = self.advanced = 0  # steps whose indices the host built / the device advanced

    def step_index(self, plan: StepPlan, requests: dict[int, Request], slot_of) -> StepIndex:
        """This step's indices: the device-advanced buffer when the plan is the last one, else built
        on the host from each planned sentence's slot (``slot_of(id)``: its ``slot`` and ``max_length``)
        and length."""
        if self.index is not None and not plan.admit and plan.expand == self.expand and self.age + 1 < self.fresh:
            self.age += 1
            self.advanced += 1
            return self.index
        c, expand = self.slots, plan.expand
        b = len(expand)
        held = [slot_of(i) for i in expand]
        slot = np.fromiter((x.slot for x in held), np.int64, b)  # (B',) per planned sentence
        cap = np.fromiter((x.max_length for x in held), np.int64, b)
        length = np.fromiter((requests[i].length for i in expand), np.int64, b)
        width = np.fromiter((requests[i].width for i in expand), np.int64, b)
        runs = length < cap  # one that ended at its cap on the device awaits a readback
        buffer = np.zeros((FIELDS, c), np.int64)  # length, generated, capped, planned, cap, forced (slots,) each
        buffer[0], buffer[1], buffer[5] = self.scratch, 1, -1
        buffer[4, slot] = cap
        j, at = slot[runs], length[runs]
        buffer[0, j], buffer[1, j], buffer[3, j] = at, at + 1, 1
        buffer[2, j] = at + 1 >= cap[runs]
        first = np.fromiter((requests[i].forced_first for i in expand), np.int64, b)[runs]
        buffer[5, j] = np.where(at == 0, first, -1)
        live = int(width[runs].sum())
        fresh = int(min(self.scratch + 1, (cap[runs] - at).min(initial=self.scratch + 1)))
        packed = self.to_device(buffer.reshape(-1))
        if self.buffer is None:
            self.buffer = torch.empty_like(packed)
        self.buffer.copy_(packed)  # one buffer, so a captured step reads each step's values
        b = self.buffer
        self.index = StepIndex(self.all_rows, b[:c], None, self.all_rows, self.all_slots, b[c: 2 * c], b[2 * c: 3 * c],
                               b[2 * c: 3 * c] if self.forced_eos else None, t=self.scratch + 1, s=self.s, shared=False,
                               first=0, planned=b[3 * c: 4 * c], order=[],  # (its readback covers every slot)
                               live_rows=live, per_slot=self.k,  # (live_rows: as of the last build)
                               forced=b[5 * c:] if self.forced_first else None)
        self.expand, self.age, self.fresh = plan.expand, 0, fresh  # this build's planned set holds for
        self.built += 1  # ``fresh`` steps: then a sentence reaches its cap (the host counts live rows anew)
        return self.index

    def reset(self) -> None:
        """A new decode: no plan held (the buffer stays, for a captured step that reads it)."""
        self.index, self.expand, self.age, self.fresh = None, None, 0, 0

    def advance(self) -> None:
        """On the device, after the step's reads: the buffer as the host would write it for the same
        plan one step later (a planned slot one position on; at its cap, no longer planned)."""
        length, generated, capped, planned, cap, forced = self.buffer.view(FIELDS, self.slots)  # (slots,) each
        nxt = length + 1
        go = planned.bool() & (nxt < cap)
        length.copy_(torch.where(go, nxt, self.scratch))
        generated.copy_(torch.where(go, nxt + 1, 1))
        capped.copy_((go & (nxt + 1 >= cap)).long())
        planned.copy_(go.long())
        forced.fill_(-1)  # (a first step is never advanced to: it follows an admission, which the host builds)
