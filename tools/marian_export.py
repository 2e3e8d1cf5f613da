"""Write an HF Marian directory out as a Marian checkpoint directory (the inverse of workers/checkpoints/marian_npz.py).

    python -m tools.marian_export models/demo-de-en /tmp/demo-marian [--spm-vocab]

Writes ``model.npz`` (Marian's parameter names, the options embedded as ``special:model.yml``),
``decoder.yml``, and the vocabularies: ``vocab.yml`` with ``source.spm`` / ``target.spm`` (OPUS-MT's
layout), or with ``--spm-vocab`` the sentencepiece model itself as ``vocab.spm`` (its ids must be the
vocabulary's). Shared vocabularies with tied embeddings only; ``<pad>`` must be the last id.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil

import numpy as np
from safetensors.numpy import load_file

from raymt.workers.checkpoints.marian_npz import BIAS_KEY, CONFIG_KEY, LAYER_NAMES

HF_ACTIVATIONS = {"swish": "swish", "silu": "swish", "relu": "relu"}


def marian_options(hf: dict, vocab_size: int) -> dict:
    """The options Marian embeds in a transformer checkpoint (its defaults for the rest)."""
    return {
        "type": "transformer", "dim-vocabs": [vocab_size, vocab_size], "dim-emb": hf["d_model"],
        "enc-depth": hf["encoder_layers"], "dec-depth": hf["decoder_layers"],
        "transformer-heads": hf["encoder_attention_heads"], "transformer-dim-ffn": hf["encoder_ffn_dim"],
        "transformer-decoder-dim-ffn": 0 if hf["decoder_ffn_dim"] == hf["encoder_ffn_dim"] else hf["decoder_ffn_dim"],
        "transformer-ffn-depth": 2, "transformer-decoder-ffn-depth": 0,
        "transformer-ffn-activation": HF_ACTIVATIONS[hf.get("activation_function", "swish")],
        "transformer-preprocess": "", "transformer-postprocess": "dan", "transformer-postprocess-emb": "d",
        "transformer-decoder-autoreg": "self-attention", "transformer-aan-depth": 2, "transformer-aan-nogate": False,
        "transformer-train-position-embeddings": False, "transformer-no-projection": False,
        "transformer-tied-layers": [], "tied-embeddings": True, "tied-embeddings-src": False,
        "tied-embeddings-all": True, "layer-normalization": False, "right-left": False, "ulr": False,
        "ulr-dim-emb": 0, "dec-cell-base-depth": 2, "dec-cell-high-depth": 1, "lemma-dim-emb": 0,
        "factors-dim-emb": 0, "version": "v1.12.0",
    }


def yaml_text(options: dict) -> str:
    """Options as Marian writes them: one ``key: value`` a line, lists as ``[a, b]``."""
    def value(v) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return '""' if v == "" else str(v)
    return "".join(f"{k}: {value(v)}\n" for k, v in options.items())


def marian_arrays(state: dict[str, np.ndarray], hf: dict, options: dict) -> dict[str, np.ndarray]:
    """HF Marian weights -> Marian's npz parameters (the ``<pad>`` row dropped, W as (in, out), (1, n) vectors)."""
    arrays = {"Wemb": state["model.shared.weight"][:-1]}
    if "final_logits_bias" in state:
        arrays[BIAS_KEY] = state["final_logits_bias"].reshape(1, -1)[:, :-1]
    for side, depth in (("encoder", hf["encoder_layers"]), ("decoder", hf["decoder_layers"])):
        for i in range(depth):
            for suffix, (name, transposed) in LAYER_NAMES.items():
                if side == "encoder" and suffix.startswith("context_"):
                    continue
                t = state[f"model.{side}.layers.{i}.{name}"]
                arrays[f"{side}_l{i + 1}_{suffix}"] = t.T.copy() if transposed else t.reshape(1, -1)
    arrays = {k: v.astype(np.float32) for k, v in arrays.items()}
    text = yaml_text(options).encode() + b"\0"
    arrays[CONFIG_KEY] = np.frombuffer(text, dtype=np.int8).copy()
    return arrays


def export(hf_dir: str, out_dir: str, *, spm_vocab: bool = False, extra_options: dict | None = None,
           model_name: str = "model.npz") -> None:
    """Write the HF Marian directory ``hf_dir`` as a Marian directory ``out_dir``."""
    with open(os.path.join(hf_dir, "config.json")) as f:
        hf = json.load(f)
    with open(os.path.join(hf_dir, "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    if vocab.get("<pad>") != max(vocab.values()) or not hf.get("share_encoder_decoder_embeddings", True):
        raise ValueError("only shared vocabularies whose <pad> is the last id are written")
    state = {k: v.astype(np.float32) for k, v in load_file(os.path.join(hf_dir, "model.safetensors")).items()}
    options = {**marian_options(hf, len(vocab) - 1), **(extra_options or {})}
    os.makedirs(out_dir, exist_ok=True)
    np.savez(os.path.join(out_dir, model_name), **marian_arrays(state, hf, options))
    if spm_vocab:
        shutil.copy(os.path.join(hf_dir, "source.spm"), os.path.join(out_dir, "vocab.spm"))
        vocab_name = "vocab.spm"
    else:
        vocab_name = "vocab.yml"
        pieces = {p: i for p, i in sorted(vocab.items(), key=lambda kv: kv[1]) if p != "<pad>"}
        with open(os.path.join(out_dir, vocab_name), "w", encoding="utf-8") as f:
            f.writelines(f"{json.dumps(p, ensure_ascii=False)}: {i}\n" for p, i in pieces.items())
        for name in ("source.spm", "target.spm"):
            shutil.copy(os.path.join(hf_dir, name), os.path.join(out_dir, name))
    with open(os.path.join(out_dir, "decoder.yml"), "w") as f:
        f.write(f"models:\n  - {model_name}\nvocabs:\n  - {vocab_name}\n  - {vocab_name}\n"
                f"beam-size: {hf.get('num_beams', 4)}\nnormalize: 1\nrelative-paths: true\n")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("hf_dir")
    p.add_argument("out_dir")
    p.add_argument("--spm-vocab", action="store_true", help="write the sentencepiece model as vocab.spm")
    args = p.parse_args(argv)
    export(args.hf_dir, args.out_dir, spm_vocab=args.spm_vocab)
    print(f"wrote {args.out_dir}")


if __name__ == "__main__":
    main()
