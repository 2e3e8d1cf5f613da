"""NLLB-200 at its real shapes: ours vs CTranslate2 vs HF generate, beam 4, the same inputs and threads.

    python -m benchmarks.bench_nllb                              # NLLB-200-distilled-600M's shapes
    python -m benchmarks.bench_nllb --layers 1 --lines 4         # a start-up check, seconds

The model is random-weight (seeded) at NLLB-200-distilled-600M's shapes: d_model 1024, 12 + 12 layers,
16 heads, ffn 4096, vocabulary 256,206, built once as an HF directory in ``--work-dir``: an NLLB
tokenizer (a SentencePiece model trained on Multi30k, language codes, ``<mask>``), ``config.json``
(``model_type: m2m_100``), ``model.safetensors``, ``generation_config.json``. CTranslate2 converts that
directory (``ctranslate2.converters.TransformersConverter``, once per compute type) and runs in a
process of its own (``benchmarks/ct2_process.py``: its OpenMP and torch's slow each other in one
process). Systems, interleaved as ``benchmarks/peers.py`` runs them (warm-up excluded):

    ours float32, ours float32 + shortlist, ours int8, CTranslate2 float32 / int8, HF generate float32

The shortlist is a per-target-language one, as ``raymt build-shortlist --target-lang`` writes and
``--shortlist <directory>`` reads (``<work-dir>/shortlists/fra_Latn.s2t`` + ``.freq``): a frequency
list of the target language (Multi30k's French, ``--shortlist-n`` most frequent pieces, the language
code and the special tokens): random weights have no lexical table to learn from. Random weights give degenerate outputs (mostly ids past the small SentencePiece model's,
which have no text, and near-uniform distributions that end at once), so EOS is made improbable
(the decoder's final LayerNorm bias lowers its logit by ``EOS_PENALTY``) and every system decodes
every sentence to ``--max-length`` generated tokens: the same steps for all. Each system returns its
generated tokens (the language code and EOS left out) as space-separated ids or pieces, not text:
throughput is those tokens per second, and its ratios to ours are the result; BLEU means nothing here. Not run by the tests except at a tiny shape (tests/benchmarks).
"""
from __future__ import annotations

import argparse
import io
import json
import logging
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.peers import Ct2Translator, PeerRun, in_length_order, rows, run, work_dir
from raymt.workers.config import SearchConfig
from raymt.pipeline.decoders.alignment import frequency_table
from raymt.pipeline.decoders.shortlist_files import load_shortlist, save_language_tables
from raymt.workers.search.shortlist import LanguageShortlists, Shortlist
from raymt.workers.kernels.speedups import EXACT
from raymt.workers.decoder.core_decoder import CoreDecoder

logger = logging.getLogger(__name__)
DATA = Path(os.environ.get("RAYMT_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
SOURCE, TARGET = "deu_Latn", "fra_Latn"
EOS_PENALTY = 30.0


def build_model(directory: Path, *, d_model: int, layers: int, heads: int, ffn: int, vocab: int, seed: int = 0) -> Path:
    """An NLLB-style HF directory with random weights at the given shapes (kept: built once per shape)."""
    if (directory / "model.safetensors").exists():
        return directory
    import sentencepiece as spm
    import transformers
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    directory.mkdir(parents=True, exist_ok=True)
    lines = [line for lang in ("de", "en", "fr")
             for line in (DATA / "multi30k" / f"train.{lang}").read_text(encoding="utf-8").splitlines()[:5000]]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, vocab_size=4000,
                                   model_type="bpe", character_coverage=1.0, minloglevel=2)
    (directory / "sentencepiece.bpe.model").write_bytes(model.getvalue())
    tok = transformers.NllbTokenizer.from_pretrained(str(directory), extra_special_tokens=list(FAIRSEQ_LANGUAGE_CODES))
    tok.save_pretrained(str(directory))
    torch.manual_seed(seed)
    cfg = transformers.M2M100Config(vocab_size=max(vocab, len(tok)), d_model=d_model, encoder_layers=layers,
                                    decoder_layers=layers, encoder_attention_heads=heads, decoder_attention_heads=heads,
                                    encoder_ffn_dim=ffn, decoder_ffn_dim=ffn, max_position_embeddings=1024,
                                    scale_embedding=True, dropout=0.1, attention_dropout=0.1, tokenizer_class="NllbTokenizer")
    model = transformers.M2M100ForConditionalGeneration(cfg)
    with torch.no_grad():  # EOS's logit lowered by EOS_PENALTY: every system decodes to the cap
        eos = model.model.shared.weight[cfg.eos_token_id]
        model.model.decoder.layer_norm.bias.copy_(-EOS_PENALTY * eos / eos.dot(eos))
    model.save_pretrained(str(directory))
    (directory / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 0, "decoder_start_token_id": 2, "eos_token_id": 2, "max_length": 200, "pad_token_id": 1}))
    return directory


