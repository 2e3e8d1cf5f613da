"""Frozen configuration dataclasses shared by every layer of the project.

Built once in ``jobs/`` and passed down; each validates itself in ``__post_init__``.
"""
from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass

ACTIVATIONS = ("swish", "silu", "relu", "gelu", "gelu_new")
POSITION_STYLES = ("marian", "fairseq")  # sinusoidal tables: Marian's, or M2M100's (fairseq's; workers/model/model.py)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shape of a Marian transformer, as HF ``MarianConfig`` describes it, or of its M2M100 / NLLB-200
    variant (``normalize_before``, ``final_layer_norms``, ``position_style="fairseq"``: HF
    ``M2M100Config``, built by ``workers/checkpoints/m2m100.py``); the defaults are Marian's."""

    vocab_size: int  # source (and shared) vocabulary
    decoder_vocab_size: int  # target vocabulary (== vocab_size when shared)
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    activation_function: str = "swish"
    max_position_embeddings: int = 512
    scale_embedding: bool = True
    share_encoder_decoder_embeddings: bool = True
    tie_word_embeddings: bool = True
    pad_token_id: int = 0
    eos_token_id: int = 0
    decoder_start_token_id: int = 0
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    normalize_before: bool = False  # pre-norm layers: LayerNorm before attention / FFN, residual after
    final_layer_norms: bool = False  # a LayerNorm after the last encoder layer and after the last decoder layer
    position_style: str = "marian"  # "fairseq": rows offset by pad_token_id + 1, padding positions zero

    def __post_init__(self) -> None:
        if self.position_style not in POSITION_STYLES:
            raise ValueError(f"position_style {self.position_style!r} not in {POSITION_STYLES}")
        if self.activation_function not in ACTIVATIONS:
            raise ValueError(f"activation_function {self.activation_function!r} not in {ACTIVATIONS}")
        for name in ("encoder_attention_heads", "decoder_attention_heads"):
            if self.d_model % getattr(self, name):
                raise ValueError(f"d_model {self.d_model} not divisible by {name}")
        if self.share_encoder_decoder_embeddings and self.vocab_size != self.decoder_vocab_size:
            raise ValueError("shared embeddings need vocab_size == decoder_vocab_size")
        for name in ("pad_token_id", "eos_token_id", "decoder_start_token_id"):
            if not 0 <= getattr(self, name) < self.decoder_vocab_size:
                raise ValueError(f"{name}={getattr(self, name)} outside target vocabulary")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class PruningConfig:
    rp: float | None = None  # in (0, 1]
    ap: float | None = None  # >= 0, log space
    rpl: float | None = None  # in (0, 1]
    mc: int | None = None  # >= 1
    delta: float | None = None  # >= 0, log space, reference may be finished
    early_stop: bool = False

    def __post_init__(self) -> None:
        for name in ("rp", "rpl"):
            value = getattr(self, name)
            if value is not None and not 0.0 < value <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {value}")
        for name in ("ap", "delta"):
            value = getattr(self, name)
            if value is not None and value < 0.0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if self.mc is not None and self.mc < 1:
            raise ValueError(f"mc must be >= 1, got {self.mc}")

    @property
    def active(self) -> bool:
        return any(v is not None for v in (self.rp, self.ap, self.rpl, self.mc, self.delta)) or self.early_stop

    def signature(self) -> str:
        parts = [f"{n}:{getattr(self, n)}" for n in ("rp", "ap", "rpl", "mc", "delta") if getattr(self, n) is not None]
        return "|".join(parts + (["early_stop"] if self.early_stop else [])) or "none"


# The fastest pruning that lost <= 0.3 BLEU against exact beam search in docs/results/search.md
# (Multi30k test2016, demo model): rp 0.6 alone, 2.24x at beam 5 (-0.01 BLEU) and 5.19x at
# beam 14 (-0.14 BLEU). ap 2.5 is the safe choice (no BLEU loss, 0.5% search errors, 1.68x at 14).
FAST_PRUNING = PruningConfig(rp=0.6)


# Sampling temperatures outside these bounds change nothing a draw could want and only risk the float
# math: at 1e-4 a token 2e-3 nats below the best is drawn with probability < e**-20 a step (greedy), at
# 1e4 tokens 100 nats apart (a probability ratio of e**-100, about float32's smallest) weigh within 1%
# of each other (uniform over the tokens considered). Both are normal numbers in float16 too.
MIN_SAMPLING_TEMPERATURE = 1e-4
MAX_SAMPLING_TEMPERATURE = 1e4
# The widest beam, and the most samples a sentence draws: one sentence holds beam_size rows of
# self-attention K/V and of step logits (``workers/decoder/tuning.bytes_per_sentence``), about 2 MB a row for a
# Marian base model (6 layers, d_model 512, 58k vocabulary) at 60 target tokens, 2 GB at this cap; it
# covers the thousand-odd samples minimum-Bayes-risk decoding draws and large-beam studies search.
MAX_BEAM_SIZE = 1024
NUM_SAMPLES = 1  # samples a sentence draws when sampling is asked for without a count (``--num-samples``)


