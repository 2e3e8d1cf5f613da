"""What a translate job would run with on this machine, without running one.

    raymt info                                  # device, ISA, kernels, threads
    raymt info --model models/demo-de-en        # and the model's basics and the search a job runs it with
    raymt info --build                          # build the native operators now where the first use would

Kernels: ``native`` (the fused C++ decode operators: the installed build, a first-use build cached
earlier, or one to be built on first use), ``ATen`` (no native operators here: several times slower),
``Triton`` (a GPU decoder). The command loads an installed or cached build to check it loads; it builds
only with ``--build``. A job's summary line says which kernels its decoders ran.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys

import torch

from raymt.workers.decoder.decode_config import DEFAULTS

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raymt info", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a model directory, fsspec URL or hub id: its basics and the search a job runs")
    p.add_argument("--threads", type=int, default=DEFAULTS.runtime.threads,
                   help="as raymt translate --threads (0: its default)")
    p.add_argument("--build", action="store_true", help="build the native operators now where no build is "
                   "installed or cached (as a job's first unit would)")
    return p


def environment_lines() -> list[str]:
    import raymt
    return [f"raymt {raymt.__version__} ({os.path.dirname(raymt.__file__)})",
            f"torch {torch.__version__}, Python {platform.python_version()}, {platform.machine()}"]


def device_lines() -> list[str]:
    from raymt.workers.kernels.isa import detect
    from raymt.workers.kernels.native import build_target

    isa = detect()
    lines = [f"device: cpu ({os.cpu_count()} cores); ISA {isa.describe()}; native target {build_target(isa)}"]
    if torch.cuda.is_available():
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        lines.append(f"gpu: {names} (jobs decode there with --device cuda or --gpus-per-decoder)")
    else:
        lines.append("gpu: none (CPU decoding)")
    return lines


def kernel_lines(build: bool) -> list[str]:
    """The CPU decoder's kernels (and the GPU's, where there is one); loads only what is already built."""
    from raymt.workers.kernels import native

    if build or not native.plan().startswith("native (built on first use"):
        native.load()  # an installed or cached build is loaded (checked); a build only with --build
    lines = [f"kernels (cpu): {native.plan()}"]
    manifest = native.installed_manifest()
    if manifest is None:
        lines.append("installed builds: none (an editable install or a source checkout: built on first use)")
    else:
        built = ", ".join(manifest.get("libraries", {})) or "none"
        lines.append(f"installed builds: {built} (for torch {manifest.get('torch')}, Python {manifest.get('python')})")
    if torch.cuda.is_available():
        from raymt.workers.kernels.triton_ops import available
        lines.append(f"kernels (gpu): {'Triton' if available() else 'ATen (Triton is not installed: pip install raymt[gpu])'}")
    return lines


def thread_lines(threads: int) -> list[str]:
    if threads:
        return [f"threads: {threads} per decoder (--threads)"]
    from raymt.pipeline.orchestration.settings import ACTOR_THREADS

    line = f"threads: {os.cpu_count() or 1} in this process (a small job, --in-process: all cores), {ACTOR_THREADS} " \
           "per decoder actor on Ray (--threads)"
    return [line]


def model_lines(model: str) -> list[str]:
    """The model's basics (``config.json``) and the search ``raymt translate --model`` runs it with."""
    from raymt.jobs import translate as job
    from raymt.pipeline.storage import model_reader

    try:
        config = json.loads(model_reader(job.model_arg(model))("config.json") or b"{}")
    except (OSError, ValueError) as e:
        return [f"model: {model}: cannot be read ({e})"]
    keys = ("model_type", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "vocab_size")
    lines = [f"model: {model}: " + ", ".join(f"{k} {config[k]}" for k in keys if k in config)]
    args = job.build_parser().parse_args(["--model", model, "--input", "-", "--output", "-"])
    try:
        generation = job.model_generation(args)  # the model's own generation defaults (M2M100 / NLLB), else None
        search = job.search_config(args, generation)
    except ValueError as e:  # (UnsupportedGeneration too: the job refuses the model in this line)
        return [*lines, f"search: refused: {e}"]
    source = "the model's generation defaults" if generation is not None else "the product's defaults"
    target = f"; target language {args.target_lang}" if args.target_lang else ""
    return [*lines, f"search: {search.signature()} ({source}, flags win){target}"]


def info_lines(args: argparse.Namespace) -> list[str]:
    lines = [*environment_lines(), *device_lines(), *kernel_lines(args.build), *thread_lines(args.threads)]
    return [*lines, *model_lines(args.model)] if args.model else lines


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(message)s")
    print("\n".join(info_lines(args)))


if __name__ == "__main__":
    main(sys.argv[1:])
