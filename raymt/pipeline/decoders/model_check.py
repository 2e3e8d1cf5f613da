"""The model directory checked in the driver, before Ray starts any actor: every problem at once.

One ``ModelError`` names the directory and every problem found, one line each, instead of an
actor-creation traceback from inside a decoder, an out-of-memory kill, or a late crash. The check
reads only small files and the weights' header, allocates no weights, and takes well under a second:

- ``config.json``: validated as ``raymt.workers.checkpoints.checkpoint.config_from_hf`` loads it, which also bounds every
  size (``SIZE_LIMITS``: d_model, ffn dims, layers, heads, vocabularies, positions) and token id.
- tokenizer files (each at most ``TOKENIZER_FILE_LIMIT`` bytes): ``source.spm`` and ``target.spm`` load
  in sentencepiece; ``vocab.json`` (and ``target_vocab.json`` when present) is a JSON object of
  piece -> id holding ``</s>``, ``<unk>`` and ``<pad>``, with every id inside the model's vocabulary.
  An M2M100 / NLLB directory's tokenizer is built as a decoder builds it, from ``sentencepiece.bpe.model``
  or, without it, ``tokenizer.json``; with neither, the line names both.
- ``model.safetensors``, from its header alone: the file is exactly as long as the header says (a
  truncated or padded file is refused, with both sizes), every tensor has a float dtype and offsets
  matching its shape, and every tensor the config implies is there with its shape (the loader's rule:
  ``raymt.workers.checkpoints.checkpoint.shape_problems``).
- ``pytorch_model.bin``: on local disk a zip archive (``torch.save``), whose shapes are read
  memory-mapped onto the meta device (no weight is read) and checked like those of safetensors. On an
  object store only its first bytes and its size are checked (a zip archive, at least 2 bytes for each
  weight the config implies); its shapes are checked when a decoder loads it.
- a Marian ``.npz`` directory (``decoder.yml`` or ``model.npz``): read and converted as a decoder loads
  it (``raymt.workers.checkpoints.marian_npz``, which reads the weights), every problem listed; a CTranslate2
  directory, or a name that is no directory but looks like a Hugging Face hub id, is refused in one
  line saying what to pass instead (``raymt.workers.checkpoints.model_formats``).
"""
from __future__ import annotations

import json
import struct
import zipfile

import fsspec
import sentencepiece as spm
import torch

from raymt.pipeline.storage import directory_reader, on_disk, storage_options
from raymt.workers.checkpoints.checkpoint import (
    StateLayout,
    UnsupportedCheckpoint,
    config_from_hf,
    expected_layout,
    load_tokenizer,
    separate_target_vocab,
    shape_problems,
)
from raymt.workers.config import ModelConfig
from raymt.workers.text.lang_tokenizer import load_language_tokenizer
from raymt.workers.checkpoints.marian_npz import MarianReader
from raymt.workers.checkpoints.model_formats import ModelFormatError, hub_hint, looks_like_hub_id, open_model
from raymt.workers.text.tokenizer_json import MARIAN_JSON_NOTE, TOKENIZER_JSON

TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json")
TOKENIZER_FILE_LIMIT = 64 << 20  # bytes; real sentencepiece models and vocabularies are 0.1-5 MB
HEADER_LIMIT = 100_000_000  # bytes of safetensors header, as the safetensors library allows
SPECIAL_TOKENS = ("</s>", "<unk>", "<pad>")
LISTED_TENSOR_PROBLEMS = 12  # tensor problems listed one per line; the rest are counted
# safetensors dtype -> bytes per element; only the float ones load (MarianModel casts them).
SAFETENSORS_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
                      "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
                      "C64": 8}
LOADABLE_DTYPES = ("F16", "BF16", "F32", "F64")


