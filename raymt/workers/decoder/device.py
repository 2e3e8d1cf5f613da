"""The device a decoder runs on, decided once: CLI ``--device`` -> ``DecoderSettings.device`` ->
``resolve_device`` -> ``CoreDecoder.load(device=)`` -> ``load_checkpoint(device=)``. Nothing below
asks again: every tensor a decode creates follows the model's device (``MarianModel.device``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

DEVICES = ("auto", "cpu", "cuda", "cuda:N")


@dataclass(frozen=True, slots=True)
class BatchingDefaults:
    """What a decoder runs with where the command line leaves it open, per kind of device.

    * CPU: 32 sentences, the dynamic step, top-up refilling at half empty (measured:
      ``docs/results/policies.md``, ``docs/results/tuning-multi30k.md``).
    * GPU: a static step costs the same at any occupancy, so throughput is live slots ÷ slots. The
      scheduler alone gives that occupancy (``python -m benchmarks.bench_occupancy``, ``docs/results/occupancy.md``:
      1024 slots, 50,000 sentences, top-up): refilling at 5% empty instead of half raises it from
      0.70 to 0.97 on Multi30k's lengths and from 0.67 to 0.87 on WMT22's (0.89 / 0.84 with the
      readback every 4 steps, when slots free), read back every 4 steps so the host runs ahead of the
      device. 256 slots (fitted to free memory per call, ``CoreDecoder``): timed on an H200
      (``docs/results/gpu-h200-2026-11-27.md``, slot sweep), the static step at 256 slots beat it at
      1,024 by 1.67x (base-de-en, WMT22), 1.25x (demo model, WMT22), 1.21x (base-de-en, Multi30k) and
      lost 0.95x (demo model, Multi30k): past ~1,300 rows a step the GPU is full, and more slots
      only lengthen every step of the tail. Check with ``python -m benchmarks.bench_gpu --capacities``.
    """

    max_batch_size: int  # slots, in sentences
    static_step: int  # the static step's readback interval (0: the dynamic step)
    refill_threshold: float  # top-up: refill once this share of the slots is empty


CPU_DEFAULTS = BatchingDefaults(max_batch_size=32, static_step=0, refill_threshold=0.5)
# int8 on AMX tiles: oneDNN's int8 products grow slower with rows than FBGEMM's (1 thread, 512 x 2048:
# 411 us at 115 rows, 686 at 320; FBGEMM 699 and 1740), so twice the sentences a step pay. Measured
# on a 2-core AMX Xeon, base-de-en, 256 Multi30k lines, beam 5, 1 thread, 4 interleaved rounds:
# 696 against 545 target tokens/s (1.28x); float32 at 64 against 32: 257 against 262 (no gain).
CPU_INT8_AMX_DEFAULTS = BatchingDefaults(max_batch_size=64, static_step=0, refill_threshold=0.5)
GPU_DEFAULTS = BatchingDefaults(max_batch_size=256, static_step=4, refill_threshold=0.05)


def batching_defaults_for(on_gpu: bool, precision: str = "float32") -> BatchingDefaults:
    """The defaults where decoders decode: a GPU's; on the CPU, int8 where it runs on AMX tiles
    (``speedups.amx_int8``) takes larger batches; everything else the CPU's."""
    if on_gpu:
        return GPU_DEFAULTS
    if precision == "int8":
        from raymt.workers.kernels.speedups import amx_int8  # (speedups imports the native kernels' loader)

        if amx_int8():
            return CPU_INT8_AMX_DEFAULTS
    return CPU_DEFAULTS


def on_gpu(device: str, gpus_per_decoder: float = 0) -> bool:
    """Whether decoders given ``--device`` ``device`` and that many GPUs each decode on a GPU
    (``auto`` on a GPU Ray reserves is one; ``auto`` elsewhere is decided where it decodes)."""
    return device.startswith("cuda") or (device == "auto" and gpus_per_decoder > 0)


class DeviceUnavailable(RuntimeError):
    """The asked-for device is not here; decoding never falls back to the CPU silently."""


def resolve_device(name: str) -> torch.device:
    """``auto``: the first CUDA device when torch sees one, else the CPU; ``cpu``; ``cuda`` /
    ``cuda:N``: that GPU, which must exist."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ValueError(f"--device {name!r}: expected one of {', '.join(DEVICES)}") from e
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ValueError(f"--device {name!r}: expected one of {', '.join(DEVICES)}")
    if not torch.cuda.is_available():
        raise DeviceUnavailable(f"--device {name}: torch sees no CUDA device here (torch {torch.__version__}, "
                                f"built for CUDA {torch.version.cuda or 'none'}); refusing to decode on the CPU instead")
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise DeviceUnavailable(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) here")
    return device
