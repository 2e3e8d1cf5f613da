"""Input lines and records at the edge of their format, through the translate command (in this
process): a JSON line nested too deep or holding a lone surrogate is one ``invalid`` row among rows
that translate; a CSV quote never closed is refused before any work."""
from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT
from tests.jobs.test_formats_cli import translate

LINES = (ROOT / "examples" / "sample.de.txt").read_text(encoding="utf-8").splitlines()[:4]
DEEP = "[" * 100_000 + "]" * 100_000
BAD_LINES = [  # (the line as written, its row's id, its reason)
    (DEEP, "row:1", "JSON nested deeper than 100 levels"),
    ('{"id": "d", "text": ' + DEEP + "}", "row:2", "JSON nested deeper than 100 levels"),
    ('{"id": "t", "text": "a\\ud800b", "lang": "de"}', "t",
     "field 'text' holds a lone surrogate (\\ud800) at position 1, not valid Unicode"),
    ('{"id": "i\\udc00", "text": "Ein Hund."}', "row:4",
     "field 'id' holds a lone surrogate (\\udc00) at position 1, not valid Unicode"),
    ('{"id": "n", "text": "Ein Hund.", "note": "x\\ud800", "lang": "de"}', "n",
     "field 'note' holds a lone surrogate (\\ud800) at position 1, not valid Unicode"),
]


@pytest.mark.parametrize("flags", [(), ("--skip-corrupt",)], ids=["plain", "skip-corrupt"])
def test_a_too_deep_or_not_unicode_json_line_is_one_invalid_row(demo_model_dir, tmp_path, flags):
    lines = [json.dumps({"id": "a", "text": LINES[0]}), *(line for line, _, _ in BAD_LINES),
             json.dumps({"id": "z", "text": LINES[1], "lang": "de"})]
    (tmp_path / "in.jsonl").write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    translate(demo_model_dir, tmp_path / "in.jsonl", tmp_path / "out.jsonl", "--unit-rows", "3", *flags)
    got = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [g["status"] for g in got] == ["ok", *["invalid"] * len(BAD_LINES), "ok"]
    assert [g["id"] for g in got] == ["a", *(ident for _, ident, _ in BAD_LINES), "z"]
    assert [g.get("reason") for g in got[1:-1]] == [reason for _, _, reason in BAD_LINES]
    assert got[0]["translation"] and got[-1]["translation"] and got[-1]["lang"] == "de"
    assert got[3]["lang"] == "de" and got[5]["lang"] == "de" and "note" not in got[5]  # the valid fields pass through
    assert all(g["translation"] == "" for g in got[1:-1])


def test_a_csv_quote_never_closed_is_refused_naming_the_file_and_line(demo_model_dir, tmp_path):
    records = ["id,text", '1,"Ein Hund'] + [f"{i},Zwei Katzen {i}" for i in range(2, 21)]
    (tmp_path / "data.csv").write_text("\n".join(records) + "\n", encoding="utf-8")
    with pytest.raises(SystemExit) as refused:
        translate(demo_model_dir, tmp_path / "data.csv", tmp_path / "out.jsonl")
    message = str(refused.value.code)
    assert message.startswith("error: ") and "\n" not in message
    assert message.endswith("data.csv: a quote opened on line 2 (record 1) is never closed")
    assert [p.name for p in tmp_path.iterdir()] == ["data.csv"]  # nothing written


def test_a_csv_with_multi_line_quoted_fields_still_gives_a_row_a_record(demo_model_dir, tmp_path):
    data = ('id,text,note\n1,"Ein Hund\nläuft ""schnell"".",a\n2,Zwei Katzen.,"x,\ny"\n3,"Drei, vier.",\n'
            '4,Er sagte "hallo" und ging.,\n')
    (tmp_path / "data.csv").write_text(data, encoding="utf-8")
    translate(demo_model_dir, tmp_path / "data.csv", tmp_path / "out.jsonl")
    got = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [g["id"] for g in got] == ["1", "2", "3", "4"]
    assert [g["text"] for g in got] == ['Ein Hund\nläuft "schnell".', "Zwei Katzen.", "Drei, vier.",
                                        'Er sagte "hallo" und ging.']
    assert got[1]["note"] == "x,\ny" and all(g["translation"] for g in got)
