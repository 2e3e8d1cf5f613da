"""What an output holds: the job's plan record (the output's lease: ``pipeline/outputs/lease.py``).

``_PLAN.json`` records, once, what the committed units of an output were cut from and how they
were decoded: every input file (path, size, version: mtime or ETag), the columns, the unit size
and the unit count, the search signature and the model's files (a hub model's as
``hf://org/name@<commit>/<file>``: a resume fetches that commit, ``pipeline/hub.py``). A unit's name
(``<file index>-<first row>``) means the same rows only under the same plan, so a rerun whose plan
differs is refused with what differs (``PlanMismatch``), never mixed; ``--restart`` discards the
output's own files and starts afresh.

Who may write an output is the lease's business (``pipeline/outputs/lease.py``).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, replace

import fsspec

from raymt.pipeline.digests import file_digest
from raymt.pipeline.outputs.lease import LEASE, Lease, OutputBusy  # noqa: F401 - re-exported: where callers found them
from raymt.pipeline.storage import file_version, on_disk, storage_options  # noqa: F401 - (file_version re-exported)

PLAN = "_PLAN.json"
ASSEMBLED = "_ASSEMBLED.json"  # in a single-file output's parts folder: the file raymt assembled there
MODEL_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "source.spm", "target.spm", "vocab.json",
               "target_vocab.json", "decoder.yml", "model.npz", "vocab.yml", "vocab.spm",  # (these four: Marian's)
               "sentencepiece.bpe.model", "tokenizer.json")  # (M2M100 / NLLB)


class PlanMismatch(RuntimeError):
    """The output was started by another plan (input, unit size, model or search): resuming would mix them."""




def assembled_record(url: str) -> dict:
    """What names an assembled output file as raymt wrote it: path, size and content (the SHA-256 on
    local disk, the object's ETag on a store); compared with ``_ASSEMBLED.json`` before it is replaced."""
    fs, path = fsspec.core.url_to_fs(url, **storage_options(url))
    if on_disk(fs):
        return {"path": url, "size": os.path.getsize(path), "sha256": file_digest(path)}
    return file_version(url)


def model_files(url: str) -> list[dict]:
    """The versions of a model directory's files (or of one file: a shortlist), each with the SHA-256
    of its content where it is on local disk (``pipeline/digests.py``; an object's ETag is its own)."""
    fs, root = fsspec.core.url_to_fs(url, **storage_options(url))
    if not fs.isdir(root):
        files = [(url, root)]
    else:
        files = [(f"{url.rstrip('/')}/{name}", f"{root.rstrip('/')}/{name}") for name in MODEL_FILES
                 if fs.exists(f"{root.rstrip('/')}/{name}")]
    return [{**file_version(u), **({"sha256": file_digest(p)} if on_disk(fs) else {})} for u, p in files]


def snapshot_files(folder: str, url: str, version: str) -> list[dict]:
    """The files of a local hub snapshot ``folder`` as a plan records them: named under ``url``
    (``hf://org/name@<commit>``), versioned by the commit, pinned by content; the same on every machine,
    whatever the path of its cache (``pipeline/hub.py``)."""
    found = [(name, os.path.join(folder, name)) for name in MODEL_FILES if os.path.isfile(os.path.join(folder, name))]
    return [{"path": f"{url}/{name}", "size": os.path.getsize(p), "version": version, "sha256": file_digest(p)}
            for name, p in found]


def model_pins(files: tuple[dict, ...] | list[dict], model: str) -> tuple[tuple[str, str], ...]:
    """(file name, SHA-256) of the files of the model directory ``model`` that ``model_files`` hashed:
    what a decoder checks the bytes it loads against."""
    folder = model.rstrip("/")
    return tuple((f["path"][len(folder) + 1:], f["sha256"]) for f in files
                 if "sha256" in f and f["path"].startswith(folder + "/"))


@dataclass(frozen=True, slots=True)
class PlanRecord:
    inputs: tuple[dict, ...]  # file_version of every input file, in plan order
    columns: dict
    unit_rows: int
    units: int
    rows: int
    signature: str
    model: tuple[dict, ...]  # file_version of every model (and shortlist) file

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]

    def to_json(self) -> bytes:
        return json.dumps({**asdict(self), "digest": self.digest}, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes) -> PlanRecord:
        d = json.loads(data)
        d.pop("digest", None)
        return cls(**{**d, "inputs": tuple(d["inputs"]), "model": tuple(d["model"])})

    @property
    def pins_content(self) -> bool:
        """Whether the record holds content checksums (records of older versions pin size and time only)."""
        return any("content" in f for f in self.inputs) or any("sha256" in f for f in self.model)

    def without_content(self) -> PlanRecord:
        """This record as an older version wrote it: no content checksums (to compare with such a record)."""
        strip = lambda files: tuple({k: v for k, v in f.items() if k not in ("content", "sha256")} for f in files)  # noqa: E731
        return replace(self, inputs=strip(self.inputs), model=strip(self.model))

    def differences(self, earlier: PlanRecord) -> list[str]:
        """What changed since ``earlier``, one line each, in words an operator can act on."""
        out = []
        if self.unit_rows != earlier.unit_rows:
            out.append(f"--unit-rows {earlier.unit_rows} then, {self.unit_rows} now")
        if self.signature != earlier.signature:
            out.append(f"search signature {earlier.signature!r} then, {self.signature!r} now")
        if self.columns != earlier.columns:
            out.append(f"columns {earlier.columns} then, {self.columns} now")
        out += _file_changes("input", earlier.inputs, self.inputs)
        before, after = _folders(earlier.model), _folders(self.model)
        out += [f"model files in {', '.join(before)} then, in {', '.join(after)} now"] if before != after \
            else _file_changes("model file", earlier.model, self.model)
        if not out and (self.units, self.rows) != (earlier.units, earlier.rows):
            out.append(f"{earlier.units} units / {earlier.rows} rows then, {self.units} / {self.rows} now")
        return out


def _changed(kind: str, path: str, old: dict, new: dict) -> str:
    if (old["size"], old["version"]) == (new["size"], new["version"]):
        return f"{kind} {path} changed content (same size {new['size']} and version {new['version']}: rewritten in place)"
    return (f"{kind} {path} changed (size {old['size']} -> {new['size']}, version {old['version']} -> "
            f"{new['version']})")


def _folders(files: tuple[dict, ...]) -> list[str]:
    return sorted({f["path"].rsplit("/", 1)[0] for f in files})


def _file_changes(kind: str, old: tuple[dict, ...], new: tuple[dict, ...]) -> list[str]:
    before, after = {f["path"]: f for f in old}, {f["path"]: f for f in new}
    out = [f"{kind} {p} is new" for p in after if p not in before]
    out += [f"{kind} {p} is gone" for p in before if p not in after]
    out += [_changed(kind, p, before[p], after[p]) for p in after if p in before and before[p] != after[p]]
    if not out and [f["path"] for f in old] != [f["path"] for f in new]:
        out.append(f"{kind} order changed")
    return out