@dataclass(frozen=True, slots=True)
class SamplingConfig:
    """Random sampling instead of beam search, named as CTranslate2 names it (``sampling_temperature``,
    ``sampling_topk``, ``sampling_topp``; Marian's ``--output-sampling``): each of a sentence's
    ``SearchConfig.beam_size`` lanes draws its own translation, token by token, from
    softmax(log-probs / temperature) restricted to the ``topk`` most likely tokens (0: all) and then
    to the smallest set of them holding ``topp`` of the mass (1: all). A draw is a function of
    ``seed``, the sentence's source ids and target language, its lane and its step
    (``raymt.workers.search.sampling``): the same whichever sentences share its steps, however a job is cut
    into units, and on a resume (up to float rounding of the probabilities between batch shapes: a
    draw within ~1e-6 of the boundary between two tokens may take the neighbouring one)."""

    temperature: float = 1.0  # in [MIN_SAMPLING_TEMPERATURE, MAX_SAMPLING_TEMPERATURE]
    topk: int = 0  # >= 0; 1: greedy
    topp: float = 1.0  # in (0, 1]
    seed: int = 0

    def __post_init__(self) -> None:
        # (written so that NaN fails every comparison and is refused)
        if not MIN_SAMPLING_TEMPERATURE <= self.temperature <= MAX_SAMPLING_TEMPERATURE:
            raise ValueError(f"sampling temperature must be in [{MIN_SAMPLING_TEMPERATURE:g}, "
                             f"{MAX_SAMPLING_TEMPERATURE:g}], got {self.temperature} (colder is greedy: "
                             "top-k 1; hotter draws uniformly)")
        if isinstance(self.topk, bool) or not isinstance(self.topk, numbers.Integral) or self.topk < 0:
            raise ValueError(f"sampling top-k must be an integer >= 0 (0: the whole vocabulary), got {self.topk!r}")
        if not 0.0 < self.topp <= 1.0:
            raise ValueError(f"sampling top-p must be in (0, 1], got {self.topp}")

    def signature(self) -> str:
        return f"sample:t{self.temperature}|k{self.topk}|p{self.topp}|seed{self.seed}"


@dataclass(frozen=True, slots=True)
class SearchConfig:
    """Decoding options, named as CTranslate2 names them.

    ``max_decoding_length`` caps generated tokens (EOS included); the per-sentence cap is
    ``min(max_decoding_length, int(max_length_a * source_length + max_length_b))``.
    ``length_penalty`` is HF/Marian's alpha: a hypothesis scores ``sum_logprob / length**alpha``.
    These defaults are the product's: the command line's flags, ``Translator.translate`` and the
    jobs all decode with them (``raymt.workers.decoder.decode_config.DEFAULTS``), an M2M100 / NLLB directory
    with its own generation settings over them (``workers/checkpoints/generation.py``).
    """

    beam_size: int = 5
    num_hypotheses: int = 1
    length_penalty: float = 1.0
    max_decoding_length: int = 256
    max_length_a: float = 1.5
    max_length_b: int = 10
    early_stopping: bool = False  # HF semantics: False = heuristic stop, True = stop at K finished
    pruning: PruningConfig = PruningConfig()  # all off: exact beam search
    sampling: SamplingConfig | None = None  # set: beam_size lanes each draw a sample (SamplingConfig)

    def __post_init__(self) -> None:
        if self.sampling is not None and self.pruning.active:
            raise ValueError("beam pruning applies to beam search, not to sampling")
        if not 1 <= self.beam_size <= MAX_BEAM_SIZE:
            name = "num_samples (sampling's beam_size)" if self.sampling is not None else "beam_size"
            raise ValueError(f"{name} must be in [1, {MAX_BEAM_SIZE}], got {self.beam_size}")
        if not 1 <= self.num_hypotheses <= self.beam_size:
            raise ValueError(f"num_hypotheses must be in [1, beam_size={self.beam_size}], got {self.num_hypotheses}")
        if self.max_decoding_length < 1:
            raise ValueError("max_decoding_length must be >= 1")
        if self.max_length_a < 0 or self.max_length_b < 1:
            raise ValueError("max_length_a must be >= 0 and max_length_b >= 1")

    def max_length_for(self, source_length: int) -> int:
        """Max generated tokens (EOS included) for a source of ``source_length`` tokens."""
        if self.max_length_a == 0.0:
            return min(self.max_decoding_length, self.max_length_b)
        return max(1, min(self.max_decoding_length, int(self.max_length_a * source_length + self.max_length_b)))

    def signature(self) -> str:
        """The options that decide the output, in one line (early stopping named only when on)."""
        return (f"beam:{self.beam_size}|nbest:{self.num_hypotheses}|lp:{self.length_penalty}"
                f"|maxlen:{self.max_length_a}*src+{self.max_length_b}<= {self.max_decoding_length}"
                + ("|early-stopping" if self.early_stopping else "") + f"|prune:{self.pruning.signature()}"
                + (f"|{self.sampling.signature()}" if self.sampling else ""))
