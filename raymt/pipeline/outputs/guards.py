"""Output paths refused before any work: a job never writes over, into or around what it reads,
never scatters its files over a filesystem root or the current directory, and says in one line
when it cannot write where it was asked to.

    check_output(input, parts, final, model)   # paths; parts: the directory of parts; final: the assembled file
    check_owned(parts, final, overwrite)       # an existing file or folder there is raymt's own, or refused
    check_writable(parts, final)               # after planning: files can be created there
    check_output_format(final, nbest)          # the assembled file's format, or refused naming the supported ones

A job writes only where it owns what is there: an existing ``--output`` file is replaced only
when the record its parts folder keeps (``_ASSEMBLED.json``: path, size, content digest or ETag)
says raymt assembled exactly that file, and an existing non-empty folder is written into only when
it holds raymt's records (a plan, markers, parts); anything else is refused in one line unless the
user asks with ``--overwrite`` (a folder's own files are kept even then).

Local paths are compared resolved (symlinks, ``..``, relative to the working directory); URLs of
object stores by bucket and key.
"""
from __future__ import annotations

import json
import os
import uuid

import fsspec

from raymt.pipeline.formats import OutputFormat, UnsupportedOutput, output_format
from raymt.pipeline.outputs.lease import LEASE, LOCK
from raymt.pipeline.outputs.ledger import ASSEMBLED, PLAN, assembled_record
from raymt.pipeline.storage import on_disk, storage_options


class OutputRefused(ValueError):
    """``--output`` names a place this job must not write; raised before any work."""


def _resolved(url: str) -> tuple[str, str, object]:
    """(protocol, normalised path, filesystem) of ``url``."""
    fs, path = fsspec.core.url_to_fs(url, **storage_options(url))
    if on_disk(fs):
        return "file", os.path.realpath(path), fs
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol, path.strip("/"), fs


def _within(inner: str, outer: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def output_problems(input_url: str, output_url: str) -> list[str]:
    """What is wrong with writing ``output_url`` for a job reading ``input_url`` (none: empty)."""
    proto_in, inp, fs_in = _resolved(input_url)
    proto_out, out, _ = _resolved(output_url)
    problems = []
    if proto_out == "file" and (out == os.path.dirname(out) or out == os.path.realpath(os.getcwd())
                                or out == os.path.realpath(os.path.expanduser("~"))):
        where = "a filesystem root" if out == os.path.dirname(out) else "the current directory" \
            if out == os.path.realpath(os.getcwd()) else "the home directory"
        problems.append(f"--output {output_url} is {where}: the job's parts, markers and (with --restart) their "
                        f"removal would land among files it does not own; name a directory of its own")
    elif proto_out != "file" and "/" not in out:
        problems.append(f"--output {output_url} is a bucket's root: name a prefix of its own (e.g. "
                        f"{output_url.rstrip('/')}/translations/)")
    if proto_in == proto_out:
        if inp == out:
            problems.append(f"--output {output_url} is the --input itself: the job would overwrite what it reads")
        elif _within(out, inp) and fs_in.isdir(inp if proto_in == "file" else input_url):
            problems.append(f"--output {output_url} is inside the --input directory {input_url}: its parts would "
                            f"be read as input; write the output elsewhere")
        elif _within(inp, out):
            problems.append(f"--output {output_url} contains the --input {input_url}: the job would write among "
                            f"(and --restart would clear) the files it reads; write the output elsewhere")
    return problems


def check_output(input_url: str, parts_url: str, final_url: str | None = None, model_url: str | None = None) -> None:
    """Raise ``OutputRefused`` (one message, every problem) unless this job may write ``parts_url``
    (and assemble ``final_url``) apart from its input and model."""
    problems = []
    for url in (parts_url, final_url) if final_url is not None else (parts_url,):
        problems += [p for p in output_problems(input_url, url) if p not in problems]
        if model_url is not None:
            problems += [p.replace("--input", "--model") for p in output_problems(model_url, url)[-1:]
                         if "--input" in p and p.replace("--input", "--model") not in problems]
    if problems:
        raise OutputRefused("; ".join(problems))


def check_owned(parts_url: str, final_url: str | None = None, overwrite: bool = False) -> None:
    """Raise ``OutputRefused`` in one line where the job would replace or write among files raymt did
    not write: an existing ``final_url`` that the parts folder's ``_ASSEMBLED.json`` does not name as
    the file it assembled (same path, size and content), or an existing non-empty ``parts_url``
    folder holding no raymt record. ``overwrite``: the user asked for it; nothing is checked."""
    if overwrite:
        return
    fs, root = fsspec.core.url_to_fs(parts_url, **storage_options(parts_url))
    if final_url is not None:
        ffs, fpath = fsspec.core.url_to_fs(final_url, **storage_options(final_url))
        if ffs.exists(fpath) and not ffs.isdir(fpath) and not _assembled_here(fs, root, final_url):
            raise OutputRefused(f"--output {final_url} exists and raymt did not write it (no record in "
                                f"{parts_url} names it): pass --overwrite to replace it, or choose another --output")
    if not fs.isdir(root):
        return
    names = [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False)]
    ours = (PLAN, "_SUCCESS", "_manifest", ASSEMBLED, LEASE)  # (a lease alone: a job that stopped before its plan)
    theirs = sorted(n for n in names if not n.startswith((".", LOCK, "_WRITABLE-")) and n not in ours)
    if theirs and not any(n in ours or n.startswith("part-") for n in names):
        shown = ", ".join(theirs[:3]) + (", ..." if len(theirs) > 3 else "")
        raise OutputRefused(f"--output {parts_url} is a folder holding {len(theirs)} file(s) raymt did not write "
                            f"({shown}) and no raymt output: choose a new or empty folder, or pass --overwrite to "
                            f"write among them (they are kept)")


