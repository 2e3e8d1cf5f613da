"""Random-weight Marian checkpoints at the shapes users download, for speed tables.

    python -m benchmarks.shapes opus-mt-de-en /tmp/shape-de-en     # d 512, 6+6, 8 heads, FFN 2048, 58,101 words
    python -m benchmarks.shapes tc-big /tmp/shape-tc-big            # d 1024, 6+6, 16 heads, FFN 4096, 57,000 words

A shape's checkpoint is an HF Marian directory (``config.json``, ``model.safetensors``, tokenizer
files) that ours, CTranslate2's converter and HF ``generate`` all load. Its tokenizer is the trained
base model's (``../shared/models/base-de-en``: real sentencepiece models, 8,000 pieces), its
vocabulary padded with unused pieces to the shape's size and ``<pad>`` last, as OPUS-MT orders it
(CTranslate2's converter drops a last ``<pad>``). Weights are drawn as HF initialises Marian
(normal, std 0.02), so the output layer costs what it costs in a trained model: the speed of a step
does not depend on the values of its weights.

``final_logits_bias`` makes EOS unreachable (-1e4) and the config has no forced EOS, so every
system decodes every sentence to the length cap: all of them do the same number of steps, and the
generated tokens are counted and compared across systems. Quality is measured on the trained
base model, not here.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
from dataclasses import dataclass

import torch

TOKENIZER_FILES = ("source.spm", "target.spm", "tokenizer_config.json")
UNREACHABLE = -1e4  # EOS's logit bias: never among a beam's candidates


@dataclass(frozen=True)
class Shape:
    d_model: int
    heads: int
    ffn: int
    vocab: int
    activation: str
    encoder_layers: int = 6
    decoder_layers: int = 6


SHAPES = {
    "opus-mt-de-en": Shape(512, 8, 2048, 58101, "swish"),  # Helsinki-NLP/opus-mt-de-en's config
    "tc-big": Shape(1024, 16, 4096, 57000, "relu"),  # the opus-mt-tc-big family (53k-65k words)
    "base-8k": Shape(512, 8, 2048, 8001, "swish"),  # the earlier tables' vocabulary
    "tiny": Shape(64, 2, 128, 9001, "swish", 2, 2),  # the benchmarks' smoke tests
}


def default_tokenizer() -> str:
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "models",
                        "base-de-en")


def build(shape: Shape, out_dir: str, tokenizer_dir: str | None = None, seed: int = 0) -> str:
    """Write the checkpoint (once: an existing ``config.json`` is reused) -> ``out_dir``."""
    import transformers

    if os.path.exists(os.path.join(out_dir, "model.safetensors")):
        return out_dir
    tokenizer_dir = tokenizer_dir or default_tokenizer()
    with open(os.path.join(tokenizer_dir, "vocab.json"), encoding="utf-8") as f:
        real = json.load(f)
    pad = "<pad>"
    pieces = [p for p, _ in sorted(real.items(), key=lambda item: item[1]) if p != pad]
    if len(pieces) >= shape.vocab:
        raise ValueError(f"{tokenizer_dir} has {len(pieces)} pieces: more than the shape's {shape.vocab} words")
    pieces += [f"▁unused{i}" for i in range(shape.vocab - 1 - len(pieces))] + [pad]
    vocab = {p: i for i, p in enumerate(pieces)}
    pad_id, eos_id = vocab[pad], vocab["</s>"]
    cfg = transformers.MarianConfig(
        vocab_size=shape.vocab, decoder_vocab_size=shape.vocab, d_model=shape.d_model,
        encoder_layers=shape.encoder_layers, decoder_layers=shape.decoder_layers, encoder_attention_heads=shape.heads,
        decoder_attention_heads=shape.heads, encoder_ffn_dim=shape.ffn, decoder_ffn_dim=shape.ffn,
        activation_function=shape.activation, pad_token_id=pad_id, eos_token_id=eos_id,
        decoder_start_token_id=pad_id, forced_eos_token_id=None, max_position_embeddings=512,
        scale_embedding=True, share_encoder_decoder_embeddings=True, tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(cfg).eval()
    with torch.no_grad():
        model.final_logits_bias[0, eos_id] = UNREACHABLE
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    model.generation_config.forced_eos_token_id = None
    model.generation_config.save_pretrained(out_dir)
    for name in TOKENIZER_FILES:
        shutil.copy(os.path.join(tokenizer_dir, name), out_dir)
    with open(os.path.join(out_dir, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    return out_dir


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("shape", choices=sorted(SHAPES))
    p.add_argument("out")
    p.add_argument("--tokenizer", help="an HF Marian directory whose tokenizer to use (default: base-de-en)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(build(SHAPES[args.shape], args.out, args.tokenizer, args.seed))


if __name__ == "__main__":
    main()
