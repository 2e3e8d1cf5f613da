"""The CPU's one-call beam step (``workers/kernels/csrc/beam_step.cpp``) against the Python step functions,
on the scripted decoder of ``tests/workers/scripted.py``."""
from __future__ import annotations

import pytest
import torch

from tests.workers.scripted import ScriptedModel, random_tables
from raymt.workers.config import PruningConfig, SearchConfig
from raymt.workers.decoder.engine import DecodeStats
from raymt.workers.kernels.native import load as load_native
from raymt.workers.model.step_ops import ATEN, NativeOps
from tests.workers.reference_decoding import beam_search


def native_or_skip() -> NativeOps:
    kernels = load_native()
    if kernels is None:
        pytest.skip("native decode operators could not be built here")
    return NativeOps(kernels)


@pytest.mark.parametrize("beam_size, nbest, length_penalty, early_stopping, forced_eos, shortlist, pruning", [
    (2, 2, 1.0, False, True, False, {}), (3, 1, 0.6, False, False, False, {}), (4, 3, 1.0, True, True, False, {}),
    (5, 5, 0.0, False, True, True, {}), (6, 2, 2.0, False, False, True, {}),
    (5, 1, 1.0, False, True, False, dict(rp=0.3)), (6, 2, 0.6, False, True, False, dict(ap=1.0, rpl=0.2)),
    (6, 3, 1.0, False, False, True, dict(mc=1)), (5, 2, 0.0, False, True, False, dict(delta=1.5, early_stop=True)),
    (4, 1, 1.0, True, True, True, dict(rp=0.5, mc=2, delta=2.0)),
    (1, 1, 1.0, False, True, False, {}), (1, 1, 0.6, False, False, True, {}),  # greedy: the Python greedy step
    (1, 1, 1.0, True, True, False, dict(delta=0.5, early_stop=True)),  # (beam 1 with pruning: the beam step)
])
def test_the_fused_native_beam_step_equals_the_python_step(beam_size, nbest, length_penalty, early_stopping,
                                                           forced_eos, shortlist, pruning) -> None:
    """workers/kernels/csrc/beam_step.cpp (the CPU's one-call beam step) against the Python step functions on
    random tables: the same tokens, scores and log-probs to the bit, the same steps and the same
    pruned count, with caps from 2 to 6, finished pools that fill and merge, forced EOS on and off,
    a shortlist, and every pruning heuristic."""
    native = native_or_skip()
    cfg = SearchConfig(beam_size=beam_size, num_hypotheses=nbest, length_penalty=length_penalty,
                       early_stopping=early_stopping, max_length_a=1.0, max_length_b=1, max_decoding_length=6,
                       pruning=PruningConfig(**pruning))
    probs, vocab = random_tables(seed=beam_size, vocab_size=9), 9
    sources = [(key, length) for key, length in enumerate((3, 1, 6, 2, 5, 4, 6))]
    candidates = torch.tensor([0, 2, 3, 5, 6, 8]) if shortlist else None  # (PAD = 8 among them)
    results, steps = [], []
    for ops in (ATEN, native):  # the Python step functions, then the one native call
        model, stats = ScriptedModel(probs, vocab, ops), DecodeStats()
        pad = model.config.pad_token_id
        src_ids = torch.full((len(sources), 6), pad, dtype=torch.long)
        src_mask = torch.zeros(src_ids.shape, dtype=torch.bool)
        for b, (key, length) in enumerate(sources):
            src_ids[b, :length], src_mask[b, :length] = key, True
        results.append(beam_search(model, src_ids, src_mask, cfg, forced_eos=forced_eos, candidates=candidates,
                                   stats=stats))
        steps.append((stats.steps, stats.row_steps, model.rows_per_step, stats.pruned))
    assert native.beam_kernel is not None
    assert results[0] == results[1] and steps[0] == steps[1]
    assert (steps[0][3] > 0) == bool(pruning)  # (the heuristics discard candidates on these tables)
    assert pruning or all(len(r) == nbest for r in results[1])  # (pruning may end a sentence with fewer)