def _assembled_here(fs, root: str, final_url: str) -> bool:
    """Whether the parts folder's record names ``final_url`` as it is now (raymt assembled it)."""
    try:
        recorded = json.loads(fs.cat(f"{root.rstrip('/')}/{ASSEMBLED}"))
    except (OSError, ValueError):
        return False
    return recorded == assembled_record(final_url)


def check_output_format(final_url: str, nbest: int = 1, text_name: str = "text") -> OutputFormat:
    """The format the assembled ``final_url`` is written in (``pipeline/formats.py``), or ``OutputRefused``
    in one line listing the supported ones: a name that asks for a format the job does not write (e.g.
    ``.csv``) is refused, never written as something else."""
    try:
        return output_format(final_url, nbest, text_name)
    except UnsupportedOutput as e:
        raise OutputRefused(str(e)) from None


def check_writable(parts_url: str, final_url: str | None = None) -> None:
    """Raise ``OutputRefused`` in one line unless files can be created where the job writes (local disk;
    made after the input is planned, so a job refused for its input leaves no directory behind)."""
    for url in (parts_url,) + ((final_url.rsplit("/", 1)[0] or "/",) if final_url and "/" in final_url else ()):
        if problem := _unwritable(url):
            raise OutputRefused(problem)


def _unwritable(url: str) -> str | None:
    """Why a file cannot be created in the directory ``url`` (local disk; None: it can, or a store)."""
    fs, path = fsspec.core.url_to_fs(url, **storage_options(url))
    if not on_disk(fs):
        return None  # an object store answers the lease's first write; its refusal is reported there
    probe = os.path.join(path, f"_WRITABLE-{uuid.uuid4().hex}.tmp")
    try:
        os.makedirs(path, exist_ok=True)
        with open(probe, "wb"):
            pass
        os.remove(probe)
    except NotADirectoryError:
        blocking = next((p for p in _ancestors(path) if os.path.exists(p) and not os.path.isdir(p)), path)
        return f"cannot write --output {url}: {blocking} is a file, not a directory (ENOTDIR); choose another place"
    except OSError as e:
        return f"cannot write --output {url}: {e.strerror or e} (errno {e.errno}); choose a writable place"
    return None


def _ancestors(path: str) -> list[str]:
    """``path`` and the folders above it, outermost first."""
    parts = os.path.abspath(path).split(os.sep)
    return [os.sep.join(parts[:i]) or os.sep for i in range(2, len(parts) + 1)]
