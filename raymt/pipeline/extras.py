"""Optional packages and the extra that installs each: a missing one is named in one line.

The core installs what translating local files on the CPU needs. The rest comes with extras::

    pip install 'raymt[s3]'      s3fs         s3:// models, inputs and outputs
    pip install 'raymt[align]'   eflomal      shortlists built from a bitext's alignments
    pip install 'raymt[plots]'   matplotlib   the stats report (--report, raymt report)
    pip install 'raymt[gpu]'     triton       the GPU step's fused kernels
"""
from __future__ import annotations

import importlib
from types import ModuleType

PROTOCOLS = {  # URL scheme -> (module fsspec needs for it, extra that installs it)
    "s3": ("s3fs", "s3"),
    "s3a": ("s3fs", "s3"),
}


class MissingExtra(ImportError):
    """An optional package a feature needs is not installed; the message says which extra brings it."""


def require(module: str, extra: str, what: str) -> ModuleType:
    """``module`` imported, or MissingExtra: '<what> needs <module>: pip install 'raymt[<extra>]''."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(f"{what} needs {module.split('.')[0]}: pip install 'raymt[{extra}]'") from None


def require_for_url(url: str) -> None:
    """Checks that the package fsspec needs for ``url``'s scheme is installed (local paths need none)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in PROTOCOLS:
        module, extra = PROTOCOLS[scheme]
        require(module, extra, f"reading {scheme}://")