class Ct2Nllb(Ct2Translator):
    """CTranslate2 as a system on an NLLB model: ``[src_lang] pieces </s>`` in, the target language as
    every example's target prefix (CTranslate2's way of forcing it), the pieces decoded by our tokenizer."""

    def __init__(self, path: str, compute_type: str, threads: int, cfg: SearchConfig, translator: CoreDecoder) -> None:
        super().__init__(path, compute_type, threads, cfg, translator, max_batch_size=32)

    def __call__(self, lines: list[str]) -> list[str]:
        self.load()
        pieces = [[SOURCE] + self.tok.source_pieces(line) + ["</s>"] for line in lines]
        results = self._ct2.translate_batch(pieces, target_prefix=[[TARGET]] * len(lines), beam_size=self.cfg.beam_size,
                                            length_penalty=self.cfg.length_penalty, max_batch_size=32,
                                            max_decoding_length=self.cfg.max_decoding_length)
        return [" ".join(p for p in hyp[1:] if p != "</s>") for hyp in results]  # (hyp[0]: the target prefix)


def ct2_system(model_dir: Path, compute_type: str, threads: int, cfg: SearchConfig, translator: CoreDecoder,
               work: Path) -> Ct2Nllb:
    out = work / f"ct2-{compute_type}"
    if not (out / "model.bin").exists():
        subprocess.run([sys.executable, "-c", "import sys, ctranslate2.converters as c; "
                        "c.TransformersConverter(sys.argv[1]).convert(sys.argv[2], quantization=sys.argv[3], force=True)",
                        str(model_dir), str(out), compute_type], check=True, capture_output=True)
    return Ct2Nllb(str(out), compute_type, threads, cfg, translator)


def hf_system(model_dir: Path, cfg: SearchConfig, translator: CoreDecoder, batch_size: int = 32):
    """HF ``generate`` (``forced_bos_token_id``: the target language), inputs sorted by length."""
    import transformers

    tok = transformers.NllbTokenizer.from_pretrained(str(model_dir), src_lang=SOURCE)
    model = transformers.M2M100ForConditionalGeneration.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    forced = translator.checkpoint.tokenizer.lang_id(TARGET)

    def translate_batch(batch_lines: list[str]) -> list[str]:
        batch = tok(batch_lines, return_tensors="pt", padding=True)
        with torch.inference_mode():
            seqs = model.generate(**batch, num_beams=cfg.beam_size, length_penalty=cfg.length_penalty,
                                  max_new_tokens=cfg.max_decoding_length, do_sample=False,
                                  forced_bos_token_id=forced, bad_words_ids=[[model.config.pad_token_id]])
        return [generated(ids[1:]) for ids in seqs.tolist()]  # (ids[0]: the start token)

    def translate(lines: list[str]) -> list[str]:
        return in_length_order(lines, batch_size, translate_batch)
    return translate


def generated(ids: list[int], eos: int = 2, pad: int = 1) -> str:
    """A hypothesis's generated ids after its first (the forced language code), EOS and padding left
    out, space-separated."""
    return " ".join(str(i) for i in ids[1:] if i not in (eos, pad))


def frequency_shortlist(translator: CoreDecoder, top_n: int, work: Path) -> LanguageShortlists:
    """The per-target-language shortlist path: the target language's pieces by frequency (Multi30k
    French) saved as ``<work>/shortlists/<TARGET>.s2t``, read back as the job's ``--shortlist`` reads a
    directory; its ``top_n`` most frequent pieces (+ the language code, the specials) are every batch's candidates."""
    tok = translator.checkpoint.tokenizer
    lines = (DATA / "multi30k" / "train.fr").read_text(encoding="utf-8").splitlines()[:20000]
    directory = str(work / "shortlists")
    save_language_tables(directory, {TARGET: frequency_table(tok, lines)}, tok)
    return load_shortlist(directory, tok, top_m=0, top_n=top_n, special_ids=translator.special_target_ids())


