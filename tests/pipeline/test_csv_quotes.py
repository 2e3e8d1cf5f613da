"""The quote state of a CSV stream (``pipeline/inputs/csv_quotes.py``) against a byte-by-byte reading of the
same rules, fed in pieces of every size; and those rules against pyarrow's reader itself."""
from __future__ import annotations

import io
import random

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from raymt.pipeline.inputs.csv_quotes import QuoteScan


def read_quotes(data: bytes) -> tuple[str, int] | None:
    """Byte by byte: ("open", line) for a quote never closed, ("ran on", line) for a multi-line quoted
    field closed by a quote followed by text, else None."""
    mode, line, opened, at = "start", 1, 0, 3 if data.startswith(b"\xef\xbb\xbf") else 0
    while at < len(data):
        byte = data[at:at + 1]
        if mode == "quoted":
            if byte == b'"' and data[at + 1:at + 2] == b'"':
                at += 2
                continue
            if byte == b'"':
                after = data[at + 1:at + 2]
                if after and after not in b",\r\n \t" and line > opened:
                    return "ran on", opened
                mode = "field"
            line += byte == b"\n"
        elif byte in b",\r\n":
            mode, line = "start", line + (byte == b"\n")
        elif mode == "start" and byte == b'"':
            mode, opened = "quoted", line
        else:
            mode = "field"
        at += 1
    return ("open", opened) if mode == "quoted" else None


def scan(data: bytes, piece: int) -> tuple[str, int] | None:
    quotes = QuoteScan()
    for at in range(0, len(data), piece):
        quotes.feed(data[at:at + piece])
    quotes.feed(b"")
    if quotes.ran_on:
        return "ran on", int(quotes.ran_on.split("line ")[1].split()[0])
    return ("open", quotes.opened_line) if quotes.never_closed else None


@pytest.mark.parametrize("seed", range(4))
def test_the_scan_agrees_with_a_byte_by_byte_reading_in_pieces_of_any_size(seed):
    rng = random.Random(seed)
    for _ in range(2000):
        data = bytes(rng.choice(b'ab"",\n\r ') for _ in range(rng.randint(0, 30)))
        data = b"\xef\xbb\xbf" + data if rng.random() < 0.1 else data
        assert scan(data, rng.choice([1, 2, 3, 7, 1 << 20])) == read_quotes(data), data


@pytest.mark.parametrize("data, finding", [
    (b'id,text\n1,"Ein Hund\n2,Zwei\n', ("open", 2)),
    (b'id,text\n1,"Ein Hund\n2,Zwei\n3,"Drei"\n', ("ran on", 2)),
    (b'id,text\n1,"Ein\nHund ""zitiert"", ja"\n2,"a,b"\n', None),  # legitimate multi-line and doubled quotes
    (b'id,text\n1,Er sagte "hallo\n2,5\'2"\n', None),  # quotes inside unquoted fields are text
    (b'id,text\n1,"a" \n2,""\n3,"""x"""', None),
    (b'\xef\xbb\xbf"id,text\n1,a\n', ("open", 1)),
])
def test_findings_on_files_a_user_writes(data, finding):
    assert scan(data, 5) == finding == read_quotes(data)


def test_the_byte_by_byte_rules_are_pyarrow_s():
    """Random files parsed by pyarrow and by the same rules written out record by record."""
    def records(data: bytes) -> list[tuple[bytes, ...]]:
        out, record, cell, mode, touched, at = [], [], bytearray(), "start", False, 0
        while at < len(data):
            byte = data[at:at + 1]
            if mode == "quoted":
                if byte == b'"' and data[at + 1:at + 2] == b'"':
                    cell += b'"'
                    at += 1
                elif byte == b'"':
                    mode = "field"
                else:
                    cell += byte
            elif byte in b"\r\n":
                if touched or cell or record:
                    out.append((*record, bytes(cell)))
                record, cell, mode, touched = [], bytearray(), "start", False
            elif byte == b",":
                record.append(bytes(cell))
                cell, mode, touched = bytearray(), "start", True
            elif mode == "start" and byte == b'"':
                mode, touched = "quoted", True
            else:
                mode, touched = "field", True
                cell += byte
            at += 1
        if touched or cell or record:
            out.append((*record, bytes(cell)))
        return out

    rng = random.Random(7)
    compared = 0
    for _ in range(3000):
        data = bytes(rng.choice(b'ab"",\n\r') for _ in range(rng.randint(1, 16)))
        expected = records(data)
        if len({len(r) for r in expected}) != 1:
            continue  # records of different widths: pyarrow refuses the file
        names = [f"c{i}" for i in range(len(expected[0]))]
        table = pacsv.read_csv(io.BytesIO(data), read_options=pacsv.ReadOptions(column_names=names),
                               parse_options=pacsv.ParseOptions(newlines_in_values=True),
                               convert_options=pacsv.ConvertOptions(column_types={n: pa.binary() for n in names}))
        assert [tuple(r.values()) for r in table.to_pylist()] == expected, data
        compared += 1
    assert compared > 1000
