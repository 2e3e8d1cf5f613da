"""What a GPU machine without ``../shared`` needs, prepared in ``data-gpu/`` (git-ignored; copied to
the GPU machine with the checkout, kept under 64 MiB):

    python -m benchmarks.gpu_data [--shared ../shared] [--out data-gpu]

* the test sets the check and the bench read (Multi30k test 2016, WMT22 de-en);
* ``base-de-en.int8/``: ``../shared/models/base-de-en`` with every matrix stored as int8 rows and
  one float32 scale a row (half the size of its float16 weights: the folder stays under 64 MiB);
  ``unpack_model`` writes the float16 directory back on the GPU machine. The model's weights were
  int8 rows to begin with (its README), so the round trip changes a weight by at most float16's
  rounding;
* ``lex.s2t``: a word-alignment shortlist from Multi30k train for the long mode's search table,
  built only where eflomal is installed.
"""
from __future__ import annotations

import argparse
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

logger = logging.getLogger(__name__)

TEST_SETS = ("multi30k/test_2016_flickr.de", "multi30k/test_2016_flickr.en",
             "wmt22/generaltest2022.de-en.src.de", "wmt22/generaltest2022.de-en.ref.A.en")
PACKED = "weights.int8.safetensors"
SCALE = ".row_scale"  # the suffix of a matrix's per-row scales


def pack_model(source: Path, target: Path) -> None:
    """A Marian directory -> the same with ``model.safetensors`` as int8 rows plus a scale a row."""
    target.mkdir(parents=True, exist_ok=True)
    packed = {}
    for name, w in load_file(str(source / "model.safetensors")).items():
        if w.dim() != 2:
            packed[name] = w
            continue
        scale = w.float().abs().amax(dim=1).clamp_min(1e-12) / 127  # (rows,)
        packed[name] = torch.round(w.float() / scale[:, None]).to(torch.int8)  # (rows, cols)
        packed[name + SCALE] = scale
    save_file(packed, str(target / PACKED), metadata={"format": "pt"})
    for f in source.iterdir():
        if f.name != "model.safetensors" and f.is_file():
            shutil.copy(f, target / f.name)


def unpack_model(packed_dir: Path, target: Path) -> Path:
    """``pack_model``'s directory -> a float16 Marian directory at ``target`` (returned)."""
    target.mkdir(parents=True, exist_ok=True)
    packed = load_file(str(packed_dir / PACKED))
    weights = {name: (w.float() * packed[name + SCALE][:, None] if name + SCALE in packed else w).to(torch.float16)
               for name, w in packed.items() if not name.endswith(SCALE)}
    save_file(weights, str(target / "model.safetensors"), metadata={"format": "pt"})
    for f in packed_dir.iterdir():
        if f.name != PACKED and f.is_file():
            shutil.copy(f, target / f.name)
    return target


def build_shortlist(shared: Path, out: Path) -> None:
    """``out/lex.s2t`` from Multi30k train with eflomal (skipped, with a line, where it is missing)."""
    if (out / "lex.s2t").exists():
        return
    try:
        import eflomal  # noqa: F401
    except ImportError:
        logger.warning("eflomal is not installed: no lex.s2t (the long mode's search table runs pruning only)")
        return
    train = shared / "data" / "multi30k"
    subprocess.run([sys.executable, "-m", "raymt.jobs.build_shortlist", "--model", "models/demo-de-en",
                    "--source", str(train / "train.de"), "--target", str(train / "train.en"),
                    "--output", str(out / "lex.s2t")], check=True)


def prepare(shared: Path, out: Path, shortlist: bool = True) -> int:
    """Fill ``out``; returns its size in bytes."""
    for rel in TEST_SETS:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(shared / "data" / rel, out / rel)
    base = shared / "models" / "base-de-en"
    if base.exists():
        pack_model(base, out / "base-de-en.int8")
    if shortlist:
        build_shortlist(shared, out)
    return sum(f.stat().st_size for f in out.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shared", default="../shared", help="holds data/ and models/ as ../shared does")
    p.add_argument("--out", default="data-gpu")
    p.add_argument("--no-shortlist", action="store_true", help="skip lex.s2t (eflomal, about a minute)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    size = prepare(Path(args.shared), Path(args.out), shortlist=not args.no_shortlist)
    print(f"{args.out}: {size / 2**20:.1f} MiB{' (over 64 MiB)' if size > 64 * 2**20 else ''}")


if __name__ == "__main__":
    main()
