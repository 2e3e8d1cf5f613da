"""What an input names: the files a job reads, each a regular file, listed before any work.

A file input is itself; a directory (or prefix) input is every corpus file under it, sorted. On
local disk each is checked to be a regular file before anything opens it: a FIFO, socket or device
would be waited on forever (a FIFO with no writer blocks its reader), a symlink loop or a link to
nothing cannot be opened, and a link to a folder is not followed. Each is refused in one line naming
the path, never a hang or a traceback.
"""
from __future__ import annotations

import os
import stat

import fsspec

from raymt.pipeline.errors import InputError, os_error_line
from raymt.pipeline.formats import is_input_file
from raymt.pipeline.storage import on_disk, storage_options


def list_inputs(url: str) -> list[str]:
    """A file, or every ``.parquet`` and ``.txt`` / ``.tsv`` / ``.jsonl`` (plain or compressed) file under a
    directory (sorted), as fsspec URLs.
    Hidden and ``_`` paths under a directory (``.crc``, ``_SUCCESS``, ``_manifest/``) are not input;
    any other file is refused by name, never skipped without a word."""
    fs, path = fsspec.core.url_to_fs(url, **storage_options(url))
    local = on_disk(fs)
    if local:
        check_regular(path, top=True)
    if fs.isdir(path):
        root = path.rstrip("/") + "/"
        visible = [p for p in sorted(fs.find(path))
                   if not any(part.startswith(("_", ".")) for part in p[len(root):].split("/"))]
        for p in visible if local else ():
            check_regular(p)
        files = [p for p in visible if is_input_file(p)]
        if others := [p for p in visible if not is_input_file(p)]:
            raise InputError(f"{url}: a directory input is read for its .parquet, .txt, .tsv, .csv and .jsonl files (plain "
                             f"or .gz / .bz2 / .xz / .zst), and it also holds "
                             f"{len(others)} other file(s), which would not be translated: "
                             f"{', '.join(others[:5])}{' ...' if len(others) > 5 else ''}; move them out (hidden and "
                             f"_ files are ignored) or name the files to translate")
        if not files:
            raise InputError(f"{url}: a directory with no .parquet, .txt, .tsv, .csv or .jsonl files")
    elif fs.exists(path):
        files = [path]
    else:
        raise InputError(f"{url}: no such file or directory")
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return [p if protocol in ("file", "local") else f"{protocol}://{p}" for p in files]


SPECIAL = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
           (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a link to a directory (links to folders are not followed)"))


def check_regular(path: str, top: bool = False) -> None:
    """Refuse, in one line naming the path, what is not a regular file (or, at the ``top``, a
    directory): a FIFO or device would be waited on forever, a symlink loop cannot be opened."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if top or os.path.islink(path):
            what = "a link to nothing" if os.path.islink(path) else "no such file or directory"
            raise InputError(f"{path}: {what}") from None
        return  # gone since it was listed: the plan's own checks say so
    except OSError as e:
        raise InputError(f"{path}: cannot be read as input: {os_error_line(e)}") from None
    if stat.S_ISREG(mode) or (top and stat.S_ISDIR(mode)):
        return
    what = next(name for test, name in SPECIAL if test(mode))
    hint = "; to translate a stream, pipe it to --input -" if not stat.S_ISDIR(mode) else ""
    raise InputError(f"{path}: {what}, not a regular file: refused before any work (reading it could wait "
                     f"forever or never end){hint}")


def check_apart(input_url: str, output_url: str) -> None:
    """Refuse an output inside the input directory: a rerun would read the job's own parts as input."""
    fs, inp = fsspec.core.url_to_fs(input_url, **storage_options(input_url))
    out_fs, out = fsspec.core.url_to_fs(output_url, **storage_options(output_url))
    if type(fs) is type(out_fs) and fs.isdir(inp) and (out.rstrip("/") + "/").startswith(inp.rstrip("/") + "/"):
        raise InputError(f"--output {output_url} is inside the --input directory {input_url}: its parts would be "
                         f"read as input; write the output elsewhere")
