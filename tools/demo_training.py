"""The demo model's training run: data, sentencepiece, the epoch loop with a wall-clock budget,
checkpoint averaging, fp16 HF export, evaluation and the model card. Math lives in
``tools.training``; ``tools.train_demo`` is the command line.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import random
import time

import sentencepiece as spm
import torch
from safetensors.torch import load_file, save_file

from raymt.workers.checkpoints.checkpoint import save_checkpoint, unique_state
from raymt.workers.config import ModelConfig
from raymt.workers.model.model import MarianModel
from raymt.workers.text.tokenizer import MarianTokenizer
from tools.training import (
    TrainConfig,
    average_states,
    collate,
    inverse_sqrt_lr,
    loss_fn,
    make_batches,
)

logger = logging.getLogger(__name__)


def read_lines(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def train_spm(data_dir: str, work_dir: str, vocab_size: int) -> tuple[bytes, dict[str, int]]:
    """Joint unigram model on train.de + train.en; vocab.json = spm pieces + ``<pad>`` last."""
    prefix = os.path.join(work_dir, "joint")
    if not os.path.exists(prefix + ".model"):
        spm.SentencePieceTrainer.train(
            input=[os.path.join(data_dir, "train.de"), os.path.join(data_dir, "train.en")],
            model_prefix=prefix, vocab_size=vocab_size, model_type="unigram", character_coverage=1.0,
            eos_id=0, unk_id=1, bos_id=-1, pad_id=-1, num_threads=2, minloglevel=2)
    proto = open(prefix + ".model", "rb").read()
    sp = spm.SentencePieceProcessor(model_proto=proto)
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    vocab["<pad>"] = len(vocab)
    return proto, vocab


def encode_pairs(tok: MarianTokenizer, src: list[str], tgt: list[str], max_len: int) -> list[tuple[list[int], list[int]]]:
    pairs = [(tok.encode(s), tok.encode_target(t)) for s, t in zip(src, tgt)]
    return [(s, t) for s, t in pairs if len(s) <= max_len and len(t) <= max_len]


@torch.no_grad()
def validation_nll(model: MarianModel, pairs, cfg: ModelConfig) -> float:
    model.eval()
    total, count = 0.0, 0
    rng = random.Random(0)
    for idx in make_batches(pairs, 4096, rng):
        batch = collate([pairs[i] for i in idx], cfg.pad_token_id, cfg.decoder_start_token_id)
        _, nll = loss_fn(model, batch, 0.0)
        total, count = total + float(nll), count + batch.num_tokens
    model.train()
    return total / count


def read_distilled(path: str, source: str = "source", target: str = "translation") -> tuple[list[str], list[str]]:
    """Source and target texts of the rows a distillation run kept (``keep``; all rows without it)."""
    import pyarrow.parquet as pq
    table = pq.read_table(path, columns=None)
    keep = table.column("keep").to_pylist() if "keep" in table.column_names else [True] * table.num_rows
    pairs = [(s, t) for s, t, k in zip(table.column(source).to_pylist(), table.column(target).to_pylist(), keep)
             if k and s and t]
    return [s for s, _ in pairs], [t for _, t in pairs]


def train(args: argparse.Namespace, model_cfg: ModelConfig, tcfg: TrainConfig, tok: MarianTokenizer) -> None:
    d = args.data_dir
    if getattr(args, "train_parquet", None):  # a student on distilled data: the teacher's translations
        src, tgt = read_distilled(args.train_parquet)
    else:
        src, tgt = read_lines(f"{d}/train.de"), read_lines(f"{d}/train.en")
    train_pairs = encode_pairs(tok, src, tgt, tcfg.max_length)
    val_pairs = encode_pairs(tok, read_lines(f"{d}/val.de"), read_lines(f"{d}/val.en"), 10_000)
    torch.manual_seed(tcfg.seed)
    model = MarianModel(model_cfg)
    with torch.no_grad():  # small init as HF (std 0.02); pad row zero (OPUS-MT convention)
        for name, p in model.named_parameters():
            if p.requires_grad and p.dim() == 2:
                p.normal_(0.0, 0.02)
        model.model.shared.weight[model_cfg.pad_token_id].zero_()
    logger.info("params: %.2fM, train pairs %d", sum(p.numel() for p in unique_state(model).values()) / 1e6, len(train_pairs))
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=tcfg.peak_lr, betas=(0.9, 0.98), eps=1e-9)
    rng, step, start, epoch = random.Random(tcfg.seed), 0, time.time(), 0
    history = []
    if args.resume:  # continue from the last epoch checkpoint (Adam moments restart)
        history = json.load(open(os.path.join(args.work_dir, "history.json")))
        epoch, step = history[-1]["epoch"], history[-1]["step"]
        model.load_state_dict(load_file(os.path.join(args.work_dir, f"epoch{epoch:03d}.safetensors")), strict=False)
        opt_path = os.path.join(args.work_dir, "optimizer.pt")
        if os.path.exists(opt_path):
            opt.load_state_dict(torch.load(opt_path, weights_only=True))
        rng = random.Random(tcfg.seed + epoch)
        logger.info("resumed at epoch %d, step %d", epoch, step)
    model.train()
    while time.time() - start < args.minutes * 60 and not os.path.exists(os.path.join(args.work_dir, "STOP")):
        epoch += 1
        tokens, loss_sum, t0 = 0, 0.0, time.time()
        for idx in make_batches(train_pairs, tcfg.max_tokens, rng):
            batch = collate([train_pairs[i] for i in idx], model_cfg.pad_token_id, model_cfg.decoder_start_token_id)
            step += 1
            for group in opt.param_groups:
                group["lr"] = inverse_sqrt_lr(step, tcfg)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                loss, nll = loss_fn(model, batch, tcfg.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg.clip_norm)
            opt.step()
            tokens, loss_sum = tokens + batch.num_tokens, loss_sum + float(nll)
            if step % 50 == 0:
                logger.info("step %d lr %.2e train_nll %.3f %.0f tok/s", step, inverse_sqrt_lr(step, tcfg),
                            loss_sum / tokens, tokens / (time.time() - t0))
            if time.time() - start > args.minutes * 60:
                break
        val = validation_nll(model, val_pairs, model_cfg)
        history.append({"epoch": epoch, "step": step, "train_nll": loss_sum / tokens, "val_nll": val,
                        "tok_per_s": tokens / (time.time() - t0), "elapsed_min": (time.time() - start) / 60})
        logger.info("%s", history[-1])
        save_file(unique_state(model), os.path.join(args.work_dir, f"epoch{epoch:03d}.safetensors"))
        torch.save(opt.state_dict(), os.path.join(args.work_dir, "optimizer.pt"))
        with open(os.path.join(args.work_dir, "history.json"), "w") as f:
            json.dump(history, f, indent=1)


def finalize(args: argparse.Namespace, model_cfg: ModelConfig, proto: bytes, vocab: dict[str, int], tcfg: TrainConfig) -> None:
    """Average the last N epoch checkpoints and save an fp16 HF Marian directory."""
    names = sorted(n for n in os.listdir(args.work_dir) if n.startswith("epoch") and n.endswith(".safetensors"))
    chosen = names[-tcfg.average_last:]
    logger.info("averaging %s", chosen)
    state = average_states([load_file(os.path.join(args.work_dir, n)) for n in chosen])
    model = MarianModel(model_cfg)
    model.load_state_dict(state, strict=False)
    with torch.no_grad():
        model.model.shared.weight[model_cfg.pad_token_id].zero_()
    files = {"source.spm": proto, "target.spm": proto, "vocab.json": json.dumps(vocab, ensure_ascii=False, indent=1).encode()}
    save_checkpoint(args.out, model, files, dtype=getattr(torch, args.dtype))
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump({"source_lang": "de", "target_lang": "en", "model_max_length": 512, "separate_vocabs": False,
                   "tokenizer_class": "MarianTokenizer"}, f, indent=2)
    with open(os.path.join(args.out, "training.json"), "w") as f:
        json.dump({"averaged": chosen, "train_config": tcfg.__repr__(), "args": vars(args),
                   "history": json.load(open(os.path.join(args.work_dir, "history.json")))}, f, indent=1)


def evaluate(args: argparse.Namespace) -> dict:
    """sacreBLEU of the saved model on Multi30k test sets, beam 5 and greedy."""
    import sacrebleu

    from raymt.workers.config import SearchConfig
    from raymt.workers.decoder.core_decoder import CoreDecoder

    translator = CoreDecoder.load(args.out, threads=args.threads)
    scores = {}
    for name in ("test_2016_flickr", "test_2017_flickr"):
        src = read_lines(f"{args.data_dir}/{name}.de")
        ref = read_lines(f"{args.data_dir}/{name}.en")
        for beam in (5, 1):
            cfg = SearchConfig(beam_size=beam, max_length_a=1.5, max_length_b=10)
            hyps = [t.text for t in translator.translate(src, cfg)]
            bleu = sacrebleu.BLEU()
            result = bleu.corpus_score(hyps, [ref])
            scores[f"{name}/beam{beam}"] = {"bleu": round(result.score, 2), "signature": str(bleu.get_signature()),
                                            "search": cfg.signature()}
            logger.info("%s beam %d: %s", name, beam, result)
    with open(os.path.join(args.out, "eval.json"), "w") as f:
        json.dump(scores, f, indent=1)
    return scores


def write_model_card(args: argparse.Namespace, scores: dict) -> None:
    """models/.../README.md: data, config, command, BLEU with sacreBLEU signatures."""
    info = json.load(open(os.path.join(args.out, "training.json")))
    config = json.load(open(os.path.join(args.out, "config.json")))
    hist = info["history"]
    rows = "\n".join(f"| {k.split('/')[0]} | {k.split('/')[1].removeprefix('beam')} | {v['bleu']:.2f} |"
                     for k, v in scores.items())
    signature = next(iter(scores.values()))["signature"]
    from safetensors.torch import load_file as _load
    params = sum(t.numel() for k, t in _load(os.path.join(args.out, "model.safetensors")).items()
                 if "embed_positions" not in k and "final_logits_bias" not in k)
    card = f"""# demo-de-en: a small Marian transformer, German -> English (Multi30k)

