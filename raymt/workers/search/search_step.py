"""The search step: everything a decoder step does after the decoder's hidden states, one contract.

    step = choose_step(model, search, static)                 # once per decode call
    packed = step(ctx, hidden, ix)                            # every step: (N, E) -> the packed readback

A step takes the run rows' hidden states (N, E), the step's indices (``StepIndex``) and the call's
search state (``StepContext``: the slots' beam state, the cache, the output head), updates the
state on the device (the running scores, the finished pools, the last tokens, the cache's
ancestry) and returns what the host reads back (``Readback.gather``), reading nothing back itself.

One reference, ``reference_step``, holds HF ``generate``'s beam-search semantics once
(``workers/search/selection.py``: candidates and the finishing set; ``workers/search/beam_rules.py``: the finished
pools, length normalisation, pruning, the stop test); its candidates come from a *proposal*: the
top 2K over the sentence's rows (``score_step``, beam search) or one draw per lane
(``sample_candidates``, sampling). The other steps are faster forms of the same outcome, each
checked against the reference by one parametrised test (``tests/workers/test_search_step.py``):

* ``native_step``: the CPU's whole step after the output layer in one native call
  (``workers/kernels/csrc/beam_step.cpp``), fed by the fused output layer (product, log-softmax, top-k);
* ``greedy_step``: beam 1 without pruning, in a third of the small operators (``greedy_select``).

The row top itself (log-softmax + top-k over V) has its own backends behind ``model.ops``: ATen, the
native CPU pass, the Triton kernel on a GPU, the fused output layer. A static step (``workers/decoder/static_step.py``,
captured as a CUDA graph on a GPU) always takes the reference: it masks the slots it does not plan.

Dimension letters: B' planned slots, K beam, C candidates, N run rows, V|C output columns.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import Tensor
from torch.profiler import record_function

from raymt.workers.search.beam_rules import BeamRules, stop_mask
from raymt.workers.search.beams import Readback, SlotState
from raymt.workers.model.cache import KVCache
from raymt.workers.config import SearchConfig
from raymt.workers.search.sampling import sample_candidates
from raymt.workers.search.selection import (Candidates, RowTop, StepSelection, finish_row_top, greedy_select,
                                  row_top_log_probs, score_step, select_step)
from raymt.workers.search.step_index import StepIndex
from raymt.workers.model.step_ops import ATEN


@dataclass(frozen=True)
class StepContext:
    """One decode call's search side: the model (its config, ops and output layer), the search and
    its beam rules (``BeamRules.of(search)``), the slots' beam state and cache (the runner's), the
    call's output head, ``norm`` the generated ** length_penalty table (float64, ``length_norms``),
    ``beams`` (K,) 0..K-1."""

    model: object
    search: SearchConfig
    rules: BeamRules
    state: SlotState
    cache: KVCache
    head: object
    norm: Tensor
    beams: Tensor


SearchStep = Callable[[StepContext, Tensor, StepIndex], Tensor]
SMALL_TOP = 64  # the row-top backends (native, Triton) are built for a beam's 2K; a wider top-k takes ATen's


def choose_step(model, search: SearchConfig, static: bool) -> SearchStep:
    """The step a decode call runs, decided once: the native beam step where the model's ops have it
    (the CPU), greedy for beam 1 without pruning, else the reference (sampling, a static step, a GPU)."""
    if search.sampling is not None or static:
        return reference_step
    if model.ops.beam_kernel is not None:
        return native_step
    if search.beam_size == 1 and not search.pruning.active:
        return greedy_step
    return reference_step


def propose(ctx: StepContext, logits: Tensor, ix: StepIndex) -> tuple[Candidates, StepSelection]:
    """The step's candidates and their split into running and finishing: beam search's top 2K, or
    one draw per lane (sampling)."""
    mc, running = ctx.model.config, ctx.state.running[ix.slots]  # (B', K)
    if ctx.search.sampling is None:
        return score_step(logits, ix.grid, running, ix.at_max, ix.force, mc, head=ctx.head, ops=ctx.model.ops,
                          forced=ix.forced)
    cands = sample_candidates(sampling_rows(ctx, logits, ix), ix.grid, running, ix.generated,
                              ctx.state.keys[ix.slots], ctx.search.sampling)
    return cands, select_step(cands, mc.eos_token_id, ix.at_max, running.shape[1])


def sampling_rows(ctx: StepContext, logits: Tensor, ix: StepIndex) -> RowTop:
    """The run rows' tokens a draw considers (N, M), ``<pad>`` banned, forced tokens applied: with
    top-k the k best, by the model's row-top backend while k is a beam's size (``SMALL_TOP``), else
    by ATen; with only top-p all of them sorted; else all of them in vocabulary order (no sort)."""
    mc, cfg, width = ctx.model.config, ctx.search.sampling, logits.shape[1]
    skip = ctx.head.skip
    if cfg.topk or cfg.topp < 1.0:
        num = min(cfg.topk or width, width)
        lp, columns = (ctx.model.ops if num <= SMALL_TOP else ATEN).row_top(logits, num, skip)  # (N, M) best first
    else:
        lp = torch.log_softmax(logits.float(), dim=-1)  # (N, V|C)
        if skip >= 0:
            lp[:, skip] = float("-inf")
        columns = torch.arange(width, device=lp.device).expand(lp.shape[0], width)
    return finish_row_top(lp, columns, ctx.head.ids, ix.force, mc.eos_token_id, ix.forced)


def reference_step(ctx: StepContext, hidden: Tensor, ix: StepIndex) -> Tensor:
    """The reference: output layer, proposal, finished pools, pruning, stop test, reorder (a static
    step's unplanned slots keep their state) -> the packed readback."""
    k, st, slots, t = ctx.search.beam_size, ctx.state, ix.slots, ix.t
    with record_function("output layer"):
        logits = ctx.model.project(hidden, ctx.head)  # (N, V|C)
    cands, sel = propose(ctx, logits, ix)
    planned = None if ix.planned is None else ix.planned & ~st.done[slots]  # static: done ones stay frozen
    if planned is not None:  # static step: slots not planned finish nothing
        sel = replace(sel, finished=sel.finished & planned[:, None])
    norm = ctx.norm[ix.generated]  # (B',)
    if ctx.model.ops.may_any(sel.finished):  # (on the CPU: skipped when no candidate finished)
        st.add_finished(slots, cands, sel, ix.generated, norm, candidate_history(ctx, slots, cands, t))
    pool = st.pool_summary(slots)
    running = st.prune(cands, sel, pool.best_log_prob, ctx.rules.pruning, planned)
    running, order = running.sort(dim=1, descending=True, stable=True)  # live beams first
    chosen = sel.running.gather(1, order)  # (B', K) candidate index of each new beam
    done = stop_mask(running[:, 0], ix.at_max, pool, norm, ctx.rules.early_stopping)
    with record_function("cache reorder"):  # ancestry columns only: K/V never move
        base = slots[:, None] * k  # (B', 1)
        dst = base + ctx.beams  # (B', K)
        source, new_last = base + cands.beams.gather(1, chosen), cands.tokens.gather(1, chosen)  # (B', K)
        if planned is not None:  # static step: slots not planned keep their beams
            keep = ~planned[:, None]
            done = st.done[slots] | (done & planned)  # what a (deferred) readback reports
            st.done[slots] = done
            running = torch.where(keep, st.running[slots], running)
            source, new_last = torch.where(keep, dst, source), torch.where(keep, st.last[dst], new_last)
        if k > 1:  # (one beam per sentence: nothing to reorder)
            ctx.cache.reorder(source.view(-1), dst.view(-1), t)
        st.last[dst.view(-1)] = new_last.view(-1)
        st.running[slots] = running
    return Readback.gather(st, slots, done, torch.isfinite(running).sum(1), ctx.rules.num_hypotheses, t - 1,
                           results=ctx.model.ops.may_any(done))


def native_step(ctx: StepContext, hidden: Tensor, ix: StepIndex) -> Tensor:
    """The CPU's step: the fused output layer's row top (product, log-softmax, top 2K), then the
    whole beam step in one native call (``SlotState.fused_step``; beam 1 too)."""
    k, mc = ctx.search.beam_size, ctx.model.config
    lp, columns = ctx.model.row_top(hidden, ctx.head, 2 * k)  # (N, 2K)
    top = finish_row_top(lp, columns, ctx.head.ids, ix.force, mc.eos_token_id, ix.forced)
    return ctx.state.fused_step(ctx.model.ops.beam_kernel, top, ix, ctx.norm, ctx.cache, ctx.rules, mc.eos_token_id)


def greedy_step(ctx: StepContext, hidden: Tensor, ix: StepIndex) -> Tensor:
    """Beam 1 without pruning (one row per slot): ``greedy_select``, the reference's outcome at K = 1
    in a third of its small operators -> the packed readback."""
    st, slots, mc = ctx.state, ix.slots, ctx.model.config
    with record_function("output layer"):
        logits = ctx.model.project(hidden, ctx.head)  # (B', V|C)
    top = row_top_log_probs(logits, 1, mc.pad_token_id, ix.force, mc.eos_token_id, ctx.head.ids, ctx.model.ops,
                            skip=ctx.head.skip, forced=ix.forced)
    sel = greedy_select(top, st.running[slots, 0], ix.at_max, mc.eos_token_id)
    done = ctx.model.ops.may_any(sel.done)  # (on the CPU: pools written only when a sentence is done)
    history = ctx.cache.history(slots, ix.t) if done else None  # (B', t - 1)
    st.greedy_update(slots, sel, ix.generated, ctx.norm[ix.generated] if done else None, history)
    return Readback.gather(st, slots, sel.done, (~sel.done).long(), 1, ix.t - 1, results=done)


def candidate_history(ctx: StepContext, slots: Tensor, cands: Candidates, t: int) -> Tensor:
    """The first K candidates' (the only ones that may finish) source beams' tokens (B', K, t - 1)
    (columns past a candidate's length are unread)."""
    k = ctx.search.beam_size
    source = (slots[:, None] * k + cands.beams[:, :k]).view(-1) if k > 1 else slots  # (B'K,)
    return ctx.cache.history(source, t).view(slots.shape[0], k, t - 1)
