"""The CPU's instruction set as decoding will use it, detected once per process (``detect``).

Three sources, the most limiting wins, so an emulated CPU reads as the CPU it emulates:

* ATen's kernel dispatch, ``torch.backends.cpu.get_cpu_capability()`` ("AVX512", "AVX2", "DEFAULT",
  ...), which honours ``ATEN_CPU_CAPABILITY``;
* oneDNN's ceiling, ``ONEDNN_MAX_CPU_ISA`` (e.g. ``AVX2``, ``AVX512_CORE_BF16``), which limits the
  linear layers' GEMMs and their bf16 support;
* the CPU's flags in ``/proc/cpuinfo`` (x86 Linux; elsewhere only the two above).

An AVX2-only CPU (AMD Zen 2/3, Intel before Skylake-SP) is emulated on an AVX-512 one with
``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 RAYMT_NATIVE_MARCH=x86-64-v3``.

What follows from it: whether bfloat16 decoding runs here (``bf16_refusal``: oneDNN's bf16 GEMMs
need AVX512-BW/VL/DQ or AVX-NE-CONVERT; ``--bf16`` is refused elsewhere, never silently widened),
which ``-march`` the native operators are built for (``workers/kernels/native.py``) and the theoretical
float32 peak the benchmarks report their share of (``fp32_flops_per_cycle``).
"""
from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass

import torch

# oneDNN's ONEDNN_MAX_CPU_ISA values, lowest first (aliases of one level share its rank)
_ONEDNN_ORDER = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
                 "AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16", "AVX10_1_512_AMX", "AVX512_CORE_AMX",
                 "AVX10_1_512_AMX_FP16", "AVX512_CORE_AMX_FP16", "ALL", "DEFAULT")
_AVX512_FLAGS = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})
_AVX2_FLAGS = frozenset({"avx2", "fma", "f16c"})


class IsaUnsupported(RuntimeError):
    """A precision or kernel this CPU (or the ISA it is limited to) cannot run."""


@dataclass(frozen=True, slots=True)
class CpuIsa:
    """What this process's CPU kernels may use. ``level``: "avx512", "avx2" or "portable"."""

    machine: str  # platform.machine(): x86_64, aarch64, ...
    aten: str  # ATen's dispatch capability
    onednn_max: str  # ONEDNN_MAX_CPU_ISA as set ("" where unset)
    flags: frozenset[str]  # /proc/cpuinfo flags (empty where unreadable or not x86)
    onednn_bf16: bool  # oneDNN's bf16 GEMMs run here (torch's own check, which honours ONEDNN_MAX_CPU_ISA)

    @property
    def x86(self) -> bool:
        return self.machine.lower() in ("x86_64", "amd64", "i686", "i386")

    @property
    def level(self) -> str:
        if not self.x86:
            return "portable"
        flags_known = bool(self.flags)
        onednn_avx512 = not self.onednn_max or _rank(self.onednn_max) >= _rank("AVX512_CORE")
        if self.aten == "AVX512" and onednn_avx512 and (not flags_known or _AVX512_FLAGS <= self.flags):
            return "avx512"
        onednn_avx2 = not self.onednn_max or _rank(self.onednn_max) >= _rank("AVX2")
        if self.aten in ("AVX512", "AVX2") and onednn_avx2 and (not flags_known or _AVX2_FLAGS <= self.flags):
            return "avx2"
        return "portable"

    @property
    def onednn_amx(self) -> bool:
        """oneDNN may run its AMX kernels here: ``ONEDNN_MAX_CPU_ISA`` unset or at an AMX level (the
        tiles themselves are the hardware's: ``speedups.amx_int8`` asks torch)."""
        return not self.onednn_max or _rank(self.onednn_max) >= _rank("AVX10_1_512_AMX")

    @property
    def bf16(self) -> bool:
        """bfloat16 decoding runs here: oneDNN's bf16 GEMMs (AVX512-BW/VL/DQ or AVX-NE-CONVERT)."""
        return self.onednn_bf16

    @property
    def int8_dot(self) -> bool:
        """The CPU has an int8 dot-product unit the int8 kernels use (AVX512-VNNI, AMX): without one
        (AVX2) an int8 product runs on ``vpmaddubsw`` + ``vpmaddwd``, at most ~2x a float32 one."""
        return bool({"avx512_vnni", "amx_int8"} & self.flags)

    def fp32_flops_per_cycle(self, fma_units: int = 2) -> int:
        """Float32 FLOPs per cycle per core at this level: FMA units x lanes x 2 (a multiply-add is 2).
        Two FMA units (most server cores since Haswell; Zen 4 runs AVX-512 on 256-bit halves, so its
        AVX-512 rate is the AVX2 one); ``fma_units=1`` for single-unit parts."""
        lanes = {"avx512": 16, "avx2": 8}.get(self.level, 4)
        return fma_units * lanes * 2

    def describe(self) -> str:
        limits = f", ONEDNN_MAX_CPU_ISA={self.onednn_max}" if self.onednn_max else ""
        return f"{self.machine} {self.level} (ATen {self.aten}{limits}; bf16 {'yes' if self.bf16 else 'no'})"