Trained from scratch with this project's own model code (`tools/train_demo.py`) on the Multi30k
task-1 training set (29,000 caption pairs; Elliott et al., 2016), validation on Multi30k val.
Saved in HF Marian / OPUS-MT format (fp16 safetensors); loads in HF transformers and CTranslate2.

## Scores (sacreBLEU)

| test set | beam | BLEU |
|---|---|---|
{rows}

Signature: `{signature}`; search: length penalty 1.0, max length 1.5 * source + 10.

## Model

{params / 1e6:.2f}M parameters (tied embeddings): d_model {config['d_model']}, {config['encoder_layers']} encoder +
{config['decoder_layers']} decoder layers, {config['encoder_attention_heads']} heads, FFN {config['encoder_ffn_dim']},
{config['activation_function']}, sinusoidal positions, joint sentencepiece unigram vocabulary of
{config['vocab_size']} entries (`<pad>` last, zero embedding row, decoder start).

## Training

Label smoothing 0.1, Adam (0.9, 0.98), inverse-sqrt schedule (peak {args.peak_lr}, warm-up
{args.warmup_steps} steps), batches of about {args.max_tokens} tokens, dropout {args.dropout},
bf16 autocast, 2 CPU threads; {hist[-1]['epoch']} epochs / {hist[-1]['step']} steps; the average
of the last {len(info['averaged'])} epoch checkpoints. Per-epoch history: `training.json`.

    python -m tools.train_demo --data-dir ../shared/data/multi30k --out {args.out}

The exact arguments of this model's run (and of any `--resume` continuation) are in
`training.json`; the scores above come from `eval.json`, written by the same command.
"""
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write(card)
