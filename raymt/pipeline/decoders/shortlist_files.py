"""Shortlist files on storage: Marian ``lex.s2t`` (+ ``<path>.freq``, target pieces by frequency)
or a CTranslate2 vocabulary map (``.vmap``), read into a ``raymt.workers.search.shortlist.Shortlist``.

A many-to-many model (M2M100 / NLLB) may have one table per target language: a directory holding
``<code>.s2t`` (+ ``<code>.s2t.freq``) or ``<code>.vmap`` per language (``deu_Latn.s2t``), read
into a ``raymt.workers.search.shortlist.LanguageShortlists``."""
from __future__ import annotations

import logging

import fsspec

from raymt.pipeline.extras import MissingExtra
from raymt.pipeline.storage import directory_reader, read_text, storage_options, write_text
from raymt.workers.search.shortlist import (
    LanguageShortlists,
    LexicalTable,
    Shortlist,
    read_lex_s2t,
    read_vocab_map,
    write_lex_s2t,
    write_vocab_map,
)
from raymt.workers.text.tokenizer import MarianTokenizer

logger = logging.getLogger(__name__)

VMAP_TOP_M = 100  # a written .vmap keeps this many translations per source piece ...
VMAP_TOP_N = 1000  # ... and this many most frequent target pieces


def load_table(url: str, tok: MarianTokenizer) -> LexicalTable:
    """A ``.vmap``, or a ``lex.s2t`` whose frequent targets are its ``.freq`` file's pieces; without
    one (Marian's own shortlists), the target ids in order, as Marian reads them (its vocabularies are
    sorted by frequency, and its shortlist's ``first`` count takes the first ids), ``<pad>`` aside."""
    text = read_text(url)
    if url.endswith(".vmap"):
        return read_vocab_map(text, tok.source_vocab, tok.target_vocab)
    freq_url = url + ".freq"
    fs, path = fsspec.core.url_to_fs(freq_url, **storage_options(freq_url))
    if fs.exists(path):
        frequent = [tok.target_vocab[p] for p in read_text(freq_url).split("\n") if p in tok.target_vocab]
    else:
        frequent = sorted(i for p, i in tok.target_vocab.items() if p != "<pad>")
    return read_lex_s2t(text, tok.source_vocab, tok.target_vocab, frequent)


def load_shortlist(url: str, tok: MarianTokenizer, *, top_m: int, top_n: int,
                   special_ids: tuple[int, ...]) -> Shortlist | LanguageShortlists:
    """A table file -> ``Shortlist``; a directory of per-language tables (M2M100 / NLLB) -> ``LanguageShortlists``."""
    from raymt.workers.text.lang_tokenizer import LanguageTokenizer
    fs, path = fsspec.core.url_to_fs(url, **storage_options(url)) if isinstance(tok, LanguageTokenizer) else (None, "")
    if fs is None or not fs.isdir(path):  # (a Marian model: always one table file)
        return Shortlist(load_table(url, tok), top_m=top_m, top_n=top_n, special_ids=special_ids)
    tables = language_table_urls(url, fs.ls(path, detail=False), tok)
    if not tables:
        raise FileNotFoundError(f"shortlist directory {url}: no <code>.s2t or <code>.vmap of a language this model knows "
                                f"({tok.listed_codes()})")
    logger.info("per-language shortlists for %d target languages: %s", len(tables), ", ".join(sorted(tables)))
    return LanguageShortlists({tok.lang_id(code): Shortlist(load_table(table, tok), top_m=top_m, top_n=top_n,
                                                            special_ids=special_ids)
                               for code, table in tables.items()})


def language_table_urls(url: str, names: list[str], tok) -> dict[str, str]:
    """A directory's per-language tables: code -> URL (``<code>.s2t`` or ``<code>.vmap``, codes the model knows)."""
    found = {}
    for name in sorted(names):
        base = name.rstrip("/").rsplit("/", 1)[-1]
        code, dot, suffix = base.rpartition(".")
        if dot and suffix in ("s2t", "vmap") and tok.knows(code):
            found[code] = f"{url.rstrip('/')}/{base}"
    return found


def save_language_tables(url: str, tables: dict[str, LexicalTable], tok, *, top_m: int = VMAP_TOP_M,
                         top_n: int = VMAP_TOP_N, suffix: str = "s2t") -> list[str]:
    """One table per target language into directory ``url``: ``<code>.s2t`` (+ ``.freq``) or ``<code>.vmap``."""
    fs, path = fsspec.core.url_to_fs(url, **storage_options(url))
    fs.makedirs(path, exist_ok=True)
    written = []
    for code, table in tables.items():
        written.append(f"{url.rstrip('/')}/{code}.{suffix}")
        save_table(written[-1], table, tok, top_m=top_m, top_n=top_n)
    return written


def save_table(url: str, table: LexicalTable, tok: MarianTokenizer, *, top_m: int = VMAP_TOP_M,
               top_n: int = VMAP_TOP_N) -> None:
    """``.vmap`` -> CTranslate2 map (cut at top_m / top_n); otherwise lex.s2t + ``.freq``."""
    source_pieces = {i: p for p, i in tok.source_vocab.items()}
    target_pieces = {i: p for p, i in tok.target_vocab.items()}
    if url.endswith(".vmap"):
        write_text(url, write_vocab_map(table, source_pieces, target_pieces, top_m=top_m, top_n=top_n))
        return
    write_text(url, write_lex_s2t(table, source_pieces, target_pieces))
    write_text(url + ".freq", "\n".join(target_pieces[t] for t in table.frequent) + "\n")


def model_shortlist(model_url: str) -> str | None:
    """The lexical shortlist a Marian model directory ships (decoder.yml's ``shortlist:`` text file,
    or ``lex.s2t``), as a URL; None for any other model or when it has none."""
    from raymt.workers.checkpoints.marian_npz import DecoderYaml, read_decoder_yaml, shortlist_candidates
    fs, root = fsspec.core.url_to_fs(model_url, **storage_options(model_url))
    root = root.rstrip("/")
    if fs.exists(f"{root}/decoder.yml"):
        settings, _ = read_decoder_yaml(directory_reader(model_url))
    elif fs.exists(f"{root}/model.npz"):
        settings = DecoderYaml("model.npz", ("", ""))
    else:
        return None
    found = [n for n in shortlist_candidates(settings) if fs.exists(f"{root}/{n}")] if settings else []
    return f"{model_url.rstrip('/')}/{found[0]}" if found else None


def shortlist_for(flag: str | None, model_url: str) -> str | None:
    """``--shortlist`` as given (``none``: no shortlist); without it, the Marian model directory's own
    shortlist when it has one (logged)."""
    if flag:
        return None if flag == "none" else flag
    try:
        found = model_shortlist(model_url)
    except (MissingExtra, FileNotFoundError):  # (the model's own check reports these, in one line)
        return None
    if found:
        logger.info("using the model's lexical shortlist %s (pass --shortlist none to decode without it)", found)
    return found
