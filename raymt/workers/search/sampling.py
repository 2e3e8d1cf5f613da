"""Random sampling as a search step's candidates: each of a sentence's K lanes draws its next token.

Pure functions, no model. A lane's draw at a step comes from one uniform number that is a hash of
(the sentence's key, the lane, the step): the sentence's key hashes the seed, its source ids and
its forced first token (``sentence_key``), so a sentence's samples are the same whichever sentences
share its steps, however a job is cut into units, on a resume, and on the CPU and a GPU alike (the
hash is integer arithmetic that never overflows int64). Two rows with the same source text and
target language draw the same samples; another seed draws others.

The draw is Gumbel-max over the tokens a row considers (``search_step.sampling_rows``): with
``topk`` its ``topk`` best, else all of them (sorted best first only for ``topp``); divided by the
temperature, cut to the smallest prefix holding ``topp`` of the mass; each token given noise
-log(-log u) from its own uniform, a hash of (sentence key, lane, step, token id), and the best
noisy score drawn. That is an exact draw from the tempered, cut softmax, and a robust one: float
rounding that moves the model's probabilities a few 1e-6 between batch shapes (or devices, or
shortlists that add unlikely tokens) changes a draw only where two noisy scores tie within it,
where an inverse-CDF walk over thousands of tokens flips between neighbours every few dozen draws.
The candidate's score is the model's own log-prob of the token (temperature 1, whole vocabulary),
so a sample's score is what beam search would score the same tokens.

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
from raymt.workers.search.selection import NEG_INF, Candidates, RowTop

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


def lane_hashes(keys: Tensor, lanes: Tensor, steps: Tensor) -> Tensor:
    """keys, lanes, steps int64 (broadcast together) -> each lane's hash at the step, int64 in [0, 2**32)."""
    h = _mix(keys & MASK32)
    h = _mix(h ^ ((keys >> 32) & MASK32))
    h = _mix(h ^ (lanes & MASK32))
    return _mix(h ^ ((steps * MULTIPLIERS[2]) & MASK32))


def uniforms(hashes: Tensor, tokens: Tensor) -> Tensor:
    """hashes (...) from ``lane_hashes``, tokens int64 (..., M) -> float32 uniforms (..., M) in (0, 1),
    one a token: 23 bits each at the middle of their interval ((2i + 1) / 2**24), so 0 and 1 never
    occur. The per-token hash runs in int32, whose products wrap modulo 2**32 on every device (the
    same bits as the int64 products masked); logical shifts are arithmetic ones masked."""
    h = ((hashes ^ 0x80000000) - 0x80000000).to(torch.int32)[..., None] ^ tokens.to(torch.int32)  # (..., M)
    for m, shift in ((MULTIPLIERS[0], 16), (MULTIPLIERS[1], 15)):
        h ^= (h >> shift) & (MASK32 >> shift)
        h *= m
    h ^= (h >> 16) & 0xFFFF
    return (((h >> 9) & 0x7FFFFF) * 2 + 1).float().mul_(1.0 / (1 << 24))


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
    """log_probs (..., M) (-inf: not possible; sorted best first where ``cfg.topp`` < 1), u (..., M)
    each token's uniform -> the index drawn (...): the best of scaled log-prob + Gumbel noise. A row
    with nothing possible draws index 0 (its lane's score is -inf anyway). The row's best log-prob
    is subtracted before dividing by the temperature, in float32: the best token scales to 0 and
    the others to <= 0 (-inf staying -inf) at any temperature ``SamplingConfig`` allows, so a cold
    one tends to greedy and a hot one to uniform, never to NaN."""
    log_probs = log_probs.float()
    best = log_probs.amax(-1, keepdim=True)  # (..., 1)
    empty = ~torch.isfinite(best)
    scaled = (log_probs - best.masked_fill(empty, 0.0)) / cfg.temperature  # (..., M)
    scaled = nucleus(scaled.masked_fill(empty, 0.0), cfg.topp)
    index = scaled.sub_(u.log().neg_().log_()).argmax(-1)  # (+ Gumbel noise -log(-log u), u in (0, 1): finite)
    return index.masked_fill(empty[..., 0], 0)


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
    u = uniforms(lane_hashes(keys[:, None], lane, generated[:, None]), tokens)  # (B', K, M)
    index = draw(lp, u, cfg)[..., None]  # (B', K, 1)
    word = lp.gather(2, index)[..., 0]  # (B', K)
    return Candidates(running.gather(1, source) + word, source, tokens.gather(2, index)[..., 0], word)
