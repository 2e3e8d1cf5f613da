"""CPU decoding speed-ups (Devlin 2017, Table 1, in torch terms), each optional and measured by
``python -m benchmarks.bench`` (its cumulative speed-up table); only those that pay are on by default.

    model = apply_speedups(model, CpuSpeedups(fused_qkv=True, onednn=True, int8=False))

* ``fused_qkv``: the decoder self-attention's q, k and v projections as one (3E, E) GEMM per step
  instead of three; outputs equal up to float summation order.
* ``onednn``: every linear layer (and the full-vocabulary output layer) with its weight prepacked
  once into oneDNN's blocked layout and run by oneDNN's GEMM instead of torch's default BLAS call
  (MKL). Same float32 math, another summation order. Measured on this 2-core AMD EPYC, at decoding
  shapes (N=109..160 rows): 1.2x on the E x 4E layers, 2.2-3.5x on the E x V output layer, where
  MKL's unpacked sgemm drops to ~80 GFLOP/s. The FFN's swish/relu runs as the first FFN GEMM's
  oneDNN post-op. Products of a few rows go elsewhere (``PackedLinear``): with ``native``, to the
  native ``small_linear`` kernel (up to 160 rows: oneDNN's call costs ~10-20 us before any
  arithmetic); without, to MKL where MKL is fast for them (Intel CPUs, ``small_work``). Skipped
  (with a warning) where torch lacks oneDNN.
* ``int8``: dynamic int8 quantisation (weights per output channel, activations per call) of
  every linear layer of encoder and decoder, of the full-vocabulary output layer and of each
  shortlist head (quantised once per candidate set). With the native kernels on a CPU without an
  int8 dot-product unit, a full output layer of ``FUSED_MIN_OUTPUTS`` words or more runs float32
  fused with the row top for the rows that kernel takes (``Int8Linear.float_top``: faster than the int8 product, whose logits are written
  and read again). Per-channel scales keep the BLEU change
  within noise on the demo model (+0.02..+0.15 on Multi30k; per-tensor scales cost 0.31): the
  benchmark reports it every run. Where the CPU has AMX tiles, large products run oneDNN's AMX
  int8 kernels and small ones FBGEMM's (``Int8Linear``): 1.2x on the base model at beam 5.
* ``bf16``: bfloat16 weights and activations (the model cast once; oneDNN's bf16 GEMMs where
  ``onednn`` is on); log-softmax and scores stay float32. The alternative to ``int8`` (not both);
  also the GPU path's dtype. Measured on an AVX512-BF16 CPU: ~1.2x over float32 at beam 5,
  BLEU within noise (+0.04 on 320 Multi30k lines, 302/320 identical). On the CPU it needs oneDNN's
  bf16 GEMMs (AVX512-BW/VL/DQ or AVX-NE-CONVERT, ``raymt.workers.kernels.isa``): elsewhere (AVX2-only
  CPUs) ``apply_speedups`` refuses it with ``IsaUnsupported`` before touching the model.
* ``fp16``: float16 weights and activations instead, for GPUs without bf16 (T4, V100); log-softmax
  and scores stay float32. It runs on the CPU too (ATen's kernels, no oneDNN packing), slowly:
  that is where CI tests it.
* ``native``: the fused C++ decode-step operators of ``workers/kernels/native.py`` as the model's step
  backend (``raymt.workers.model.step_ops.NativeOps``: log-softmax + top-k bit-equal to ATen's; one-query self-
  and cross-attention, float32 to ~1e-6; with ``onednn``, the output layer's product fused with the
  log-softmax + top-k, ``PackedLinear.row_top``), built on first use; float32 activations only (bf16
  steps keep ``AtenOps``). Skipped, with a warning, where they cannot be built.
* ``warm_heap``: glibc's allocator serves tensors up to 32 MB from its heap and keeps freed memory
  (``mallopt``; a process setting, applied once) so a step's large tensors (logits, caches) reuse
  warm pages. By default glibc maps each large block fresh and returns it on free, and every step
  pays page faults on it: on 2 cores ~80-290k minor faults per 320-line beam-5 run, ~30k with this.
  Memory freed by decoding stays with the process (up to ``TRIM_MB``) for the next batch.

Cached cross-attention K/V, the time-major self-attention cache and skipping an all-zero logits
bias are not options: they are always on (``workers/model/model.py``). Inference only: the rewritten
layers have no gradients and do not save into a state dict.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raymt.workers.kernels.isa import detect as detect_isa
from raymt.workers.kernels.isa import require_bf16
from raymt.workers.model.model import MarianModel
from raymt.workers.kernels.native import load as load_native
from raymt.workers.model.packed_linear import PackedLinear, rows_for
from raymt.workers.model.step_ops import ATEN, NativeOps

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CpuSpeedups:
    fused_qkv: bool = False
    onednn: bool = False
    int8: bool = False
    warm_heap: bool = False
    bf16: bool = False
    native: bool = False
    fp16: bool = False

    def __post_init__(self) -> None:
        if self.int8 + self.bf16 + self.fp16 > 1:
            raise ValueError("int8, bf16 and fp16 are alternatives: choose one")

    def signature(self) -> str:
        on = [name for name in ("fused_qkv", "onednn", "native", "int8", "bf16", "fp16", "warm_heap")
              if getattr(self, name)]
        return "+".join(on) or "none"

    @property
    def dtype(self) -> torch.dtype:
        """The weights' and activations' dtype these options give (int8 layers take float32 in and out)."""
        return torch.bfloat16 if self.bf16 else torch.float16 if self.fp16 else torch.float32

    @property
    def precision(self) -> str:
        """The precision these options decode in: int8, bf16, fp16 or float32 (int8 on the CPU only:
        ``precision_refusal`` refuses it elsewhere, so a precision named is one that runs)."""
        return "int8" if self.int8 else "bf16" if self.bf16 else "fp16" if self.fp16 else "float32"


def precision_refusal(opts: CpuSpeedups, device: str | torch.device) -> str | None:
    """Why ``opts`` cannot decode on ``device`` (None: they can; ``auto`` is decided where it
    decodes). int8 is dynamic quantisation on CPU kernels: on a GPU it would not run, and the model
    would decode in float32 under an int8 label."""
    if opts.int8 and str(device).split(":")[0] not in ("cpu", "auto"):
        return (f"int8 runs on the CPU only (dynamic quantisation on CPU kernels), not on {device}: decode there "
                "in float32, bfloat16 or float16 instead (--bf16 / --fp16; compute_type 'bfloat16' / 'float16')")
    return None


EXACT = CpuSpeedups(fused_qkv=True, onednn=True, warm_heap=True, native=True)  # the default: float32 outputs (up to summation order)

MMAP_THRESHOLD_MB, TRIM_MB = 32, 1024  # glibc's largest heap-served block; freed memory kept before trimming


def warm_heap() -> bool:
    """glibc ``mallopt``: serve blocks up to ``MMAP_THRESHOLD_MB`` from the heap (this also stops
    glibc's dynamic threshold) and trim the heap only past ``TRIM_MB`` free. False where the C
    library has no ``mallopt`` (not glibc) or refuses a setting; idempotent."""
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    return bool(mallopt(m_mmap_threshold, MMAP_THRESHOLD_MB << 20)) and bool(mallopt(m_trim_threshold, TRIM_MB << 20))


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def fuse_qkv(model: MarianModel) -> None:
    """Give each decoder self-attention a fused ``qkv_proj`` (3E, E) built from its q/k/v weights."""
    for layer in model.model.decoder.layers:
        sa = layer.self_attn
        e = sa.q_proj.in_features
        fused = nn.Linear(e, 3 * e)
        with torch.no_grad():
            fused.weight.copy_(torch.cat([sa.q_proj.weight, sa.k_proj.weight, sa.v_proj.weight]))  # (3E, E)
            fused.bias.copy_(torch.cat([sa.q_proj.bias, sa.k_proj.bias, sa.v_proj.bias]))
        sa.qkv_proj = fused


def _identity(x: Tensor) -> Tensor:
    return x


def _install(parent: nn.Module, name: str, layer) -> None:
    """``parent.<name> = layer`` for a plain callable in place of a child module (inference only:
    it leaves the module tree and the state dict)."""
    parent._modules.pop(name, None)
    object.__setattr__(parent, name, layer)


def _replace_linears(root: nn.Module, make) -> None:
    for parent in list(root.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                _install(parent, name, make(child))


POST_OPS = {F.silu: "swish", F.relu: "relu"}  # activations oneDNN can fuse into the first FFN GEMM


def pack_onednn(model: MarianModel) -> None:
    """Every float ``nn.Linear`` of encoder and decoder, and the full-vocabulary output layer,
    prepacked; the FFN activation (swish/relu) folded into the first FFN GEMM."""
    for layer in (*model.model.encoder.layers, *model.model.decoder.layers):
        if type(layer.fc1) is nn.Linear and layer.act in POST_OPS:
            _install(layer, "fc1", PackedLinear.of(layer.fc1, POST_OPS[layer.act]))
            layer.act = _identity
    for stack in (model.model.encoder, model.model.decoder):
        _replace_linears(stack, PackedLinear.of)
    if model.vocab_head is None:  # (int8 keeps its quantised output layer)
        model.vocab_head = PackedLinear(model.lm_head.weight, None)  # the logits bias is added by ``project``
    if model.pack_head is None:  # (int8 quantises its shortlist heads)
        model.pack_head = PackedLinear  # shortlist heads: packed once per candidate set


def amx_int8() -> bool:
    """Whether this CPU has AMX tiles, torch has oneDNN's quantised kernels, which use them, and
    ``ONEDNN_MAX_CPU_ISA`` does not hold oneDNN below them (held at AVX2, its int8 kernels
    saturate: outputs 0.45 off where FBGEMM's are 0.05)."""
    return "onednn" in torch.backends.quantized.supported_engines and \
        getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)() and detect_isa().onednn_amx


@contextlib.contextmanager
def _packing_for(engine: str):
    """Pack (quantise) weights for ``engine``; the packed weights keep their library afterwards."""
    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine
    try:
        yield
    finally:
        torch.backends.quantized.engine = before


class Int8Linear:
    """A dynamic int8 linear layer reduced to its kernel call (``torch.ao``'s module checks the dtype
    and version and converts the result on every call, ~20 us of Python per call (measured on 2 cores), 19
    calls per decoder step), weights quantised per output channel.

    Two kernel libraries, chosen per call by the product's size: FBGEMM (AVX512-VNNI / AVX2;
    ``reduce_range``, 7-bit activations, as torch.ao passes it) and, where the CPU has AMX tiles,
    oneDNN's (on the tiles; full-range activations) once rows x in x out reaches ``AMX_MIN_WORK``.
    Measured on this AMX Xeon, 2 threads: oneDNN pays ~15-30 us more per call, so it loses below
    ~24M multiply-adds and wins above (1.8x at 160 x 512 x 2048, 1.8x on the 58k output layer)."""

    AMX_MIN_WORK = 24_000_000
    # The full output layer's float32 product fused with the row top (``fuse_float_top``), where that
    # kernel takes the rows: no (N, V) logits written. On AVX2 (no int8 dot-product unit), 58,101
    # words, 1 thread, 160 rows: the int8 product alone 72 GFLOP/s (the float32 one 84), and its
    # logits, 37 MB a step, each page faulted in anew and read again by the row top; int8 decoding
    # 1.06-1.18x faster fused. With VNNI or AMX (``CpuIsa.int8_dot``) the int8 product stays.
    float_top: "PackedLinear | None" = None

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        """weight: (out, in) qint8 per-channel; bias (out,) float or None."""
        self.out_features, self.in_features = weight.shape
        with _packing_for("fbgemm" if "fbgemm" in torch.backends.quantized.supported_engines else
                          torch.backends.quantized.engine):
            self.packed = torch.ops.quantized.linear_prepack(weight, bias)
        self.amx, self.amx_rows = None, 0
        if amx_int8():
            with _packing_for("onednn"):
                self.amx = torch.ops.quantized.linear_prepack(weight, bias)
            self.amx_rows = rows_for(self.AMX_MIN_WORK, self.in_features, self.out_features)

    @classmethod
    def of(cls, quantized: nn.Module) -> "Int8Linear":
        """The kernels of a ``torch.ao`` dynamic quantised ``Linear`` (its int8 weight, repacked)."""
        return cls(*quantized._packed_params._weight_bias())

    @classmethod
    def from_weight(cls, weight: Tensor, bias: Tensor | None) -> "Int8Linear":
        """A (C, E) weight quantised as ``quantize_dynamic`` quantises a linear layer (symmetric
        per-channel int8), without building a module: the output layer and each shortlist head."""
        with torch.no_grad():
            scales = weight.abs().amax(dim=1).clamp(min=1e-8).double() / 127.5  # per_channel_symmetric qint8
            zero = torch.zeros(weight.shape[0], dtype=torch.long)
            q = torch.quantize_per_channel(weight.float(), scales, zero, axis=0, dtype=torch.qint8)
        return cls(q, None if bias is None else bias.float())

    def fuse_float_top(self, weight: Tensor, kernels) -> None:
        """Run the row top fused with the float32 product of ``weight`` (this layer's, unquantised)."""
        self.float_top = PackedLinear(weight, None, onednn=False)
        self.float_top.use_small_kernel(kernels)

    def row_top(self, x: Tensor, num: int, skip: int, bias: Tensor | None) -> tuple[Tensor, Tensor] | None:
        """``PackedLinear.row_top`` over ``float_top`` where it takes x; None (this int8 product, then
        a separate row top) elsewhere."""
        return None if self.float_top is None else self.float_top.row_top(x, num, skip, bias)

    def __call__(self, x: Tensor) -> Tensor:
        # the overload itself: the op packet would first search the arguments for fake script objects
        if self.amx is not None and x.numel() >= self.amx_rows * self.in_features:
            return torch.ops.quantized.linear_dynamic.default(x, self.amx, False)
        return torch.ops.quantized.linear_dynamic.default(x, self.packed, True)


def _lean_int8(root: nn.Module) -> None:
    dynamic = torch.ao.nn.quantized.dynamic.Linear
    for parent in list(root.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is dynamic:
                _install(parent, name, Int8Linear.of(child))


def quantize_int8(model: MarianModel) -> None:
    """Dynamic int8 linear layers in place (encoder and decoder, fused projections included), the
    full-vocabulary output layer and each shortlist head; weights quantised per output channel.
    ``lm_head`` itself stays float (it is tied to the embeddings)."""
    qconfig = {nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}
    with warnings.catch_warnings():  # torch.ao.quantization announces its successor; the kernels are current
        warnings.simplefilter("ignore")
        for stack in (model.model.encoder, model.model.decoder):
            _lean_int8(torch.ao.quantization.quantize_dynamic(stack, qconfig, dtype=torch.qint8, inplace=True))
    model.vocab_head = Int8Linear.from_weight(model.lm_head.weight, None)  # the logits bias is added by ``project``
    model.pack_head = Int8Linear.from_weight  # shortlist heads: quantised once per candidate set
    if amx_int8():
        logger.info("int8 layers: oneDNN's AMX kernels for large products, FBGEMM's for small ones")


def apply_speedups(model: MarianModel, opts: CpuSpeedups) -> MarianModel:
    """The inference-time rewrites ``opts`` asks for (call once, after loading the weights)."""
    if opts.bf16 and next(model.parameters()).device.type == "cpu":
        require_bf16()  # one line, before any rewrite: AVX2-only CPUs have no bf16 GEMMs
    model.eval()
    if opts.warm_heap and not warm_heap():
        logger.warning("this C library has no glibc mallopt: warm_heap speed-up skipped")
    if opts.fused_qkv:
        fuse_qkv(model)
    if opts.dtype != torch.float32:
        model.to(opts.dtype)
    if opts.int8:
        quantize_int8(model)
    if opts.native and next(model.parameters()).device.type == "cpu":
        kernels = load_native()  # None where they cannot be built: the ATen operators decode
        model.model.decoder.ops = NativeOps(kernels) if kernels is not None else ATEN
        if kernels is not None and model.config.normalize_before:
            logger.info("pre-norm model: the native attention kernels decode; its LayerNorms and residual adds run "
                        "in ATen (the native fused add + LayerNorm is post-norm only)")
    if opts.onednn and next(model.parameters()).device.type == "cpu" and not opts.fp16:  # (no fp16 packing)
        if onednn_available():
            pack_onednn(model)
            if isinstance(model.model.decoder.ops, NativeOps):  # few-row products on the native kernel
                kernels = model.model.decoder.ops.kernels
                heads = [model.vocab_head] if isinstance(model.vocab_head, PackedLinear) else []
                if isinstance(model.vocab_head, Int8Linear) and not detect_isa().int8_dot and \
                        model.vocab_head.out_features >= PackedLinear.FUSED_MIN_OUTPUTS:
                    model.vocab_head.fuse_float_top(model.lm_head.weight, kernels)
                for layer in (*_packed_layers(model.model.encoder), *_packed_layers(model.model.decoder), *heads):
                    layer.use_small_kernel(kernels)
                if model.pack_head is PackedLinear:  # shortlist heads on the same kernel as the full one: a
                    model.pack_head = functools.partial(_small_head, kernels=kernels)  # column sums alike
        else:
            logger.warning("this torch build has no oneDNN linear kernels: onednn speed-up skipped")
    return model


def _small_head(weight: Tensor, bias: Tensor | None, kernels) -> PackedLinear:
    """A shortlist head packed for oneDNN and for ``small_linear``: a candidate's logit is the same
    sum in the same order as in the full output layer, so a shortlist of every word decodes as none."""
    head = PackedLinear(weight, bias)
    head.use_small_kernel(kernels)
    return head


def _packed_layers(module: nn.Module) -> list[PackedLinear]:
    """Every ``PackedLinear`` installed under ``module`` (plain attributes, outside the module tree)."""
    return [v for m in module.modules() for v in vars(m).values() if isinstance(v, PackedLinear)]
