"""CPU decoding speed-ups (Devlin 2017, Table 1, in torch terms), each optional and measured by
``python -m jobs.bench --speedups``; only those that pay are on in ``BEST``.

    model = apply_speedups(model, CpuSpeedups(fused_qkv=True, int8=True))

* ``fused_qkv``: the decoder self-attention's q, k and v projections as one (3E, E) GEMM per step
  instead of three; outputs equal up to float summation order.
* ``int8``: dynamic int8 quantisation (per-tensor weight scale, activations quantised per call) of
  every linear layer of encoder and decoder and of the full-vocabulary output layer; shortlist
  heads keep gathering from the float weight. Changes outputs by quantisation noise: the benchmark
  reports its BLEU change.

Cached cross-attention K/V, the time-major self-attention cache and skipping an all-zero logits
bias are not options: they are always on (``workers/model.py``).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import nn

from workers.model import MarianModel


@dataclass(frozen=True, slots=True)
class CpuSpeedups:
    fused_qkv: bool = False
    int8: bool = False

    def signature(self) -> str:
        on = [name for name in ("fused_qkv", "int8") if getattr(self, name)]
        return "+".join(on) or "none"


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


def quantize_int8(model: MarianModel) -> None:
    """Dynamic int8 linear layers in place (encoder, decoder, fused projections, output layer)."""
    with warnings.catch_warnings():  # torch.ao.quantization announces its successor; the kernels are current
        warnings.simplefilter("ignore")
        for stack in (model.model.encoder, model.model.decoder):
            torch.ao.quantization.quantize_dynamic(stack, {nn.Linear}, dtype=torch.qint8, inplace=True)
        head = nn.Sequential(nn.Linear(model.lm_head.in_features, model.lm_head.out_features, bias=False))
        with torch.no_grad():
            head[0].weight.copy_(model.lm_head.weight)
        model.int8_head = torch.ao.quantization.quantize_dynamic(head, {nn.Linear}, dtype=torch.qint8)[0]


def apply_speedups(model: MarianModel, opts: CpuSpeedups) -> MarianModel:
    """The inference-time rewrites ``opts`` asks for (call once, after loading the weights)."""
    model.eval()
    if opts.fused_qkv:
        fuse_qkv(model)
    if opts.int8:
        quantize_int8(model)
    return model
