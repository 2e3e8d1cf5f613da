"""One engine step's indices on the device (``workers/decoder/engine.py`` builds them on the host from what it
already knows and copies them over at once)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from torch import Tensor


@dataclass(frozen=True, slots=True)
class StepIndex:
    """One step's indices on the device: rows, positions (N,) of the run rows; grid (N,) their
    (B' x K) entries, None when every entry runs (``grid_all``: the same, always given); slots,
    generated, at_max (B',) of the step's slots; force (N,) rows at their cap (None: no row is, or
    no forced EOS); planned (B',) bool, None when every slot of the step is planned (a static step
    runs them all); forced (N,) each row's forced token (-1: none; a sentence's first generated token,
    its target language), None when no row has one. Host: t visible positions, s longest source, shared position, first slot when
    consecutive (else -1), order (each planned sentence's row of the step), live_rows. The static
    step sends positions and force per slot (``per_slot`` = K rows each); ``as_masks`` expands them."""

    rows: Tensor
    positions: Tensor
    grid: Tensor | None
    grid_all: Tensor
    slots: Tensor
    generated: Tensor
    at_max: Tensor
    force: Tensor | None
    t: int
    s: int
    shared: bool
    first: int
    planned: Tensor | None
    order: list[int]
    live_rows: int
    per_slot: int = 1  # > 1: positions, force and forced hold one entry per slot, for that many rows each
    forced: Tensor | None = None

    def as_masks(self) -> StepIndex:
        """at_max, force and planned as bool masks (they travel as int64 in the step's one copy), and
        positions and force per row where they travelled per slot (``per_slot`` rows each): a
        captured step does this itself, from the buffer it reads."""
        def rows(x: Tensor | None) -> Tensor | None:
            if x is None or self.per_slot == 1:
                return x
            return x[:, None].expand(-1, self.per_slot).contiguous().view(-1)  # (one slot: not a stride-0 view)
        return replace(self, positions=rows(self.positions), at_max=self.at_max.bool(),
                       force=None if self.force is None else rows(self.force).bool(),
                       planned=None if self.planned is None else self.planned.bool(), per_slot=1,
                       forced=rows(self.forced))
