"""Corpus formats by file name: what an input is read as, what an output is written as, and the
per-row parsing of line formats. Pure: no IO.

Inputs (the name's last suffix after a compression suffix decides):

    .parquet                  columns (--text-column, --id-column, --reference-column)
    .jsonl / .ndjson          a JSON object a line (--text-column / --text-field, default ``text``)
    .csv                      a header record naming the columns, then a record a row (--text-column,
                              --id-column, --reference-column; quoted fields may hold newlines):
                              ``pipeline/inputs/csvfiles.py``
    .tsv                      tab-separated columns, the text in --column N (1-based, as ``cut -f``)
    anything else             plain text, a sentence a line
    + .gz .bz2 .xz .zst       the text formats compressed (Parquet compresses inside the file)

Ids are strings: a row's id is its id column's value (``--id-column``, else ``id`` where the input has
it; a JSON line's id field) as text. Where the input has no ids at all (plain text, TSV, Parquet or
CSV without an id column) a row's id is its global row number (``"7"``). Where it has ids but a row
lacks its own (a JSON line without the id field, or not parsable at all; a null Parquet cell; an
empty CSV cell) the row's id is ``row:<n>`` (``missing_id``), n its global row number, the output's
``row``: a form no numeric id takes (a string id would have to be spelled ``row:`` and that very
number), so it does not repeat a real id as a bare row number did.

Outputs: a directory of Parquet parts, or one file: ``.parquet``, ``.jsonl`` / ``.ndjson``, ``.tsv``
(source, tab, translation) or plain text (any other name), the text ones optionally compressed by the
same suffixes. Names that promise a format the job does not write (``.csv``, ``.json``, ``.xlsx``,
...) are refused before any work, never written as text.

A line that cannot be parsed (invalid JSON, not an object, a missing or non-string text field, too
few columns) is a row with status ``invalid`` and its reason, never an exception or a lost row. So
is a JSON line nested deeper than ``MAX_JSON_DEPTH`` (checked on the bytes, before parsing: the
parser recurses) and one that is not valid Unicode: invalid UTF-8, or a lone surrogate, which JSON
can spell (``"\\ud800"``) but no encoder can write. A lone surrogate in the text, the id or another
field makes the line ``invalid``; its clean id and other fields are kept, the bad ones dropped, so no
lone surrogate reaches the tokenizer, an id or the output's passthrough column.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".zst": "zstd"}  # suffix -> fsspec compression
MAGIC = {"gzip": b"\x1f\x8b", "bz2": b"BZh", "xz": b"\xfd7zXZ\x00", "zstd": b"\x28\xb5\x2f\xfd"}
JSONL_SUFFIXES = (".jsonl", ".ndjson")
TEXT_INPUT_SUFFIXES = (".txt", ".tsv", ".csv", *JSONL_SUFFIXES)  # what a directory input is read for, besides .parquet
REFUSED_OUTPUTS = (".csv", ".json", ".xlsx", ".xls", ".ods", ".xml", ".html", ".htm", ".doc", ".docx", ".pdf",
                   ".arrow", ".feather", ".orc", ".avro", ".zip", ".7z", ".tar", ".tgz", ".rar", ".lz4", ".z")
SUPPORTED_OUTPUTS = ("a directory (ends in '/' or has no extension)", ".parquet", ".jsonl", ".tsv",
                     "text (.txt or any other name)", "the text ones compressed: .gz .bz2 .xz .zst")
INVALID = "invalid"  # the status of a row whose line cannot be parsed
MAX_JSON_DEPTH = 100  # arrays / objects a JSON line may nest (a corpus line needs a few; the parser recurses)
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_BRACKET = re.compile(rb"[\[\]{}]")
_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")  # an escaped one, or one's UTF-8 form
_SURROGATE = re.compile("[\ud800-\udfff]")  # in a decoded string: a lone one (pairs decode to one character)


class UnsupportedOutput(ValueError):
    """``--output`` names a format the job does not write; raised before any work."""


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1].lower()


def compression_of(path: str) -> str | None:
    """The fsspec compression of a file by its name (``x.txt.gz`` -> ``gzip``), or None."""
    name = _name(path)
    return next((kind for suffix, kind in COMPRESSIONS.items() if name.endswith(suffix)), None)


def base_name(path: str) -> str:
    """The file name without its compression suffix, lower-cased (``a.jsonl.gz`` -> ``a.jsonl``)."""
    name = _name(path)
    for suffix in COMPRESSIONS:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def input_kind(path: str) -> str:
    """``parquet``, ``jsonl``, ``csv``, ``tsv`` or ``text`` (a sentence a line), by the file's name."""
    name = base_name(path)
    if name.endswith(".parquet") and compression_of(path) is None:
        return "parquet"
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(".csv"):
        return "csv"
    return "tsv" if name.endswith(".tsv") else "text"


def is_input_file(path: str) -> bool:
    """Whether a directory input reads this file: ``.parquet``, or .txt / .tsv / .csv / .jsonl, plain or compressed."""
    return _name(path).endswith(".parquet") or base_name(path).endswith(TEXT_INPUT_SUFFIXES)


@dataclass(frozen=True, slots=True)
class OutputFormat:
    """How one assembled output file is written: ``kind`` parquet / jsonl / tsv / text, its
    compression, the n-best size (text with ``nbest`` > 1: Marian's n-best lines) and the source
    field's name in JSON lines."""

    kind: str
    compression: str | None = None
    nbest: int = 1
    text_name: str = "text"