def systems(args: argparse.Namespace, model_dir: Path, work: Path, cfg: SearchConfig) -> list[PeerRun]:
    fp32 = CoreDecoder.load(str(model_dir), threads=args.threads, speedups=EXACT)
    int8 = CoreDecoder.load(str(model_dir), threads=args.threads, speedups=replace(EXACT, int8=True))

    def ours_langs(translator: CoreDecoder, shortlist: Shortlist | LanguageShortlists | None = None):
        return lambda lines: [generated(list(t.tokens)) for t in translator.translate(
            lines, cfg, shortlist, source_lang=SOURCE, target_lang=TARGET)]
    out = [PeerRun("ours float32", ours_langs(fp32)),
           PeerRun(f"ours float32 + shortlist (n={args.shortlist_n})", ours_langs(fp32, frequency_shortlist(fp32, args.shortlist_n, work))),
           PeerRun("ours int8", ours_langs(int8))]
    if not args.no_ct2:
        out += [PeerRun(f"CTranslate2 {ct}", ct2_system(model_dir, ct, args.threads, cfg, fp32, work))
                for ct in ("float32", "int8")]
    if not args.no_hf:
        out.append(PeerRun("HF generate float32", hf_system(model_dir, cfg, fp32)))
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=12, help="encoder and decoder layers each")
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--ffn", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=256_206)
    p.add_argument("--lines", type=int, default=200, help="Multi30k test2016 German lines translated")
    p.add_argument("--beam-size", type=int, default=4)
    p.add_argument("--max-length", type=int, default=64, help="generated tokens at most (language code and EOS included)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--shortlist-n", type=int, default=2000)
    p.add_argument("--work-dir", help="where the model and its conversions are kept (default: a cached temp dir)")
    p.add_argument("--no-ct2", action="store_true")
    p.add_argument("--no-hf", action="store_true")
    p.add_argument("--out", default="", help="also write <out>.md and <out>.json (machine named)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(args.threads)
    shape = f"nllb-d{args.d_model}-l{args.layers}-h{args.heads}-f{args.ffn}-v{args.vocab}"
    work = Path(args.work_dir or work_dir()) / shape
    model_dir = build_model(work / "hf", d_model=args.d_model, layers=args.layers, heads=args.heads, ffn=args.ffn,
                            vocab=args.vocab)
    cfg = SearchConfig(beam_size=args.beam_size, max_decoding_length=args.max_length, max_length_a=0.0,
                       max_length_b=args.max_length)
    lines = (DATA / "multi30k" / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()[:args.lines]
    references = (DATA / "multi30k" / "test_2016_flickr.fr").read_text(encoding="utf-8").splitlines()[:args.lines]
    peers = systems(args, model_dir, work, cfg)
    run(peers, lines, args.repeats, warmup_lines=min(16, len(lines)))
    table = rows(peers, references, lambda tokens: len(tokens.split()))  # (BLEU of ids against text: meaningless)
    base = table[0]["tokens_per_s"] or 1.0
    print(f"{shape}, beam {args.beam_size}, cap {args.max_length}, {args.threads} threads, {len(lines)} lines "
          f"(random weights: BLEU meaningless)")
    for row in table:
        row["vs_ours_float32"] = round(row["tokens_per_s"] / base, 2)
        print(f"  {row['system']:<40} {row['tokens_per_s']:>9.1f} tok/s ({row['spread']})  x{row['vs_ours_float32']}"
              f"  {row['target_tokens']} tokens")
    if args.out:
        from benchmarks.reports import write_report
        from raymt.pipeline.reports.stats_tables import markdown_table
        by = {r["system"].split(" (")[0]: r["tokens_per_s"] for r in table}
        pairs = [("ours float32", "CTranslate2 float32"), ("ours int8", "CTranslate2 int8"),
                 ("ours float32 + shortlist", "ours float32"), ("ours float32", "HF generate float32")]
        ratios = {f"{a} / {b}": round(by[a] / by[b], 3) for a, b in pairs if a in by and b in by}
        write_report(args.out, {"shape": shape, "beam": args.beam_size, "max_length": args.max_length,
                                "threads": args.threads, "lines": len(lines), "runs": table, "ratios": ratios},
                     [f"# NLLB-200-distilled-600M's shapes, random weights: {shape}\n",
                      f"beam {args.beam_size}, every sentence decoded to {args.max_length} generated tokens, "
                      f"{args.threads} threads, {len(lines)} Multi30k lines, {args.repeats} interleaved repeats; "
                      "tokens/s of generated tokens (BLEU meaningless with random weights).\n",
                      markdown_table(table), "", "Ratios: " + ", ".join(f"{k} = {v}" for k, v in ratios.items()), ""])
    return table


if __name__ == "__main__":
    main()
