"""A finished job's stats rows as tables: the per-actor summary and a plain Markdown table.

    rows = OutputStore(output).read_stats()       # one row a committed unit
    print(markdown_table(actor_table(rows)))      # one line an actor

``actor_table`` is shared by the job's closing summary (``jobs/translate.py``) and the HTML report
(``pipeline/reports/stats_plots.py``).
"""
from __future__ import annotations

import pyarrow as pa


def actor_table(stats: list[dict] | pa.Table) -> list[dict]:
    """Per-actor summary rows: units, sentences, tokens/s, occupancy, refills, pruned, shortlist, wait."""
    rows = stats.to_pylist() if isinstance(stats, pa.Table) else stats
    by_actor: dict[str, list[dict]] = {}
    for r in rows:
        by_actor.setdefault(r["actor"], []).append(r)
    out = []
    for actor, rs in sorted(by_actor.items()):
        busy = sum(r["decode_s"] for r in rs)
        out.append({"actor": actor, "node": rs[0]["node"][:12], "units": len(rs),
                    "sentences": sum(r["sentences"] for r in rs),
                    "src_tok_per_s": round(sum(r["source_tokens"] for r in rs) / max(busy, 1e-9), 1),
                    "tgt_tok_per_s": round(sum(r["target_tokens"] for r in rs) / max(busy, 1e-9), 1),
                    "sent_per_s": round(sum(r["sentences"] for r in rs) / max(busy, 1e-9), 2),
                    "occupancy": round(sum(r["occupancy"] for r in rs) / len(rs), 3),
                    "refills": sum(r["refills"] for r in rs),
                    "pruned_fraction": round(sum(r["pruned_fraction"] for r in rs) / len(rs), 4),
                    "shortlist_size": round(sum(r["shortlist_size"] for r in rs) / len(rs), 1),
                    "wait_s": round(sum(max(r["wait_s"], 0) for r in rs), 2), "decode_s": round(busy, 2)})
    return out


def markdown_table(rows: list[dict]) -> str:
    """Rows of the same keys as a Markdown table, the first row's keys as its header ("" for no rows)."""
    if not rows:
        return ""
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines)