def output_format(url: str, nbest: int = 1, text_name: str = "text") -> OutputFormat:
    """The format of a single-file ``--output``, or ``UnsupportedOutput`` in one line naming what is."""
    name, compression = base_name(url), compression_of(url)
    refused = next((s for s in REFUSED_OUTPUTS if name.endswith(s)), None)
    if refused or (name.endswith(".parquet") and compression):
        what = f"{refused} files" if refused else "compressed Parquet (Parquet compresses inside the file)"
        raise UnsupportedOutput(f"--output {url}: {what} cannot be written; supported outputs: "
                                f"{', '.join(SUPPORTED_OUTPUTS)}")
    kind = "parquet" if name.endswith(".parquet") else "jsonl" if name.endswith(JSONL_SUFFIXES) \
        else "tsv" if name.endswith(".tsv") else "text"
    if kind == "tsv" and nbest > 1:
        raise UnsupportedOutput(f"--output {url}: a .tsv output holds one translation a row, and --nbest {nbest} "
                                f"asks for more; write .jsonl, .parquet or text (Marian's n-best lines) instead")
    return OutputFormat(kind, compression, nbest, text_name)


def missing_id(row: int) -> str:
    """The id of row ``row`` (global) of an input with ids where the row has none: ``row:<n>``."""
    return f"row:{row}"


def unread_ids(path: str, id_column: str | None, rows: list[int]) -> list[str]:
    """The ids of rows whose own could not be read (an unreadable unit): ``row:<n>`` where the input
    has ids (an id column, or JSON lines), else the row numbers, as its readable rows would have."""
    has_ids = id_column is not None or input_kind(path) == "jsonl"
    return [missing_id(r) if has_ids else str(r) for r in rows]


@dataclass(frozen=True, slots=True)
class ParsedRow:
    """One line of a JSONL / TSV input: its text (None when unparsable), id, other fields (JSON
    object text, JSONL only) and why it could not be parsed."""

    text: str | bytes | None
    id: str | None = None
    fields: str | None = None
    problem: str | None = None


def parse_jsonl(line: bytes, text_field: str = "text", id_field: str | None = None) -> ParsedRow:
    """A JSON object line -> its text field, id field (``id_field``, else ``id`` if present) and the
    other fields; an unparsable line -> a row saying why."""
    too_deep = ParsedRow(None, problem=f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    if _nested_deeper(line, MAX_JSON_DEPTH):
        return too_deep
    try:
        obj = json.loads(line)
    except RecursionError:  # not reached after the check above; the parser's own limit, all the same
        return too_deep
    except ValueError as e:  # json.JSONDecodeError and invalid UTF-8 alike
        return ParsedRow(None, problem=f"invalid JSON: {e}")
    if not isinstance(obj, dict):
        return ParsedRow(None, problem=f"a JSON {type(obj).__name__}, not an object")
    unicode = {}  # field -> why it is not valid Unicode
    if _MAYBE_SURROGATE.search(line):
        unicode = {k: why for k, v in obj.items() if (why := _lone_surrogate(k, v))}
    id_name = id_field or "id"
    raw_id = None if id_name in unicode else obj.get(id_name)
    ident = None if raw_id is None else raw_id if isinstance(raw_id, str) else json.dumps(raw_id)
    others = {k: v for k, v in obj.items() if k not in (text_field, id_name) and k not in unicode}
    fields = json.dumps(others, ensure_ascii=False) if others else None
    if unicode:
        return ParsedRow(None, ident, fields, unicode.get(text_field) or next(iter(unicode.values())))
    if text_field not in obj:
        return ParsedRow(None, ident, fields, f"no field {text_field!r}; fields found: {sorted(obj)}")
    text = obj[text_field]
    if text is not None and not isinstance(text, str):
        return ParsedRow(None, ident, fields, f"field {text_field!r} is a JSON {type(text).__name__}, not a string")
    return ParsedRow(text, ident, fields)


def _nested_deeper(line: bytes, limit: int) -> bool:
    """Whether the JSON text ``line`` nests arrays / objects more than ``limit`` deep (brackets inside
    strings do not count); a line with no more than ``limit`` brackets is not read further."""
    if line.count(b"[") + line.count(b"{") <= limit:
        return False
    depth = 0
    for bracket in _BRACKET.finditer(_JSON_STRING.sub(b"", line)):
        depth += 1 if bracket[0] in b"[{" else -1
        if depth > limit:
            return True
    return False


def _lone_surrogate(name: str, value: object) -> str | None:
    """Why the field ``name``: ``value`` is not valid Unicode (a lone surrogate in its name, its text
    or a string nested in it), or None."""
    if found := _SURROGATE.search(name):
        return f"field name {name!r} holds a lone surrogate ({ascii(found[0])[1:-1]}), not valid Unicode"
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str) and (found := _SURROGATE.search(item)):
            where = f"at position {found.start()}" if item is value else "in a nested string"
            return f"field {name!r} holds a lone surrogate ({ascii(found[0])[1:-1]}) {where}, not valid Unicode"
        if isinstance(item, dict):
            pending += [*item, *item.values()]
        elif isinstance(item, list):
            pending += item
    return None


def parse_tsv(line: bytes, column: int = 1) -> ParsedRow:
    """A tab-separated line -> its ``column``-th field (1-based, as ``cut -f``), or why not."""
    cells = line.split(b"\t")
    if column > len(cells):
        return ParsedRow(None, problem=f"{len(cells)} tab-separated column(s), the text is asked from column {column}")
    return ParsedRow(cells[column - 1])


def mark_invalid(statuses: list[str], reasons: list[str],
                 problems: list[str | None] | None) -> tuple[list[str], list[str]]:
    """Rows' statuses and reasons, those of unparsable lines (``problems``) replaced by ``invalid`` and why."""
    if not problems:
        return statuses, reasons
    return ([INVALID if p else s for s, p in zip(statuses, problems)],
            [p if p else r for r, p in zip(reasons, problems)])