def _rank(name: str) -> int:
    name = name.upper()
    return _ONEDNN_ORDER.index(name) if name in _ONEDNN_ORDER else len(_ONEDNN_ORDER)


def cpu_flags() -> frozenset[str]:
    """The first processor's ``flags`` line of /proc/cpuinfo; empty where there is none."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def _onednn_bf16() -> bool:
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    try:
        return bool(torch.backends.mkldnn.is_available() and check is not None and check())
    except RuntimeError:
        return False


@functools.cache
def detect() -> CpuIsa:
    """This process's ISA, read once (the environment variables are read by torch at start-up too)."""
    return CpuIsa(machine=platform.machine(), aten=torch.backends.cpu.get_cpu_capability(),
                  onednn_max=os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper(),
                  flags=cpu_flags(), onednn_bf16=_onednn_bf16())


def bf16_refusal(isa: CpuIsa) -> str | None:
    """Why bfloat16 decoding cannot run on this CPU (one line), or None where it can."""
    if isa.bf16:
        return None
    return (f"--bf16 needs a CPU with bfloat16 GEMMs (AVX512-BW/VL/DQ or AVX-NE-CONVERT); this one is "
            f"{isa.describe()}: decode in float32 (the default) or with --int8")


def require_bf16(isa: CpuIsa | None = None) -> None:
    """Raise ``IsaUnsupported`` (one line) where bfloat16 decoding cannot run; before any work."""
    reason = bf16_refusal(isa or detect())
    if reason:
        raise IsaUnsupported(reason)


def cpu_ghz() -> tuple[float, str]:
    """The clock the theoretical peak is computed at, and where it was read: cpufreq's maximum
    (the boost clock) where the kernel exposes it, else /proc/cpuinfo's ``cpu MHz`` (under a
    hypervisor often the nominal clock, below the boost clock the cores run at); (0.0, "") if neither."""
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq") as f:
            return int(f.read().strip()) / 1e6, "cpufreq cpuinfo_max_freq"
    except (OSError, ValueError):
        pass
    try:
        with open("/proc/cpuinfo") as f:
            mhz = [float(line.split(":", 1)[1]) for line in f if line.startswith("cpu MHz")]
        if mhz:
            return max(mhz) / 1e3, "/proc/cpuinfo cpu MHz"
    except (OSError, ValueError):
        pass
    return 0.0, ""


def theoretical_peak_gflops(cores: int, isa: CpuIsa | None = None, fma_units: int = 2) -> tuple[float, str]:
    """cores x GHz x float32 FLOPs per cycle (``fp32_flops_per_cycle``), and how it was computed."""
    isa = isa or detect()
    ghz, source = cpu_ghz()
    per_cycle = isa.fp32_flops_per_cycle(fma_units)
    how = (f"{cores} cores x {ghz:.3f} GHz ({source or 'unknown'}) x {per_cycle} FLOP/cycle "
           f"({isa.level}, {fma_units} FMA units)")
    return cores * ghz * per_cycle, how
