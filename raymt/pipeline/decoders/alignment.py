"""Word alignment with eflomal and lexical tables for the shortlist vocabulary.

Two spaces (Shi & Knight 2017 align words; a subword model needs subword candidates):

* ``subword``: align the model's sentencepiece pieces directly;
* ``word``: align whitespace words, then credit every (source piece, target piece) pair of each
  aligned word pair.

Links of both directions are counted (their union), giving ML estimates of P(target | source).
"""
from __future__ import annotations

import logging
import os
import tempfile
from collections import Counter
from collections.abc import Sequence

from raymt.pipeline.extras import require
from raymt.workers.search.shortlist import MAX_PER_SOURCE, LexicalTable
from raymt.workers.text.tokenizer import MarianTokenizer

logger = logging.getLogger(__name__)
SPACES = ("subword", "word")


def align(source: Sequence[str], target: Sequence[str], *, seed_iterations: int | None = None) -> list[set[tuple[int, int]]]:
    """eflomal links (source position, target position) per sentence pair, both directions' union.

    Inputs are whitespace-tokenised lines; empty lines get no links.
    """
    eflomal = require("eflomal", "align", "aligning a bitext")

    if len(source) != len(target):
        raise ValueError(f"bitext sides differ in length: {len(source)} vs {len(target)}")
    with tempfile.TemporaryDirectory() as tmp:
        fwd, rev = os.path.join(tmp, "fwd"), os.path.join(tmp, "rev")
        src = [line if line.strip() else "<empty>" for line in source]
        tgt = [line if line.strip() else "<empty>" for line in target]
        eflomal.Aligner(n_iterations=seed_iterations).align(src, tgt, links_filename_fwd=fwd, links_filename_rev=rev)
        with open(fwd, encoding="utf-8") as f_fwd, open(rev, encoding="utf-8") as f_rev:
            links = []
            for line_fwd, line_rev, s, t in zip(f_fwd, f_rev, source, target):
                pairs = {tuple(map(int, p.split("-"))) for p in (line_fwd.split() + line_rev.split())}
                links.append(pairs if s.strip() and t.strip() else set())
    return links


def _piece_ids(tok: MarianTokenizer, pieces: list[str], side: str) -> list[int]:
    vocab = tok.source_vocab if side == "source" else tok.target_vocab
    unk = vocab["<unk>"]
    return [vocab.get(p, unk) for p in pieces]


def lexical_table(tok: MarianTokenizer, source: Sequence[str], target: Sequence[str], *,
                  space: str = "subword", max_per_source: int = MAX_PER_SOURCE) -> LexicalTable:
    """P(target piece | source piece) from eflomal alignments of a bitext in ``space``."""
    if space not in SPACES:
        raise ValueError(f"space must be one of {SPACES}, got {space!r}")
    src_pieces = [tok.source_pieces(s) for s in source]
    tgt_pieces = [tok.target_spm.encode(t, out_type=str) for t in target]
    pair_counts: Counter = Counter()
    target_counts: Counter = Counter()
    for pieces in tgt_pieces:
        target_counts.update(_piece_ids(tok, pieces, "target"))
    if space == "subword":
        links = align([" ".join(p) for p in src_pieces], [" ".join(p) for p in tgt_pieces])
        for sp, tp, pairs in zip(src_pieces, tgt_pieces, links):
            s_ids, t_ids = _piece_ids(tok, sp, "source"), _piece_ids(tok, tp, "target")
            pair_counts.update((s_ids[i], t_ids[j]) for i, j in pairs if i < len(s_ids) and j < len(t_ids))
    else:
        src_words = [s.split() for s in source]
        tgt_words = [t.split() for t in target]
        links = align([" ".join(w) for w in src_words], [" ".join(w) for w in tgt_words])
        for sw, tw, pairs in zip(src_words, tgt_words, links):
            for i, j in pairs:
                if i < len(sw) and j < len(tw):
                    s_ids = _piece_ids(tok, tok.source_spm.encode(sw[i], out_type=str), "source")
                    t_ids = _piece_ids(tok, tok.target_spm.encode(tw[j], out_type=str), "target")
                    pair_counts.update((s, t) for s in s_ids for t in t_ids)
    logger.info("lexical table (%s space): %d aligned pairs over %d sentences", space, len(pair_counts), len(source))
    return LexicalTable.from_counts(dict(pair_counts), dict(target_counts), max_per_source=max_per_source)


def frequency_table(tok: MarianTokenizer, target: Sequence[str]) -> LexicalTable:
    """The top-frequency baseline (TF): no translations, only the target frequency list."""
    counts: Counter = Counter()
    for t in target:
        counts.update(_piece_ids(tok, tok.target_spm.encode(t, out_type=str), "target"))
    return LexicalTable({}, [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))])
