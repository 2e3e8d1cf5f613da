"""The CPU's ISA (workers/kernels/isa.py), the native build's target per ISA (workers/kernels/native.py) and the
bf16 refusal on CPUs without bf16 GEMMs, including an AVX2-only CPU emulated on this one."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from raymt.workers.kernels.isa import CpuIsa, bf16_refusal, detect, theoretical_peak_gflops
from raymt.workers.kernels.native import build_target

AVX512 = frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq"})
AVX2 = frozenset({"avx2", "fma", "f16c"})
AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "RAYMT_NATIVE_MARCH": "x86-64-v3"}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
needs_avx2 = pytest.mark.skipif(detect().level == "portable" or "avx2" not in detect().flags,
                                reason=f"emulating AVX2 needs an x86 CPU with AVX2: {detect().describe()}")


def isa(aten: str = "AVX512", onednn_max: str = "", flags: frozenset[str] = AVX512, machine: str = "x86_64",
        bf16: bool = False) -> CpuIsa:
    return CpuIsa(machine=machine, aten=aten, onednn_max=onednn_max, flags=flags, onednn_bf16=bf16)


@pytest.mark.parametrize("cpu, level, target, flops", [
    (isa(), "avx512", "x86-64-v4", 64),
    (isa(onednn_max="AVX2"), "avx2", "x86-64-v3", 32),  # the emulation: oneDNN capped
    (isa(aten="AVX2"), "avx2", "x86-64-v3", 32),  # ATEN_CPU_CAPABILITY=avx2
    (isa(onednn_max="avx512_core_bf16"), "avx512", "x86-64-v4", 64),
    (isa(aten="AVX2", flags=AVX2), "avx2", "x86-64-v3", 32),  # Zen 2/3
    (isa(flags=AVX2), "avx2", "x86-64-v3", 32),  # ATen says AVX512, the flags do not
    (isa(flags=frozenset()), "avx512", "x86-64-v4", 64),  # no /proc/cpuinfo: ATen decides
    (isa(aten="DEFAULT", flags=frozenset()), "portable", "portable", 16),
    (isa(onednn_max="SSE41"), "portable", "portable", 16),
    (isa(aten="DEFAULT", machine="aarch64", flags=frozenset({"asimd"})), "portable", "portable", 16),
])
def test_level_native_target_and_peak_per_cycle(cpu: CpuIsa, level: str, target: str, flops: int) -> None:
    assert cpu.level == level
    assert build_target(cpu, forced="") == target
    assert cpu.fp32_flops_per_cycle() == flops and cpu.fp32_flops_per_cycle(fma_units=1) == flops // 2


@pytest.mark.parametrize("forced, want", [("x86-64-v3", "x86-64-v3"), ("portable", "portable"),
                                          ("x86-64-v4", "x86-64-v4"), ("native", "x86-64-v4")])
def test_native_march_forced_down_never_up(forced: str, want: str) -> None:
    assert build_target(isa(), forced=forced) == want
    assert build_target(isa(aten="AVX2", flags=AVX2), forced="x86-64-v4") == "x86-64-v3"  # would fault: refused


def test_bf16_refusal_names_the_cpu_and_the_alternatives() -> None:
    assert bf16_refusal(isa(bf16=True)) is None
    reason = bf16_refusal(isa(onednn_max="AVX2"))
    assert reason is not None and "\n" not in reason
    assert "--bf16 needs" in reason and "avx2" in reason and "--int8" in reason


def test_theoretical_peak_is_cores_times_clock_times_flops_per_cycle() -> None:
    peak, how = theoretical_peak_gflops(2, isa())
    assert "2 cores" in how and "64 FLOP/cycle" in how
    ghz = float(how.split(" x ")[1].split()[0])
    assert peak == pytest.approx(2 * ghz * 64, rel=1e-3)


def run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@needs_avx2
def test_emulated_avx2_cpu_reads_as_avx2_without_bf16() -> None:
    code = ("from raymt.workers.kernels.isa import detect; from raymt.workers.kernels.native import build_target;"
            "from raymt.workers.kernels.speedups import amx_int8;"
            "i = detect(); print(i.level, i.bf16, build_target(), amx_int8())")
    out = run_python(code, AVX2_ENV)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["avx2", "False", "x86-64-v3", "False"]  # (oneDNN held below its AMX kernels)


@pytest.mark.parametrize("onednn_max, amx", [("", True), ("AVX2", False), ("AVX512_CORE_BF16", False),
                                             ("AVX512_CORE_FP16", False), ("AVX512_CORE_AMX", True), ("ALL", True)])
def test_onednn_held_below_amx_reads_as_no_amx(onednn_max: str, amx: bool) -> None:
    assert isa(onednn_max=onednn_max).onednn_amx is amx


@needs_avx2
def test_cli_refuses_bf16_in_one_line_before_any_work_on_an_avx2_cpu(tmp_path, demo_model_dir) -> None:
    source = tmp_path / "in.txt"
    source.write_text("Ein Hund läuft.\n")
    output = tmp_path / "out"
    out = subprocess.run([sys.executable, "-m", "raymt.jobs.translate", "--model", str(demo_model_dir), "--input",
                          str(source), "--output", str(output) + "/", "--in-process", "--bf16"],
                         env={**os.environ, **AVX2_ENV}, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-1].startswith("error: --bf16 needs a CPU with bfloat16 GEMMs")
    assert "Traceback" not in out.stderr and not output.exists()


@needs_avx2
def test_int8_translates_on_an_avx2_cpu(demo_model_dir) -> None:
    code = ("from raymt.workers.decoder.core_decoder import CoreDecoder; from raymt.workers.kernels.speedups import EXACT, Int8Linear;"
            "from raymt.workers.config import SearchConfig; from dataclasses import replace;"
            f"t = CoreDecoder.load({str(demo_model_dir)!r}, speedups=replace(EXACT, int8=True));"
            "assert isinstance(t.checkpoint.model.vocab_head, Int8Linear);"
            "print(t.translate(['Ein Hund läuft über die Wiese.'], SearchConfig(beam_size=2))[0].text)")
    out = run_python(code, AVX2_ENV)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.strip().split()) >= 3  # a sentence, not an empty or one-token output


def test_an_int8_dot_product_unit_is_read_from_the_flags() -> None:
    """VNNI or AMX: int8 decoders keep their int8 output layer (``speedups``); AVX2 alone has none."""
    assert not isa(aten="AVX2", flags=AVX2).int8_dot
    assert not isa(flags=AVX512).int8_dot
    assert isa(flags=AVX512 | {"avx512_vnni"}).int8_dot and isa(flags=AVX512 | {"amx_int8"}).int8_dot
