"""Float32 linear layers packed once for the CPU's kernels: oneDNN's prepacked GEMM, the native
``small_linear`` for a decode step's few rows, and the output layer fused with the row top
(``PackedLinear``); where each product switches kernels (``rows_for``, ``small_work``)."""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_POST_FN = {"swish": lambda y: F.silu(y, inplace=True), "relu": lambda y: F.relu(y, inplace=True)}
_ACT = {"none": 0, "swish": 1, "relu": 2}  # small_linear.cpp's activation codes


def rows_for(work: int, in_features: int, out_features: int) -> int:
    """The fewest rows whose product with an (in, out) weight reaches ``work`` multiply-adds: where a
    layer switches kernels (``PackedLinear``, ``Int8Linear``)."""
    return -(-work // (in_features * out_features))


@functools.cache
def cpu_vendor() -> str:
    """/proc/cpuinfo's ``vendor_id`` ("GenuineIntel", "AuthenticAMD", ...); "" where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("vendor_id")), "")
    except OSError:
        return ""


def small_work() -> int:
    """Below how many multiply-adds a float32 product runs MKL's unpacked ``F.linear`` rather than
    oneDNN's prepacked kernel (``PackedLinear``), 2 threads, best of 3x200 calls:

    * Intel Xeon (AMX): oneDNN's call costs ~10 us more (1 row of 256 x 768: 24 us against 11),
      which a small product does not earn back: 8M (demo model beam 1, 120 lines: 0.47 -> 0.40 s).
    * AMD EPYC (Zen 5): MKL is 2-3x slower than oneDNN from 4 rows on (256 x 768 at 20 rows: 103 us
      against 56; 512 x 2048: 361 against 110) and wins only single rows of a small weight
      (256 x 768: 14 us against 28; the 256 x 8001 output layer: 134 against 63): 250k."""
    return 8_000_000 if cpu_vendor() == "GenuineIntel" else 250_000


class PackedLinear:
    """``y = x W^T + b`` with W prepacked once for oneDNN. x (..., in) -> (..., out); CPU, x in W's dtype.

    A plain callable, not an ``nn.Module``: installed in place of a linear layer (``_install``), a
    call is one attribute read and the kernel, without the module call machinery (measured ~5% of a
    greedy step on the demo model: 58 layers per step).

    Products under ``SMALL_WORK`` multiply-adds run torch's default ``F.linear`` (MKL) on the
    unpacked weight instead, where that is faster, which depends on the CPU (``small_work``): MKL
    takes its fast small-GEMM paths on Intel CPUs only. The float weight is kept beside the packed
    one for it (the layers' float32 weights twice in memory: ~170 MB on the base model), and with
    ``use_small_kernel`` once more in that kernel's layout."""

    SMALL_WORK = None  # None: ``small_work()`` for this CPU
    # ``use_small_kernel`` up to this many rows (a 32-sentence beam-5 step): in one process, Multi30k
    # beam 5 64 -> 160 rows 4.38 -> 4.16 s, base model 4.83 -> 4.67 s; greedy steps stay under 64
    SMALL_KERNEL_ROWS = 160
    # ``row_top`` fuses the product with the row top from this many outputs on: 2 cores (AMD EPYC
    # Zen 3, AVX2), beam 5, 256 lines decoded to 48 tokens, tokens/s fused / unfused in one run: 1.30
    # at 58,101 words (the (160, V) logits are 37 MB a step), 0.98 at 8,001 (they stay cached)
    FUSED_MIN_OUTPUTS = 16384

    def __init__(self, weight: Tensor, bias: Tensor | None, post_op: str = "none", onednn: bool = True) -> None:
        """``onednn`` False: no oneDNN copy (a layer that runs only on ``use_small_kernel``'s kernels,
        ``F.linear`` past them)."""
        self.out_features, self.in_features = weight.shape
        weight = weight.detach().contiguous()  # float32 or bfloat16: x must have the same dtype
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, None) if onednn else None
        self.bias = None if bias is None else bias.detach().to(weight.dtype).contiguous()
        self.post_op = post_op  # an activation oneDNN applies to the GEMM's output tile: "none", "swish", "relu"
        self.weight = weight
        self.small_rows = rows_for(small_work() if self.SMALL_WORK is None else self.SMALL_WORK, self.in_features,
                                   self.out_features)
        self.small_kernel, self.small_packed, self.top_kernel = None, None, None  # ``use_small_kernel``

    @classmethod
    def of(cls, linear: nn.Linear, post_op: str = "none") -> "PackedLinear":
        return cls(linear.weight, linear.bias, post_op)

    def use_small_kernel(self, kernels) -> None:
        """Products of up to ``SMALL_KERNEL_ROWS`` rows (a decode step's) on the native
        ``small_linear`` (``workers/kernels/csrc/small_linear.cpp``), the weight packed once more for it:
        oneDNN's call costs ~10-20 us before any arithmetic. 2 AMD EPYC threads, 20 rows, oneDNN ->
        this: 256 x 768 32 -> 21 us, 256 x 256 19 -> 8, 256 x 1024 48 -> 30, 512 x 2048 129 -> 109;
        1 row of 256 x 768: 18 -> 7. float32 weights; outputs that do not fill whole vector
        registers (an 8001-word output layer) are zero-padded to the next one in the packed copy."""
        if self.weight.dtype != torch.float32:
            return
        width = kernels.vector_width()
        blocks = -(-self.out_features // width)
        weight = F.pad(self.weight, (0, 0, 0, blocks * width - self.out_features))  # (N', K), N' = blocks * W
        self.small_kernel, self.top_kernel = kernels.small_linear, kernels.head_top_log_softmax
        self.small_packed = weight.view(blocks, width, self.in_features).transpose(1, 2).contiguous()  # (N' / W, K, W)

    def __call__(self, x: Tensor) -> Tensor:
        if self.small_kernel is not None and x.dim() == 2 and x.shape[0] <= self.SMALL_KERNEL_ROWS and \
                x.dtype == torch.float32:
            return self.small_kernel(x.contiguous(), self.small_packed, self.bias, _ACT[self.post_op], self.out_features)
        if self.packed is None or x.numel() < self.small_rows * self.in_features:
            y = F.linear(x, self.weight, self.bias)
            return y if self.post_op == "none" else _POST_FN[self.post_op](y)
        return torch.ops.mkldnn._linear_pointwise.default(x, self.packed, self.bias, self.post_op, [], "")

    def row_top(self, x: Tensor, num: int, skip: int, bias: Tensor | None) -> tuple[Tensor, Tensor] | None:
        """An output layer's product and the search's log-softmax + top-k in one native call, the (M, N)
        logits never written (``head_top_log_softmax``, ``head_top.cpp``): x (M, E) -> each row's
        ``num`` best log-probs and columns (M, num), column ``skip`` banned; ``bias`` (N,) added to the
        logits. None where that kernel does not take x (no native kernels, too many rows, not float32)
        or does not pay (fewer than ``FUSED_MIN_OUTPUTS`` outputs)."""
        if self.top_kernel is None or x.dim() != 2 or x.shape[0] > self.SMALL_KERNEL_ROWS or \
                x.dtype != torch.float32 or self.out_features < self.FUSED_MIN_OUTPUTS:
            return None
        if bias is None:
            bias = self.bias
        elif self.bias is not None:
            bias = bias + self.bias
        return self.top_kernel(x.contiguous(), self.small_packed, bias, min(num, self.out_features), skip,
                               self.out_features)
