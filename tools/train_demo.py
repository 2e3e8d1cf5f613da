"""Train the shipped demo de->en model on Multi30k with our own model code.

    python -m tools.train_demo --data-dir ../shared/data/multi30k --out models/demo-de-en --minutes 75

Joint sentencepiece (unigram, 8k), a small Marian transformer, label smoothing, Adam with
inverse-sqrt warm-up, a wall-clock budget, per-epoch checkpoints and averaging of the last N.
Saved in HF Marian format with the OPUS-MT vocabulary convention (``<pad>`` is the last id of
vocab.json, its embedding row is zero, decoding starts from it), so HF transformers and
CTranslate2's converter load it too. ``--finalize-only`` re-runs averaging + saving from the
work dir. ``touch WORK_DIR/STOP`` ends training after the current epoch.
"""
from __future__ import annotations

import argparse
import logging
import os

import torch

from tools.demo_training import (
    evaluate,
    finalize,
    train,
    train_spm,
    write_model_card,
)
from raymt.workers.config import ModelConfig
from raymt.workers.text.tokenizer import MarianTokenizer
from tools.training import TrainConfig


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default="../shared/data/multi30k")
    p.add_argument("--out", default="models/demo-de-en")
    p.add_argument("--work-dir", default="/tmp/demo-de-en-train")
    p.add_argument("--minutes", type=float, default=75.0)
    p.add_argument("--train-parquet", help="train on distilled data instead (jobs/distill.py's <output>/distilled: "
                                           "source -> translation of the rows with keep)")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--encoder-layers", type=int, default=4)
    p.add_argument("--decoder-layers", type=int, default=3)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn-dim", type=int, default=1024)
    p.add_argument("--dropout", type=float, default=0.2)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--peak-lr", type=float, default=1.5e-3)
    p.add_argument("--warmup-steps", type=int, default=800)
    p.add_argument("--average-last", type=int, default=5)
    p.add_argument("--dtype", default="float16", choices=["float16", "float32"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True,
                   help="bf16 autocast for training matmuls (fp32 master weights)")
    p.add_argument("--resume", action="store_true", help="continue from the work dir's last epoch")
    p.add_argument("--evaluate", action=argparse.BooleanOptionalAction, default=True,
                   help="score the saved model on Multi30k test2016/test2017 (writes eval.json)")
    p.add_argument("--finalize-only", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)
    os.makedirs(args.work_dir, exist_ok=True)
    proto, vocab = train_spm(args.data_dir, args.work_dir, args.vocab_size)
    pad = len(vocab) - 1
    model_cfg = ModelConfig(vocab_size=len(vocab), decoder_vocab_size=len(vocab), d_model=args.d_model,
                            encoder_layers=args.encoder_layers, decoder_layers=args.decoder_layers,
                            encoder_attention_heads=args.heads, decoder_attention_heads=args.heads,
                            encoder_ffn_dim=args.ffn_dim, decoder_ffn_dim=args.ffn_dim, activation_function="swish",
                            max_position_embeddings=512, pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad,
                            dropout=args.dropout)
    tcfg = TrainConfig(max_tokens=args.max_tokens, peak_lr=args.peak_lr, warmup_steps=args.warmup_steps,
                       average_last=args.average_last)
    if not args.finalize_only:
        tok = MarianTokenizer(proto, proto, vocab)
        train(args, model_cfg, tcfg, tok)
    finalize(args, model_cfg, proto, vocab, tcfg)
    print(f"saved {args.out}")
    if args.evaluate:
        scores = evaluate(args)
        write_model_card(args, scores)
        for key, value in scores.items():
            print(f"{key}: BLEU {value['bleu']} ({value['signature']}; {value['search']})")


if __name__ == "__main__":
    main()
