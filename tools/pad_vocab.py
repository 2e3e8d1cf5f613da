"""Pad a trained HF Marian checkpoint's target vocabulary to N words that can never be chosen.

    python -m tools.pad_vocab --model ../shared/models/base-de-en --out /tmp/base-de-en-58k     # 58,101 words
    python -m tools.pad_vocab --model models/demo-de-en --out /tmp/demo-12k --vocab 12000 --no-check

Speed depends on the output layer's size: a step's (rows, D) x (D, V) product and its log-softmax grow
with V. OPUS-MT's opus-mt-de-en has 58,101 words; the trained models here have 8,001. The padded copy
decodes at the realistic output-layer size with trained weights and a real EOS, and translates exactly
as the original does: each new word's ``final_logits_bias`` is -1e4, so its log-probability is ~-1e4
below any real word's and no search ever keeps it (its share of the softmax sum, exp(-1e4), is 0 in
float32 and float16).

What changes (``Padding``):
  - every vocabulary-sized table the file holds (``model.shared.weight``, ``model.encoder.embed_tokens.weight``,
    ``model.decoder.embed_tokens.weight``, ``lm_head.weight``: tied copies get the same new rows) gains
    N - V rows, normal with the config's ``init_std`` (0.02 if unset) from ``--seed``;
    ``final_logits_bias`` (1, V) gains N - V columns at -1e4 (written as zeros first where the file has none);
  - the new rows go before a last ``<pad>``, which stays last (as OPUS-MT orders its vocabulary, and as
    CTranslate2's converter expects: it drops the last row as ``<pad>``), so ``pad_token_id`` and
    ``decoder_start_token_id`` (and ``bad_words_ids``) move from V - 1 to N - 1; EOS, UNK and every
    other id keep theirs. A ``<pad>`` that is not last stays where it is, the new rows appended;
  - ``config.json``'s ``vocab_size`` (and ``decoder_vocab_size``) become N; ``vocab.json`` maps N - V new
    pieces (``<pad_vocab_00001>``, ...) to the new ids. The sentencepiece models are copied unchanged:
    they never produce those pieces, so no source sentence encodes differently.

Shared vocabularies only (the source and target use one ``vocab.json``, as OPUS-MT de-en does). Weights
are read from ``model.safetensors`` or ``pytorch_model.bin`` and written as ``model.safetensors``, in
their stored dtype. ``check`` (run unless ``--no-check``) loads the copy with ours and with HF
transformers and compares both systems' translations with the original's.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
from dataclasses import dataclass

import torch
from safetensors.torch import save_file

from raymt.workers.checkpoints.checkpoint import config_from_hf, local_reader, read_weights

DEFAULT_WORDS = 58101  # Helsinki-NLP/opus-mt-de-en's vocabulary
UNREACHABLE = -1e4  # a new word's logit bias: never among a search's candidates
TABLE_KEYS = ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
              "lm_head.weight")
BIAS_KEY = "final_logits_bias"
COPIED_FILES = ("source.spm", "target.spm", "tokenizer_config.json", "special_tokens_map.json")
ID_KEYS = ("pad_token_id", "decoder_start_token_id", "bos_token_id", "eos_token_id", "forced_eos_token_id",
           "forced_bos_token_id")
ID_LIST_KEYS = ("bad_words_ids", "suppress_tokens", "begin_suppress_tokens")
CHECK_LINES = ("Ein Mann fährt mit dem Fahrrad eine Straße entlang.", "Zwei Kinder spielen im Sand am Strand.",
               "Eine Frau in einem roten Kleid sitzt auf einer Bank.", "Das Wetter ist heute sehr schön.",
               "Wir haben gestern lange über die Zukunft der Stadt gesprochen.")


@dataclass(frozen=True, slots=True)
class Padding:
    """Where ``size - words`` new ids go in a vocabulary of ``words`` ids whose ``<pad>`` is ``pad_id``:
    before a last ``<pad>`` (which moves to ``size - 1``), else after every old id."""

    words: int
    size: int
    pad_id: int

    def __post_init__(self) -> None:
        if self.size <= self.words:
            raise ValueError(f"padding to {self.size} words: the vocabulary already has {self.words}")
        if not 0 <= self.pad_id < self.words:
            raise ValueError(f"<pad> id {self.pad_id} outside the vocabulary (0..{self.words - 1})")

    @property
    def pad_moves(self) -> bool:
        return self.pad_id == self.words - 1

    @property
    def new_ids(self) -> range:
        first = self.words - 1 if self.pad_moves else self.words
        return range(first, first + self.size - self.words)

    def new_id(self, old: int) -> int:
        """An old id's id in the padded vocabulary."""
        return old + len(self.new_ids) if old >= self.new_ids.start else old

    def insert(self, table: torch.Tensor, new: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """``table`` (V along ``dim``) with ``new`` (N - V along ``dim``) at the new ids -> N along ``dim``."""
        at = self.new_ids.start
        return torch.cat([table.narrow(dim, 0, at), new.to(table.dtype), table.narrow(dim, at, self.words - at)], dim)


def padding_problems(hf: dict, vocab: dict[str, int], words: int, size: int) -> list[str]:
    """Every reason a checkpoint (its ``config.json``, ``vocab.json`` and table size) cannot be padded."""
    reasons = []
    if not hf.get("share_encoder_decoder_embeddings", True) or hf.get("separate_vocabs"):
        reasons.append("separate source and target vocabularies (only one shared vocab.json is padded)")
    if size <= words:
        reasons.append(f"padding to {size} words: the vocabulary already has {words}")
    outside = sorted(p for p, i in vocab.items() if not 0 <= i < words)
    if outside:
        reasons.append(f"vocab.json maps {len(outside)} pieces outside 0..{words - 1} (e.g. {outside[0]!r})")
    if vocab.get("<pad>") != hf.get("pad_token_id", words - 1):
        reasons.append(f"vocab.json's <pad> id {vocab.get('<pad>')} is not pad_token_id {hf.get('pad_token_id')}")
    return reasons


def new_pieces(vocab: dict[str, int], count: int) -> list[str]:
    """``count`` pieces no vocabulary entry or sentencepiece output spells: ``<pad_vocab_00001>``, ..."""
    width = max(5, len(str(count)))
    pieces = [f"<pad_vocab_{i:0{width}d}>" for i in range(1, count + 1)]
    taken = [p for p in pieces if p in vocab]
    if taken:
        raise ValueError(f"vocab.json already has pieces named like the new ones: {taken[:3]}")
    return pieces


def remap_ids(settings: dict, padding: Padding) -> dict:
    """``config.json`` / ``generation_config.json`` with every token id it names at its padded id."""
    out = dict(settings)
    for key in ID_KEYS:
        if isinstance(out.get(key), int):
            out[key] = padding.new_id(out[key])
    for key in ID_LIST_KEYS:
        if isinstance(out.get(key), list):
            out[key] = [[padding.new_id(i) for i in x] if isinstance(x, list) else padding.new_id(x)
                        for x in out[key]]
    return out


def padded_weights(weights: dict[str, torch.Tensor], padding: Padding, std: float,
                   seed: int) -> dict[str, torch.Tensor]:
    """The file's tensors with every vocabulary table (V, D) -> (N, D) (tied copies alike) and the
    logit bias (1, V) -> (1, N), its new columns at ``UNREACHABLE``."""
    tables = [k for k in TABLE_KEYS if k in weights]
    if not tables:
        raise ValueError(f"no vocabulary table among the weights (looked for {list(TABLE_KEYS)})")
    d_model = weights[tables[0]].shape[1]
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randn(len(padding.new_ids), d_model, generator=generator) * std  # (N - V, D)
    out = {k: v.contiguous() for k, v in weights.items()}  # (a .bin's tied tensors share storage)
    for key in tables:
        out[key] = padding.insert(weights[key], rows)
    bias = weights.get(BIAS_KEY, torch.zeros(1, padding.words, dtype=weights[tables[0]].dtype))
    out[BIAS_KEY] = padding.insert(bias, torch.full((1, len(padding.new_ids)), UNREACHABLE), dim=1)
    return out


def pad(model_dir: str, out_dir: str, size: int = DEFAULT_WORDS, seed: int = 0) -> str:
    """Write ``model_dir`` padded to ``size`` words into ``out_dir`` -> ``out_dir``."""
    if os.path.abspath(model_dir) == os.path.abspath(out_dir):
        raise ValueError("--out must differ from --model")
    read = local_reader(model_dir)
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        hf = json.load(f)
    cfg = config_from_hf(hf)  # (refuses what our loader refuses, every reason at once)
    with open(os.path.join(model_dir, "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    reasons = padding_problems(hf, vocab, cfg.vocab_size, size)
    if reasons:
        raise ValueError("cannot pad the vocabulary:\n  - " + "\n  - ".join(reasons))
    padding = Padding(cfg.vocab_size, size, cfg.pad_token_id)
    weights = padded_weights(read_weights(read), padding, float(hf.get("init_std", 0.02)), seed)
    os.makedirs(out_dir, exist_ok=True)
    save_file(weights, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    hf = remap_ids(hf, padding)
    hf.update(vocab_size=size, **({"decoder_vocab_size": size} if hf.get("decoder_vocab_size") else {}))
    write_json(os.path.join(out_dir, "config.json"), hf)
    padded_vocab = {piece: padding.new_id(i) for piece, i in vocab.items()}
    padded_vocab.update(zip(new_pieces(vocab, len(padding.new_ids)), padding.new_ids))
    write_json(os.path.join(out_dir, "vocab.json"), dict(sorted(padded_vocab.items(), key=lambda item: item[1])))
    generation = os.path.join(model_dir, "generation_config.json")
    if os.path.exists(generation):
        with open(generation, encoding="utf-8") as f:
            write_json(os.path.join(out_dir, "generation_config.json"), remap_ids(json.load(f), padding))
    for name in COPIED_FILES:
        if os.path.exists(os.path.join(model_dir, name)):
            shutil.copyfile(os.path.join(model_dir, name), os.path.join(out_dir, name))
    return out_dir


def write_json(path: str, data: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=2)


@dataclass(frozen=True, slots=True)
class PadCheck:
    """The padded copy against its original on the same lines: lines translated identically by ours
    (per beam size, with the largest score difference) and by HF ``generate`` (beam ``hf_beam``)."""

    lines: int
    ours_equal: dict[int, int]
    max_score_difference: float
    hf_beam: int
    hf_equal: int

    @property
    def passed(self) -> bool:
        return (all(n == self.lines for n in self.ours_equal.values()) and self.hf_equal == self.lines
                and self.max_score_difference < 1e-4)

    def summary(self) -> str:
        ours = ", ".join(f"beam {k} {n}/{self.lines}" for k, n in self.ours_equal.items())
        return (f"identical translations: ours {ours} (largest score difference {self.max_score_difference:.2e}); "
                f"HF generate beam {self.hf_beam} {self.hf_equal}/{self.lines}")


def ours_translations(model_dir: str, lines: list[str], beam_size: int) -> list[tuple[str, float]]:
    """Our ``Translator``'s best (translation, score) per line."""
    from raymt import Translator

    with Translator.load(model_dir, threads=1) as translator:
        return [n[0] for n in translator.translate(lines, nbest=1, beam_size=beam_size)]


def hf_translations(model_dir: str, lines: list[str], beam_size: int, max_new_tokens: int = 256) -> list[str]:
    """HF ``MarianMTModel.generate`` (float32) as ``benchmarks.peers.hf_system`` runs it: ``<pad>`` never
    generated, ``max_new_tokens`` (not HF's default length of 20) whatever the directory sets."""
    import transformers

    tok = transformers.MarianTokenizer.from_pretrained(model_dir)
    model = transformers.MarianMTModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        seqs = model.generate(**tok(lines, return_tensors="pt", padding=True), num_beams=beam_size, do_sample=False,
                              max_new_tokens=max_new_tokens, bad_words_ids=[[model.config.pad_token_id]])
    return tok.batch_decode(seqs, skip_special_tokens=True)


def check(model_dir: str, padded_dir: str, lines: list[str], beam_sizes: tuple[int, ...] = (1, 4)) -> PadCheck:
    """Translate ``lines`` with the original and the padded copy, with ours and HF generate."""
    equal, difference = {}, 0.0
    for beam in beam_sizes:
        before, after = ours_translations(model_dir, lines, beam), ours_translations(padded_dir, lines, beam)
        equal[beam] = sum(a[0] == b[0] for a, b in zip(before, after))
        difference = max(difference, *(abs(a[1] - b[1]) for a, b in zip(before, after)))
    hf_beam = max(beam_sizes)
    hf_equal = sum(a == b for a, b in zip(hf_translations(model_dir, lines, hf_beam),
                                          hf_translations(padded_dir, lines, hf_beam)))
    return PadCheck(len(lines), equal, difference, hf_beam, hf_equal)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="an HF Marian directory (shared vocabulary)")
    p.add_argument("--out", required=True, help="the padded copy's directory")
    p.add_argument("--vocab", type=int, default=DEFAULT_WORDS, help="words after padding (default: opus-mt-de-en's)")
    p.add_argument("--seed", type=int, default=0, help="the new rows' random seed")
    p.add_argument("--check-lines", help="a text file whose lines the check translates (default: five built in)")
    p.add_argument("--no-check", action="store_true", help="skip loading and translating the copy with ours and HF")
    args = p.parse_args(argv)
    pad(args.model, args.out, args.vocab, args.seed)
    print(f"wrote {args.out}: {args.model} padded to {args.vocab} words")
    if not args.no_check:
        lines = list(CHECK_LINES)
        if args.check_lines:
            with open(args.check_lines, encoding="utf-8") as f:
                lines = [line.rstrip("\n") for line in f if line.strip()]
        result = check(args.model, args.out, lines)
        print(result.summary())
        if not result.passed:
            raise SystemExit("the padded copy translates differently from the original")


if __name__ == "__main__":
    main()