class ModelError(ValueError):
    def __init__(self, url: str, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(f"model {url} cannot be used:\n  - " + "\n  - ".join(problems))


def check_model(url: str, name: str | None = None) -> None:
    """Raise ``ModelError`` listing every problem of the checkpoint directory at ``url`` (named ``name``
    when given: a hub model's id and commit); else return."""
    try:
        _check_model(url)
    except ModelError as e:
        if name is None:
            raise
        raise ModelError(name, e.problems) from None


def _check_model(url: str) -> None:
    fs, root = fsspec.core.url_to_fs(url, **storage_options(url))
    root = root.rstrip("/")
    if not fs.isdir(root):
        if not fs.exists(root) and looks_like_hub_id(url):
            raise ModelError(url, [hub_hint(url)])
        raise ModelError(url, ["no such directory" if not fs.exists(root) else "not a directory"])
    if _marian_checked(url):
        return
    hf, cfg, problems = _config(fs, f"{root}/config.json")
    problems += _tokenizer_problems(fs, root, cfg, hf)
    layout = expected_layout(cfg) if cfg is not None else None
    problems += _weights_problems(fs, root, layout)
    if problems:
        raise ModelError(url, problems)


def _marian_checked(url: str) -> bool:
    """Whether ``url`` is a Marian .npz directory (checked as it loads: read, converted, its config,
    tokenizer and weight shapes validated; every problem raised at once), or a CTranslate2 directory
    (refused in one line). False for any other directory, which the checks below cover."""
    try:
        reader = open_model(directory_reader(url), url)
    except ModelFormatError as e:
        raise ModelError(url, [str(e)]) from None
    except UnsupportedCheckpoint as e:
        raise ModelError(url, e.reasons) from None
    if not isinstance(reader, MarianReader):
        return False
    try:
        _, cfg, _ = load_tokenizer(reader)
    except UnsupportedCheckpoint as e:
        raise ModelError(url, [f"converted config: {r}" for r in e.reasons]) from None
    except (ValueError, FileNotFoundError) as e:
        raise ModelError(url, [f"vocabularies: {e}"]) from None
    problems = shape_problems(expected_layout(cfg), {k: tuple(v.shape) for k, v in reader.state.items()})
    if problems:
        raise ModelError(url, capped(problems))
    return True


def capped(problems: list[str], limit: int = LISTED_TENSOR_PROBLEMS) -> list[str]:
    """``problems``, the first ``limit`` of them and a count of the rest when there are more."""
    if len(problems) <= limit:
        return problems
    return problems[:limit] + [f"... and {len(problems) - limit} more of the same kind"]


def _read_small(fs, path: str, name: str, limit: int = TOKENIZER_FILE_LIMIT) -> tuple[bytes | None, list[str]]:
    """The bytes of a small file, or the reason it is not read (absent: None and no reason)."""
    if not fs.exists(path):
        return None, []
    size = fs.size(path)
    if size > limit:
        return None, [f"{name} is {size} bytes, over the {limit} bytes a model file of its kind may have"]
    return fs.cat_file(path), []


# --- config.json -----------------------------------------------------------------------------------

def _config(fs, path: str) -> tuple[dict, ModelConfig | None, list[str]]:
    data, problems = _read_small(fs, path, "config.json")
    if problems:
        return {}, None, problems
    if data is None:
        return {}, None, ["config.json missing"]
    try:
        hf = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        return {}, None, [f"config.json is not valid JSON ({e})"]
    if not isinstance(hf, dict):
        return {}, None, ["config.json is not a JSON object"]
    try:
        return hf, config_from_hf(hf), []
    except UnsupportedCheckpoint as e:
        return hf, None, [f"config.json: {r}" for r in e.reasons]
    except (TypeError, ValueError, KeyError) as e:
        return hf, None, [f"config.json: unusable value ({type(e).__name__}: {e})"]


# --- tokenizer files -------------------------------------------------------------------------------

def spm_problems(name: str, data: bytes) -> list[str]:
    """Why ``data`` is not a usable sentencepiece model (empty list when it is)."""
    if not data:
        return [f"{name} is empty"]
    try:
        pieces = spm.SentencePieceProcessor(model_proto=data).get_piece_size()
    except Exception:  # noqa: BLE001 - sentencepiece raises RuntimeError with an internal message
        return [f"{name} is not a sentencepiece model (it does not parse)"]
    return [] if pieces > 0 else [f"{name} is a sentencepiece model without pieces"]


def vocab_problems(name: str, data: bytes, id_limit: int | None) -> list[str]:
    """Why ``data`` is not a usable piece -> id map whose ids stay below ``id_limit`` (when known)."""
    try:
        vocab = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        return [f"{name} is not valid JSON ({e})"]
    if not isinstance(vocab, dict):
        return [f"{name} is not a JSON object of piece -> id (it is a {type(vocab).__name__})"]
    bad = [k for k, v in vocab.items() if not (isinstance(v, int) and not isinstance(v, bool)) or v < 0]
    if bad:
        return [f"{name}: {len(bad)} piece(s) without a non-negative integer id (first: {bad[0]!r}: {vocab[bad[0]]!r})"]
    problems = []
    missing = [t for t in SPECIAL_TOKENS if t not in vocab]
    if missing:
        problems.append(f"{name} lacks special tokens {missing}")
    top = max(vocab.values(), default=-1)
    if id_limit is not None and top >= id_limit:
        problems.append(f"{name} has ids up to {top}, outside the model's vocabulary of {id_limit}")
    return problems


def _language_tokenizer_problems(fs, root: str) -> list[str]:
    """An M2M100 / NLLB directory's tokenizer (``sentencepiece.bpe.model``, or without it ``tokenizer.json``,
    with ``vocab.json`` or the language codes of ``tokenizer.json`` / ``tokenizer_config.json``), built as
    a decoder builds it; with neither segmentation file, one line naming both."""
    def read(name: str) -> bytes | None:
        data, too_big = _read_small(fs, f"{root}/{name}", name)
        if too_big:
            raise ValueError(too_big[0])
        return data
    try:
        load_language_tokenizer(read)
    except Exception as e:  # noqa: BLE001 - any unreadable tokenizer file is the directory's problem
        return [f"tokenizer: {str(e).splitlines()[0][:300]}"]
    return []


def _tokenizer_problems(fs, root: str, cfg: ModelConfig | None, hf: dict) -> list[str]:
    if cfg is not None and cfg.position_style == "fairseq":  # M2M100 / NLLB-200 (model_type m2m_100)
        return _language_tokenizer_problems(fs, root)
    missing = [n for n in TOKENIZER_FILES if not fs.exists(f"{root}/{n}")]
    note = MARIAN_JSON_NOTE if missing and fs.exists(f"{root}/{TOKENIZER_JSON}") else ""
    problems = [f"tokenizer file(s) missing: {', '.join(missing)}{note}"] if missing else []
    separate = cfg is not None and separate_target_vocab(cfg, hf) and fs.exists(f"{root}/target_vocab.json")
    for name in (*TOKENIZER_FILES, "target_vocab.json"):
        data, too_big = _read_small(fs, f"{root}/{name}", name)
        problems += too_big
        if data is None:
            continue
        if name.endswith(".spm"):
            problems += spm_problems(name, data)
            continue
        limit = None
        if cfg is not None and name == "vocab.json":  # the source map, and the target one unless separate
            limit = cfg.vocab_size if separate else min(cfg.vocab_size, cfg.decoder_vocab_size)
        elif cfg is not None and separate:
            limit = cfg.decoder_vocab_size
        problems += vocab_problems(name, data, limit)
    return problems


# --- weights ---------------------------------------------------------------------------------------

def _weights_problems(fs, root: str, layout: StateLayout | None) -> list[str]:
    if fs.exists(f"{root}/model.safetensors"):
        return _safetensors_file_problems(fs, f"{root}/model.safetensors", layout)
    if fs.exists(f"{root}/pytorch_model.bin"):
        return _bin_problems(fs, f"{root}/pytorch_model.bin", layout)
    return ["no weights: neither model.safetensors nor pytorch_model.bin"]


def _safetensors_file_problems(fs, path: str, layout: StateLayout | None) -> list[str]:
    name, size = "model.safetensors", fs.size(path)
    if size < 8:
        return [f"{name} is {size} bytes, too short for a safetensors header"]
    with fs.open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > min(HEADER_LIMIT, size - 8):
            return [f"{name} is not a readable safetensors file (header length {header_len}, file {size} bytes)"]
        raw = f.read(header_len)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        return [f"{name} is not a readable safetensors file (header: {e})"]
    found, problems = safetensors_problems(name, header, header_len, size)
    if layout is not None and found is not None:
        problems += capped([f"{name}: {p}" for p in shape_problems(layout, found)])
    return problems


def safetensors_problems(name: str, header, header_len: int, file_size: int) -> tuple[dict | None, list[str]]:
    """The shapes a safetensors header lists (None when it is unreadable) and every problem of the file:
    an entry that is not a tensor of a loadable dtype, offsets that do not match the shapes or do not
    tile the data, a file size other than the header's (truncated or padded)."""
    if not isinstance(header, dict):
        return None, [f"{name} is not a readable safetensors file (header is not a JSON object)"]
    found, spans, problems = {}, [], []
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
            if not all(isinstance(n, int) and n >= 0 for n in (*shape, begin, end)) or dtype not in SAFETENSORS_DTYPES:
                raise ValueError
        except (TypeError, KeyError, ValueError):
            problems.append(f"{name}: tensor {key!r} has an unreadable header entry {entry!r}"[:300])
            continue
        found[key] = shape
        spans.append((begin, end, key))
        elements = 1
        for n in shape:
            elements *= n
        if end - begin != elements * SAFETENSORS_DTYPES[dtype]:
            problems.append(f"{name}: tensor {key!r} spans {end - begin} bytes, its shape {shape} {dtype} needs "
                            f"{elements * SAFETENSORS_DTYPES[dtype]}")
        if dtype not in LOADABLE_DTYPES:
            problems.append(f"{name}: tensor {key!r} has dtype {dtype} (loadable: {', '.join(LOADABLE_DTYPES)})")
    position = 0
    for begin, end, key in sorted(spans):
        if begin != position:
            problems.append(f"{name}: tensor {key!r} starts at byte {begin} of the data, not {position} "
                            "(tensors overlap or leave a gap)")
            break
        position = end
    expected = 8 + header_len + max((end for _, end, _ in spans), default=0)
    if file_size < expected:
        problems.append(f"{name} is truncated: {file_size} bytes, its header describes {expected}")
    elif file_size > expected:
        problems.append(f"{name} has {file_size - expected} bytes after the data its header describes "
                        f"({file_size} bytes, expected {expected})")
    return found, capped(problems)


def _bin_problems(fs, path: str, layout: StateLayout | None) -> list[str]:
    name, size = "pytorch_model.bin", fs.size(path)
    with fs.open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"PK\x03\x04":
        return [f"{name} is not a zip archive as torch.save writes (re-save it with torch.save, or as safetensors)"]
    if layout is not None and size < 2 * layout.required_elements():
        return [f"{name} is {size} bytes, too small for the {layout.required_elements()} weights config.json implies"]
    if not on_disk(fs):
        return []  # remote: the shapes are checked when a decoder loads the file
    try:
        with zipfile.ZipFile(path):
            pass
        state = torch.load(path, mmap=True, weights_only=True, map_location="meta")
    except Exception as e:  # noqa: BLE001 - any unreadable archive is a broken file
        return [f"{name} is not readable by torch.load ({type(e).__name__}: {str(e).splitlines()[0][:200]})"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        return [f"{name} does not hold a dict of tensors"]
    problems = [f"{name}: tensor {k!r} has dtype {v.dtype} (not a float type)" for k, v in state.items()
                if not v.dtype.is_floating_point]
    if layout is not None:
        problems += shape_problems(layout, {k: tuple(v.shape) for k, v in state.items()})
    return capped(problems)
