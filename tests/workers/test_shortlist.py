"""Shortlist vocabulary: candidate sets, coverage, file formats, and decoding with a shortlist."""
from __future__ import annotations

import pytest
import torch

from tests.workers.reference_decoding import beam_search, greedy_search
from tests.workers.scripted import (
    PAD,
    A,
    B,
    C,
    D,
    E,
    ScriptedModel,
    decode,
    random_tables,
    scripted,
)
from raymt.workers.config import SearchConfig
from raymt.workers.search.shortlist import (
    LanguageShortlists,
    LexicalTable,
    Shortlist,
    coverage,
    read_lex_s2t,
    read_vocab_map,
    write_lex_s2t,
    write_vocab_map,
)

TABLE = LexicalTable(
    translations={10: [(1, 0.6), (2, 0.3), (3, 0.1)], 11: [(4, 0.9), (1, 0.1)], 12: [(5, 1.0)]},
    frequent=[7, 1, 8, 9])
SOURCE_PIECES = {10: "▁Hund", 11: "▁Katze", 12: "▁rot"}
TARGET_PIECES = {1: "▁dog", 2: "▁hound", 3: "▁puppy", 4: "▁cat", 5: "▁red", 7: "▁a", 8: "▁the", 9: "."}


@pytest.mark.parametrize("sources, top_m, top_n, expected", [
    ([[10]], 1, 0, [0, 1, 6]),
    ([[10]], 2, 2, [0, 1, 2, 6, 7]),
    ([[10, 11], [12]], 1, 1, [0, 1, 4, 5, 6, 7]),
    ([[99]], 5, 0, [0, 6]),  # unknown source token: specials only
    ([[10, 10, 10]], 10, 10, [0, 1, 2, 3, 6, 7, 8, 9]),
])
def test_candidates_union_of_top_m_top_n_and_specials(sources, top_m, top_n, expected) -> None:
    shortlist = Shortlist(TABLE, top_m=top_m, top_n=top_n, special_ids=(0, 6))
    assert shortlist.candidates(sources).tolist() == expected


def test_coverage_counts_reference_tokens_inside_the_set() -> None:
    assert coverage(torch.tensor([1, 2, 3]), [[1, 2], [3, 4]]) == 0.75
    assert coverage(torch.tensor([1]), []) == 0.0


def test_from_counts_is_maximum_likelihood_and_sorted() -> None:
    table = LexicalTable.from_counts({(10, 1): 3, (10, 2): 1, (11, 4): 2}, {1: 5, 4: 9, 2: 1})
    assert table.translations[10] == [(1, 0.75), (2, 0.25)]
    assert table.translations[11] == [(4, 1.0)]
    assert table.frequent == [4, 1, 2]


def test_lex_s2t_round_trip() -> None:
    text = write_lex_s2t(TABLE, SOURCE_PIECES, TARGET_PIECES)
    assert text.splitlines()[0] == "▁dog ▁Hund 0.6"
    src_vocab = {p: i for i, p in SOURCE_PIECES.items()}
    tgt_vocab = {p: i for i, p in TARGET_PIECES.items()}
    back = read_lex_s2t(text, src_vocab, tgt_vocab, frequent=TABLE.frequent)
    assert back == TABLE


def test_lex_s2t_rejects_malformed_lines_and_skips_unknown_pieces() -> None:
    with pytest.raises(ValueError, match="line 2"):
        read_lex_s2t("▁dog ▁Hund 0.5\nbroken line\n", {"▁Hund": 10}, {"▁dog": 1})
    table = read_lex_s2t("▁dog ▁Hund 0.5\n▁zebra ▁Hund 0.5\n", {"▁Hund": 10}, {"▁dog": 1})
    assert table.translations == {10: [(1, 0.5)]}


def test_vocab_map_round_trip_keeps_ranks_and_always_candidates() -> None:
    text = write_vocab_map(TABLE, SOURCE_PIECES, TARGET_PIECES, top_m=2, top_n=3)
    assert text.splitlines()[0] == "\t▁a ▁dog ▁the"
    assert "▁Hund\t▁dog ▁hound" in text.splitlines()
    src_vocab = {p: i for i, p in SOURCE_PIECES.items()}
    tgt_vocab = {p: i for i, p in TARGET_PIECES.items()}
    back = read_vocab_map(text, src_vocab, tgt_vocab)
    assert back.frequent == [7, 1, 8]
    assert [t for t, _ in back.translations[10]] == [1, 2]


# --------------------------------------------------------------------------- decoding with a shortlist

@pytest.mark.parametrize("search, beam", [(greedy_search, 1), (beam_search, 2), (beam_search, 4)])
def test_whole_vocabulary_shortlist_is_identical_to_full_decoding(search, beam: int) -> None:
    cfg = SearchConfig(beam_size=beam, num_hypotheses=beam, max_decoding_length=5, max_length_b=5)
    sources = [(k, 2 + k % 3) for k in range(4)]
    full = decode(search, ScriptedModel(random_tables(1, 7), vocab_size=7), cfg, sources)
    every_id = torch.arange(7)
    listed = decode(lambda *a, **kw: search(*a, candidates=every_id, **kw),
                    ScriptedModel(random_tables(1, 7), vocab_size=7), cfg, sources)
    assert listed == full


