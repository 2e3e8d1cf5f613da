"""The package's rooms (``raymt/workers/*``, ``raymt/pipeline/*``) hold a handful of files each, say in
their ``__init__`` what lives there, and import one another only downwards, as ``ALLOWED`` says.
``python tools/import_map.py`` prints the rooms and the arrows between them."""
from __future__ import annotations

import ast

import pytest

from tools.import_map import ROOT, arrows, modules, room_of

MAX_FILES = 15

# room -> the rooms it may import (``workers`` / ``pipeline``: the modules directly in that folder,
# shared by its rooms). A new arrow is a decision: make it here, and in the room's docstring.
ALLOWED: dict[str, set[str]] = {
    "workers": set(),
    "workers.model": {"workers"},
    "workers.kernels": {"workers", "workers.model"},
    "workers.search": {"workers", "workers.model"},
    "workers.text": {"workers", "workers.search"},
    "workers.checkpoints": {"workers", "workers.model", "workers.text"},
    "workers.decoder": {"workers", "workers.model", "workers.kernels", "workers.search", "workers.text",
                        "workers.checkpoints"},
    "pipeline": {"workers.checkpoints"},
    "pipeline.reports": {"pipeline"},
    "pipeline.inputs": {"pipeline"},
    "pipeline.outputs": {"pipeline", "pipeline.inputs", "pipeline.reports"},
    "pipeline.decoders": {"pipeline", "pipeline.outputs", "pipeline.reports", "workers", "workers.checkpoints",
                          "workers.decoder", "workers.kernels", "workers.search", "workers.text"},
    "pipeline.orchestration": {"pipeline", "pipeline.inputs", "pipeline.outputs", "pipeline.reports",
                               "pipeline.decoders", "workers", "workers.checkpoints", "workers.decoder",
                               "workers.kernels", "workers.search", "workers.text"},
}
ROOMS = sorted(ALLOWED)


def test_every_room_is_listed_and_small():
    found = {room_of(m) for m in modules() if m.startswith(("raymt.workers", "raymt.pipeline"))}
    assert found == set(ALLOWED)
    for room in ROOMS:
        folder = ROOT.joinpath("raymt", *room.split("."))
        files = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        assert 0 < len(files) <= MAX_FILES, (room, len(files))


@pytest.mark.parametrize("room", [r for r in ROOMS if "." in r])
def test_a_room_says_what_lives_there_and_what_it_may_import(room):
    init = ROOT.joinpath("raymt", *room.split("."), "__init__.py")
    doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
    assert len(doc) > 200 and "mport" in doc, room


def test_rooms_import_only_what_they_are_allowed():
    extra = sorted(f"{a} -> {b}" for a, b in arrows() if a in ALLOWED and b not in ALLOWED[a])
    assert not extra, "arrows not in ALLOWED:\n" + "\n".join(extra)


def test_allowed_arrows_run_one_way():
    state: dict[str, int] = {}

    def visit(room: str, path: list[str]) -> None:
        state[room] = 1
        for nxt in sorted(ALLOWED[room]):
            assert state.get(nxt) != 1, " -> ".join([*path, room, nxt])
            if nxt not in state:
                visit(nxt, [*path, room])
        state[room] = 2

    for room in ROOMS:
        if room not in state:
            visit(room, [])


def test_the_install_ships_every_room():
    import tomllib
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"])
    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "raymt").rglob("__init__.py")}
    assert listed == folders
