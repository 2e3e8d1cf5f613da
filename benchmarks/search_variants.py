"""Search benchmarks in the shape of the papers' tables, on one model and one input.

* Freitag & Al-Onaizan (2017) Table 1: per beam size, no pruning, each heuristic alone, all
  combined -> BLEU, speed-up, avg fan-out per step, total fan-out per sentence, search errors.
* Shi & Knight (2017) Table 2: full vocabulary, top-frequency, alignment-based and self-built
  shortlists -> reference token coverage, BLEU, speed-up, mean shortlist size.

Systems are run interleaved (A B C A B C ...) ``repeats`` times and timed by the median, so a
noisy shared CPU moves every system alike; ratios, never lone absolute times, are the result.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field, replace

import sacrebleu
import torch
from torch import Tensor

from raymt.workers.config import PruningConfig, SearchConfig
from raymt.workers.decoder.decode_config import DecodeRequest
from raymt.workers.decoder.engine import DecodeStats
from raymt.workers.search.selection import NEG_INF, RowTop, force_eos_rows
from raymt.workers.search.shortlist import Shortlist, coverage
from raymt.workers.decoder.core_decoder import CoreDecoder


@dataclass
class SystemRun:
    name: str
    cfg: SearchConfig
    shortlist: Shortlist | None = None
    seconds: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    stats: DecodeStats = field(default_factory=DecodeStats)
    shortlist_sizes: list[int] = field(default_factory=list)

    @property
    def median_seconds(self) -> float:
        return statistics.median(self.seconds)


def run_interleaved(translator: CoreDecoder, sources: list[str], systems: list[SystemRun], repeats: int) -> None:
    """Translate ``sources`` with every system, interleaved, ``repeats`` times (the last run's output is kept)."""
    ids = translator.encode(sources)
    tok = translator.checkpoint.tokenizer
    for _ in range(repeats):
        for system in systems:
            start = time.perf_counter()
            decoded = translator.decode_ids(ids, DecodeRequest(system.cfg, system.shortlist))
            hyps = decoded.hypotheses
            system.seconds.append(time.perf_counter() - start)
            system.texts = [tok.decode(list(h[0].tokens)) for h in hyps]
            system.scores = [h[0].score for h in hyps]
            system.stats, system.shortlist_sizes = decoded.stats, decoded.stats.shortlist_sizes


def search_errors(exact: SystemRun, other: SystemRun) -> float:
    """Share of sentences whose output changed to a worse-scoring one (pruning lost the exact best)."""
    changed = sum(a != b and sa > sb + 1e-6
                  for a, b, sa, sb in zip(exact.texts, other.texts, exact.scores, other.scores))
    return changed / max(len(exact.texts), 1)


def pruning_systems(beam: int, heuristics: dict[str, PruningConfig], base: SearchConfig) -> list[SystemRun]:
    cfg = replace(base, beam_size=beam)
    systems = [SystemRun(f"beam {beam}, no pruning", cfg)]
    systems += [SystemRun(f"beam {beam}, {name}", replace(cfg, pruning=p)) for name, p in heuristics.items()]
    return systems


def freitag_rows(systems: list[SystemRun], references: list[str]) -> list[dict]:
    exact = systems[0]
    rows = []
    for s in systems:
        st = s.stats
        rows.append({
            "system": s.name, "pruning": s.cfg.pruning.signature(),
            "bleu": round(sacrebleu.corpus_bleu(s.texts, [references]).score, 2),
            "speedup": round(exact.median_seconds / s.median_seconds, 3),
            "avg_fan_out_per_step": round(st.row_steps / max(st.sentence_steps, 1), 3),
            "tot_fan_out_per_sent": round(st.row_steps / max(len(s.texts), 1), 2),
            "search_errors": round(search_errors(exact, s), 4),
            "pruned": st.pruned, "median_s": round(s.median_seconds, 3)})
    return rows


def sentence_coverage(shortlist: Shortlist, source_ids: list[list[int]], reference_ids: list[list[int]]) -> float:
    """The paper's TC: reference target tokens covered by each sentence's own candidate set."""
    covered = sum(coverage(shortlist.candidates([src]), [ref]) * len(ref) for src, ref in zip(source_ids, reference_ids))
    return covered / max(sum(map(len, reference_ids)), 1)


def shortlist_rows(systems: list[SystemRun], references: list[str], source_ids: list[list[int]],
                   reference_ids: list[list[int]]) -> list[dict]:
    full = systems[0]
    rows = []
    for s in systems:
        sizes = s.shortlist_sizes
        cov = 1.0 if s.shortlist is None else sentence_coverage(s.shortlist, source_ids, reference_ids)
        rows.append({
            "system": s.name, "coverage": round(cov, 4),
            "bleu": round(sacrebleu.corpus_bleu(s.texts, [references]).score, 2),
            "speedup": round(full.median_seconds / s.median_seconds, 3),
            "mean_shortlist": round(sum(sizes) / len(sizes), 1) if sizes else None,
            "median_s": round(s.median_seconds, 3)})
    return rows


def output_layer_rows(translator: CoreDecoder, *, rows: tuple[int, ...] = (5, 40, 160), num: int = 10,
                      repeats: int = 50) -> list[dict]:
    """Fused output step (logsumexp + top-k over raw logits) against log_softmax -> top-k (the default).

    Both start from the same decoder hidden states and include the output projection, so the ratio
    is what the fused step saves per decoder step at each number of live rows (B*K).
    """
    import torch

    from raymt.workers.search.selection import row_top_log_probs

    model = translator.checkpoint.model
    pad = model.config.pad_token_id
    torch.manual_seed(0)
    out = []
    for n in rows:
        hidden = torch.randn(n, model.config.d_model)

        def naive() -> None:
            row_top_log_probs(model.project(hidden), num, pad)  # (N, V) log-softmax materialised

        def fused() -> None:
            row_top_log_probs_fused(model.project(hidden), num, pad)

        times = {"naive": [], "fused": []}
        with torch.inference_mode():
            for fn in (naive, fused):
                fn()  # warm-up
            for _ in range(repeats):
                for name, fn in (("naive", naive), ("fused", fused)):
                    start = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - start)
        a, b = statistics.median(times["naive"]), statistics.median(times["fused"])
        out.append({"rows": n, "vocab": model.config.decoder_vocab_size, "top": num, "naive_us": round(a * 1e6, 1),
                    "fused_us": round(b * 1e6, 1), "speedup": round(a / b, 3)})
    return out


