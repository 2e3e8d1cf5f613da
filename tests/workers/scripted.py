"""A stub decoder that reads scripted probability tables, for the engine's exact tests
(test_engine.py, test_beam_rules.py, test_beam_step.py).

The stub (fairseq's test-helper idea) returns, for every decoder row, the log of a scripted
distribution keyed by (sentence, generated prefix), so the tests can assert exact tokens and scores.
It keeps both keys inside a real ``KVCache``: the sentence key rides in the slot's cross-attention K,
and the prefix is read back through the cache's ancestry table (the input token each row fed at each
position). The prefix is therefore exactly what the engine's beam reordering preserved: a mis-routed
row shows up as wrong tokens or scores.

Vocabulary of the hand tables: E=0 (EOS), A..D=1..4, PAD=5 (also the decoder start token).
"""
from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from raymt.workers.model.cache import KVCache, StepAt
from raymt.workers.config import ModelConfig, SearchConfig
from raymt.workers.decoder.engine import DecodeStats
from raymt.workers.model.output_head import OutputHead
from raymt.workers.search.selection import Hypothesis
from raymt.workers.model.step_ops import ATEN, AtenOps

E, A, B, C, D, PAD = range(6)
V = 6

Dist = dict[int, float]  # token -> probability; unlisted tokens get 0
Table = dict[tuple[int, ...], Dist]  # generated prefix -> next-token distribution
ProbsFn = Callable[[int, tuple[int, ...]], Sequence[float]]  # (sentence key, prefix) -> (V,) probabilities
FALLBACK: Dist = {E: 1.0}  # prefixes a table does not list (also the -inf placeholder beams)


class ScriptedModel:
    """Stands in for ``MarianModel``: config / device / ops / new_cache / encode / cross_kv / output_head / decode_hidden /
    project / row_top."""

    device = torch.device("cpu")

    def __init__(self, probs: ProbsFn, vocab_size: int = V, ops: AtenOps = ATEN) -> None:
        self.vocab_size, self.ops = vocab_size, ops  # ops: the output step's backend (workers/model/step_ops.py)
        self.config = ModelConfig(vocab_size=vocab_size, decoder_vocab_size=vocab_size, d_model=4,
                                  encoder_layers=1, decoder_layers=1, encoder_attention_heads=1,
                                  decoder_attention_heads=1, encoder_ffn_dim=4, decoder_ffn_dim=4,
                                  pad_token_id=vocab_size - 1, eos_token_id=0,
                                  decoder_start_token_id=vocab_size - 1)
        self.probs = probs
        self.rows_per_step: list[int] = []

    def new_cache(self, slots: int, beam_size: int, source_capacity: int, **kwargs) -> KVCache:
        kwargs.pop("zeroed", None), kwargs.pop("static", None)
        return KVCache.empty(layers=1, heads=1, head_dim=1, slots=slots, beam_size=beam_size,
                             source_capacity=source_capacity, dtype=torch.float32, device=self.device, zeroed=True,
                             **kwargs)

    def encode(self, src_ids: Tensor, src_mask: Tensor) -> Tensor:
        """(B, S) -> memory (B, S, 1) whose every position holds the sentence key src_ids[:, 0]."""
        return src_ids[:, :1].float()[:, :, None].expand(*src_ids.shape, 1)

    def cross_kv(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]:
        """The sentence key rides in every position of its cross-attention K."""
        key = memory[:, None, :, :]  # (B, H, S, D)
        return [(key, key.clone())]

    def output_head(self, candidates: Tensor | None = None) -> OutputHead:
        pad = self.config.pad_token_id
        skip = pad if candidates is None else (candidates.tolist() + [pad]).index(pad) if pad in candidates else -1
        return OutputHead(candidates, torch.empty(0), None, skip=skip)

    def decode_hidden(self, tokens: Tensor, at: StepAt, cache: KVCache) -> Tensor:
        """tokens (N,) of the rows ``at`` runs -> "hidden states" (N, V) = log of the scripted
        distribution (``project`` cuts them to a shortlist's columns). Each row's prefix is read back through the cache's ancestry: a mis-routed
        reorder shows up as wrong tokens or scores."""
        n = tokens.shape[0]
        self.rows_per_step.append(n)
        history = cache.history(at.rows, at.t).tolist()  # (N, t - 1)
        logits = torch.empty(n, self.vocab_size)
        for row, (position, slot) in enumerate(zip(at.positions.tolist(), at.sentence.tolist())):
            if position == 0:
                assert int(tokens[row]) == self.config.decoder_start_token_id
            sentence = int(cache.cross_k[0, slot, 0, 0, 0])
            logits[row] = torch.tensor(self.probs(sentence, tuple(history[row][:position])), dtype=torch.float64).log()
        return logits

    def project(self, hidden: Tensor, head: OutputHead) -> Tensor:
        return hidden if head.ids is None else hidden[:, head.ids]  # a shortlist: candidate columns only

    def row_top(self, hidden: Tensor, head: OutputHead, num: int) -> tuple[Tensor, Tensor]:
        return self.ops.row_top(self.project(hidden, head), num, head.skip)


def scripted(tables: dict[int, Table], vocab_size: int = V) -> ProbsFn:
    for table in tables.values():
        for prefix, dist in table.items():
            assert math.isclose(sum(dist.values()), 1.0), prefix

    def probs(sentence: int, prefix: tuple[int, ...]) -> list[float]:
        dist = tables[sentence].get(prefix, FALLBACK)
        return [dist.get(t, 0.0) for t in range(vocab_size)]
    return probs


def random_tables(seed: int, vocab_size: int) -> ProbsFn:
    """A fresh random distribution per (sentence, prefix), reproducible; PAD gets mass too."""
    def probs(sentence: int, prefix: tuple[int, ...]) -> list[float]:
        rng = random.Random(f"{seed}/{sentence}/{prefix}")
        weights = [rng.random() + 0.05 for _ in range(vocab_size)]
        return [w / sum(weights) for w in weights]
    return probs


def decode(search: Callable, model: ScriptedModel, cfg: SearchConfig, sources: Sequence[tuple[int, int]],
           *, forced_eos: bool = True, stats: DecodeStats | None = None) -> list[list[Hypothesis]]:
    """sources: (sentence key, source length) per sentence, padded into one batch."""
    pad = model.config.pad_token_id
    src_ids = torch.full((len(sources), max(n for _, n in sources)), pad, dtype=torch.long)  # (B, S)
    src_mask = torch.zeros(src_ids.shape, dtype=torch.bool)
    for b, (key, length) in enumerate(sources):
        src_ids[b, :length], src_mask[b, :length] = key, True
    return search(model, src_ids, src_mask, cfg, forced_eos=forced_eos, stats=stats)
