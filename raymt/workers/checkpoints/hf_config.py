"""What every HF ``config.json`` mapping shares (Marian in ``workers/checkpoints/checkpoint.py``, M2M100 / NLLB in
``workers/checkpoints/m2m100.py``): the collect-all-errors exception and the bounds on sizes and token ids."""
from __future__ import annotations


class UnsupportedCheckpoint(ValueError):
    """Raised once with every reason a checkpoint cannot be loaded."""

    def __init__(self, reasons: list[str]) -> None:
        self.reasons = reasons
        super().__init__("unsupported checkpoint:\n  - " + "\n  - ".join(reasons))


# Upper bounds on the sizes config.json may give, generous next to real Marian / OPUS-MT models
# (transformer-big: d_model 1024, ffn 4096, 6-12 layers, 16 heads, vocabularies up to ~65k, 512-1024
# positions) and NLLB-200 3.3B (d_model 2048, ffn 8192, 24 + 24 layers, vocabulary 256,206, 1024
# positions), so a corrupt or hostile config is refused before anything is allocated. Every size is
# an int in 1..limit; MarianModel(cfg) allocates what they imply.
SIZE_LIMITS = {
    "d_model": 16_384, "encoder_ffn_dim": 65_536, "decoder_ffn_dim": 65_536,
    "encoder_layers": 64, "decoder_layers": 64, "encoder_attention_heads": 256, "decoder_attention_heads": 256,
    "vocab_size": 1_048_576, "decoder_vocab_size": 1_048_576, "max_position_embeddings": 65_536,
}
# max_position_embeddings * d_model: the sinusoidal tables are computed (in float64), never read from the
# weights, so their size is not bounded by the weights file: 16M entries (16x transformer-big's 1024 x 1024).
POSITION_TABLE_LIMIT = 1 << 24
# HF MarianConfig's defaults for sizes config.json leaves out (vocab_size has none: it must be given).
HF_SIZE_DEFAULTS = {"d_model": 1024, "encoder_layers": 12, "decoder_layers": 12, "encoder_attention_heads": 16,
                    "decoder_attention_heads": 16, "encoder_ffn_dim": 4096, "decoder_ffn_dim": 4096,
                    "max_position_embeddings": 1024}


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def hf_sizes(hf: dict) -> tuple[dict[str, int], list[str]]:
    """The sizes of an HF ``config.json`` (defaults filled in) and every reason they are unusable:
    not an int, outside ``1..SIZE_LIMITS``, heads not dividing d_model, too large a position table."""
    sizes, reasons = {}, []
    for key, limit in SIZE_LIMITS.items():
        if key == "decoder_vocab_size" and not hf.get(key):  # HF: decoder_vocab_size or vocab_size
            if "vocab_size" in sizes:
                sizes[key] = sizes["vocab_size"]
            continue
        value = hf.get(key, HF_SIZE_DEFAULTS.get(key))
        if value is None:  # only vocab_size has no default
            reasons.append(f"{key} missing")
        elif not is_int(value):
            reasons.append(f"{key}={value!r} is not an integer")
        elif not 1 <= value <= limit:
            reasons.append(f"{key}={value} outside 1..{limit}")
        else:
            sizes[key] = value
    d = sizes.get("d_model")
    if d is not None:
        heads = [f"{k}={sizes[k]}" for k in ("encoder_attention_heads", "decoder_attention_heads")
                 if k in sizes and d % sizes[k]]
        if heads:
            reasons.append(f"d_model {d} not divisible by {' and '.join(heads)}")
        positions = sizes.get("max_position_embeddings")
        if positions is not None and positions * d > POSITION_TABLE_LIMIT:
            reasons.append(f"max_position_embeddings * d_model = {positions} * {d} over {POSITION_TABLE_LIMIT}")
    return sizes, reasons


def token_id_reasons(ids: dict[str, object], vocab: int, dec_vocab: int) -> list[str]:
    """Reasons the special token ids are unusable: pad indexes both embeddings, eos and start the target one."""
    reasons = []
    for name, value in ids.items():
        bound = min(vocab, dec_vocab) if name == "pad_token_id" else dec_vocab
        if not is_int(value):
            reasons.append(f"{name}={value!r} is not an integer")
        elif not 0 <= value < bound:
            reasons.append(f"{name}={value} outside the vocabulary (0..{bound - 1})")
    return reasons