def row_top_log_probs_fused(logits: Tensor, num: int, pad_id: int, force_eos: Tensor | None = None,
                      eos_id: int = 0, token_ids: Tensor | None = None) -> RowTop:
    """Fused output step (measured, not the default): logits (N, V) -> each row's ``num`` best log-probs, ``<pad>`` banned.

    One pass over the logits for the log-normaliser (``<pad>`` included, as HF normalises before
    banning) and one top-k; the full (N, V) log-softmax is never materialised (the top-up paper's
    Algorithm 2 in torch terms). ``num + 1`` are taken so that a banned ``<pad>`` can be dropped.
    Rows where ``force_eos`` is set get EOS at log-prob 0 and nothing else. With a shortlist, logits
    are over candidate positions (N, C) and ``token_ids`` (C,) maps positions to vocabulary ids.
    """
    logits = logits.float()
    n, v = logits.shape
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)  # (N, 1)
    values, tokens = torch.topk(logits, min(num + 1, v), dim=1)  # (N, M+1)
    if token_ids is not None:
        tokens = token_ids[tokens]
    values = values.masked_fill(tokens == pad_id, NEG_INF)
    values, order = torch.topk(values, min(num, v), dim=1)  # (N, M): pad (now -inf) sorted out
    tokens = tokens.gather(1, order)
    log_probs = values - lse
    return force_eos_rows(RowTop(log_probs, tokens), force_eos, eos_id)
