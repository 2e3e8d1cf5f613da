"""The package's rooms (folders) and the import arrows between them, counted from the code.

    python tools/import_map.py            # rooms with their files, then 'room -> room (imports)'

A room is a package folder: ``raymt/workers/search`` is ``workers.search``; a module directly in
``raymt/workers`` belongs to the room ``workers``. Lazy imports inside functions count too.
"""
from __future__ import annotations

import ast
import collections
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def room_of(module: str) -> str:
    """``raymt.workers.search.beams`` -> ``workers.search``; ``raymt.workers.config`` -> ``workers``."""
    parts = module.split(".")[1:]
    path = ROOT.joinpath("raymt", *parts)
    return ".".join(parts if path.is_dir() else parts[:-1]) or "raymt"


def modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in sorted((ROOT / "raymt").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def arrows() -> collections.Counter[tuple[str, str]]:
    """(from room, to room) -> how many imports of one by the other."""
    count: collections.Counter[tuple[str, str]] = collections.Counter()
    for module, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("raymt."):
                targets = [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("raymt.")]
            for target in targets:
                a, b = room_of(module), room_of(target)
                if a != b:
                    count[(a, b)] += 1
    return count


def main() -> None:
    rooms = collections.Counter(room_of(m) for m in modules())
    for room, files in sorted(rooms.items()):
        print(f"{room:28s} {files:3d} files")
    print()
    for (a, b), n in sorted(arrows().items()):
        print(f"{a:28s} -> {b:28s} {n}")


if __name__ == "__main__":
    sys.exit(main())