def test_shortlist_restricts_outputs_and_renormalises() -> None:
    """Without C the best continuation of A is D, at .3 of the .5 that is left: p = .6."""
    table = {(): {A: .6, B: .4}, (A,): {C: .5, D: .3, E: .2}, (B,): {E: 1.0}, (A, D): {E: 1.0}}
    cfg = SearchConfig(beam_size=1, max_decoding_length=4, max_length_b=4)
    candidates = torch.tensor([E, A, B, D, PAD])  # no C
    out = decode(lambda *a, **kw: greedy_search(*a, candidates=candidates, **kw),
                 ScriptedModel(scripted({3: table})), cfg, [(3, 2)])[0][0]
    assert out.tokens == (A, D, E)
    assert out.log_prob == pytest.approx(float(torch.tensor([.6, .3 / .5, 1.0]).log().sum()), abs=1e-5)


def test_model_projection_gathers_candidate_rows_and_bias() -> None:
    from raymt.workers.config import ModelConfig
    from raymt.workers.model.model import MarianModel
    torch.manual_seed(0)
    model = MarianModel(ModelConfig(vocab_size=20, decoder_vocab_size=20, d_model=8, encoder_layers=1,
                                    decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                                    encoder_ffn_dim=16, decoder_ffn_dim=16, pad_token_id=19,
                                    decoder_start_token_id=19))
    model.final_logits_bias.normal_()
    hidden = torch.randn(3, 8)
    candidates = torch.tensor([0, 4, 5, 19])
    assert torch.allclose(model.project(hidden, candidates), model.project(hidden)[:, candidates], atol=1e-6)


def test_language_shortlists_pick_each_batch_s_tables_by_its_rows_languages() -> None:
    fra, eng = 90, 91
    lists = LanguageShortlists({fra: Shortlist(LexicalTable({5: [(10, 1.0)]}, [20, 21]), 1, 1, (2,)),
                                eng: Shortlist(LexicalTable({5: [(11, 1.0)], 6: [(12, 1.0)]}, [30]), 1, 1, (2,))})
    assert lists.candidates([[5], [6]], [fra, fra]).tolist() == [2, 10, 20, fra]
    assert lists.candidates([[5], [6]], [fra, eng]).tolist() == [2, 10, 12, 20, 30, fra, eng]  # (row 1's 6: eng's)
    assert lists.candidates([[5]], [92]) is None and lists.candidates([[5]], None) is None  # (no table: every id)


def nllb_translations(nllb_dir, shortlist, langs):
    from raymt.workers.decoder.core_decoder import CoreDecoder
    from tests.conftest import shared_path
    tr = CoreDecoder.load(str(nllb_dir))
    lines = shared_path("multi30k", "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()[:8]
    targets = [langs[i % 2] for i in range(len(lines))]
    return tr, targets, tr.translate(lines, SearchConfig(beam_size=3), shortlist(tr) if shortlist else None,
                                     source_lang="deu_Latn", target_lang=targets)


def per_language(tables):
    def build(tr):
        tok = tr.checkpoint.tokenizer
        return LanguageShortlists({tok.lang_id(code): Shortlist(LexicalTable({}, ids), 0, len(ids), tr.special_target_ids())
                                   for code, ids in tables(tok).items()})
    return build


def test_whole_vocabulary_per_language_shortlists_decode_as_without(nllb_dir, one_thread) -> None:
    langs = ("fra_Latn", "eng_Latn")
    everything = per_language(lambda tok: {code: list(range(tok.target_vocab_size)) for code in langs})
    _, _, full = nllb_translations(nllb_dir, None, langs)
    _, _, listed = nllb_translations(nllb_dir, everything, langs)
    assert [(t.tokens, t.score) for t in listed] == [(t.tokens, t.score) for t in full]


def test_per_language_shortlists_restrict_each_row_to_its_own_table(nllb_dir, one_thread) -> None:
    """A batch of one target language decodes over its own table; a batch mixing languages over the
    union of its languages' tables."""
    pieces = lambda tok: sorted(tok.kept_pieces)  # noqa: E731
    own = {"fra_Latn": lambda tok: pieces(tok)[0::2], "eng_Latn": lambda tok: pieces(tok)[1::2]}  # (disjoint halves)
    small = per_language(lambda tok: {code: ids(tok) for code, ids in own.items()})
    for langs in (("fra_Latn", "fra_Latn"), ("eng_Latn", "eng_Latn"), ("fra_Latn", "eng_Latn")):
        tr, targets, out = nllb_translations(nllb_dir, small, langs)
        tok = tr.checkpoint.tokenizer
        allowed = set(tr.special_target_ids()) | {tok.lang_id(code) for code in langs}
        allowed |= {i for code in set(langs) for i in own[code](tok)}
        assert all(set(t.tokens) <= allowed for t in out), langs
        assert any(set(t.tokens) - set(tr.special_target_ids()) - {tok.lang_id(c) for c in langs} for t in out), \
            [t.tokens for t in out]  # (pieces, not only specials)
