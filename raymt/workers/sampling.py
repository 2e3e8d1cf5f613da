"""Random sampling as a search step's candidates: each of a sentence's K lanes draws its next token.

Pure functions, no model. A lane's draw at a step comes from one uniform number that is a hash of
(the sentence's key, the lane, the step): the sentence's key hashes the seed, its source ids and
its forced first token (``sentence_key``), so a sentence's samples are the same whichever sentences
share its steps, however a job is cut into units, on a resume, and on the CPU and a GPU alike (the
hash is integer arithmetic that never overflows int64). Two rows with the same source text and
target language draw the same samples; another seed draws others.

The draw is inverse-CDF over the tokens a row considers (``search_step.sampling_rows``): with
``topk`` its ``topk`` best, best first, else all of them (sorted best first only for ``topp``);
divided by the temperature, cut to the smallest prefix holding ``topp`` of the mass, renormalised. The candidate's score is the model's own
log-prob of the token (temperature 1, whole vocabulary), so a sample's score is what beam search
would score the same tokens.

At a sentence's first step only lane 0 runs (``SlotState.admit``): every lane draws from its row;
after that lane j draws from its own row and a finished lane stays empty. Lanes are sorted by score
after every step (``select_step``), which is a function of the sentence's own draws.

Dimension letters: B' planned slots, K lanes, M each row's tokens considered, N run rows.
"""
from __future__ import annotations

import hashlib

import torch
from torch import Tensor

from raymt.workers.config import SamplingConfig
from raymt.workers.search import NEG_INF, Candidates, RowTop

MASK32 = 0xFFFFFFFF
# Odd multipliers below 2**31: a product with a 32-bit value stays below 2**63 (no int64 overflow).
MULTIPLIERS = (0x7FEB352D, 0x2C1B3C6D, 0x297A2D39)


def sentence_key(seed: int, source: list[int], forced_first: int = -1) -> int:
    """A sentence's sampling key, 62 bits, on the host: a hash of the seed, its source ids and its forced
    first token (its target language)."""
    text = f"{seed}|{forced_first}|" + ",".join(map(str, source))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 2


def _mix(x: Tensor) -> Tensor:
    """A 32-bit integer hash (two xorshift-multiply rounds), x int64 in [0, 2**32) -> same range."""
    for m in MULTIPLIERS[:2]:
        x = x ^ (x >> 16)
        x = (x * m) & MASK32
    return x ^ (x >> 15)


def uniforms(keys: Tensor, lanes: Tensor, steps: Tensor) -> Tensor:
    """keys, lanes, steps int64 (broadcast together) -> float32 uniforms in [0, 1), 24 bits each."""
    h = _mix(keys & MASK32)
    h = _mix(h ^ ((keys >> 32) & MASK32))
    h = _mix(h ^ (lanes & MASK32))
    h = _mix(h ^ ((steps * MULTIPLIERS[2]) & MASK32))
    return (h >> 8).float() / float(1 << 24)


def nucleus(scaled: Tensor, topp: float) -> Tensor:
    """scaled log-probs (..., M) sorted best first -> the same with everything past the smallest prefix
    holding ``topp`` of the mass at -inf (the first token always stays)."""
    if topp >= 1.0:
        return scaled
    probs = torch.softmax(scaled, -1)
    before = probs.cumsum(-1) - probs  # mass of the better tokens
    keep = before < topp
    keep[..., 0] = True
    return scaled.masked_fill(~keep, NEG_INF)


def draw(log_probs: Tensor, u: Tensor, cfg: SamplingConfig) -> Tensor:
    """log_probs (..., M) (-inf: not possible; sorted best first where ``cfg.topp`` < 1), u (...)
    uniforms -> the index drawn (...). A row with nothing possible draws index 0 (its lane's score is
    -inf anyway). The row's best log-prob is subtracted before dividing by the temperature, in float32:
    the best token scales to 0 and the others to <= 0 (-inf staying -inf) at any temperature
    ``SamplingConfig`` allows, so a cold one tends to greedy and a hot one to uniform, never to NaN."""
    log_probs = log_probs.float()
    best = log_probs.amax(-1, keepdim=True)  # (..., 1)
    empty = ~torch.isfinite(best)
    scaled = (log_probs - best.masked_fill(empty, 0.0)) / cfg.temperature  # (..., M)
    scaled = nucleus(scaled.masked_fill(empty, 0.0), cfg.topp)
    cdf = torch.softmax(scaled, -1).cumsum(-1)  # (..., M)
    index = (cdf < u[..., None] * cdf[..., -1:]).sum(-1)
    return index.clamp(max=log_probs.shape[-1] - 1).masked_fill(empty[..., 0], 0)


def sample_candidates(top: RowTop, grid: Tensor | None, running: Tensor, generated: Tensor, keys: Tensor,
                      cfg: SamplingConfig) -> Candidates:
    """One sampling step's candidates, one per lane (B', K), unsorted: top (N, M) the run rows' best
    tokens; grid (N,) their (B' x K) entries (None: N = B' x K); running (B', K) cumulative log-probs
    (-inf: no lane); generated (B',) tokens after this step (1: the first step); keys (B',)
    ``sentence_key``s."""
    b, k = running.shape
    m = top.log_probs.shape[1]
    lp, tokens = top.log_probs, top.tokens
    if grid is not None:  # (rows of lanes not running: -inf)
        lp = lp.new_full((b * k, m), NEG_INF).index_copy(0, grid, lp)
        tokens = tokens.new_zeros((b * k, m)).index_copy(0, grid, tokens)
    lane = torch.arange(k, device=running.device)[None, :]  # (1, K)
    source = torch.where(generated[:, None] == 1, 0, lane)  # (B', K): the first step draws every lane from lane 0
    rows = (torch.arange(b, device=running.device)[:, None] * k + source).view(-1)  # (B'K,)
    lp, tokens = lp[rows].view(b, k, m), tokens[rows].view(b, k, m)
    index = draw(lp, uniforms(keys[:, None], lane, generated[:, None]), cfg)[..., None]  # (B', K, 1)
    word = lp.gather(2, index)[..., 0]  # (B', K)
    return Candidates(running.gather(1, source) + word, source, tokens.gather(2, index)[..., 0], word)
