"""The device a decoder runs on, decided once: CLI ``--device`` -> ``DecoderSettings.device`` ->
``resolve_device`` -> ``Translator.load(device=)`` -> ``load_checkpoint(device=)``. Nothing below
asks again: every tensor a decode creates follows the model's device (``MarianModel.device``).
"""
from __future__ import annotations

import torch

DEVICES = ("auto", "cpu", "cuda", "cuda:N")


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
