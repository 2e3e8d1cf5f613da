"""The stats report of a finished job: one PNG of six panels and one self-contained HTML page.

    rows = OutputStore(output).read_stats().to_pylist()     # one row a committed unit
    render(rows, "out/report")                              # out/report.png, out/report.html

Panels, over the job's time from each actor's time slices (a few seconds each, inside units too:
``pipeline/reports/timeline.py``): decoded tokens/s, batch occupancy and refills per actor, and the job's
rows committed; then the histogram of actual batch size per decoding step (the top-up paper's
Figure 8), pruned fraction and shortlist size per unit, and the time each actor waited for its
next unit. Stats rows of older outputs (no slices) plot one point per unit.
"""
from __future__ import annotations

import base64
import html
import io
import json
from collections import Counter

from raymt.pipeline.extras import require
from raymt.pipeline.reports.stats_tables import actor_table


def batch_histogram(rows: list[dict]) -> Counter:
    """Steps per actual batch size (sentences decoded in the step), summed over units."""
    total: Counter = Counter()
    for r in rows:
        for size, steps in json.loads(r.get("batch_histogram") or "{}").items():
            total[int(size)] += steps
    return total


def summary(rows: list[dict]) -> dict:
    start = min(r["started"] for r in rows)
    end = max(r["finished"] for r in rows)
    tokens = sum(r["target_tokens"] for r in rows)
    statuses: Counter = Counter()
    for r in rows:
        statuses.update(json.loads(r["statuses"]))
    return {"units": len(rows), "sentences": sum(r["sentences"] for r in rows), "target_tokens": tokens,
            "wall_s": round(end - start, 2), "target_tokens_per_s": round(tokens / max(end - start, 1e-9), 1),
            "actors": len({r["actor"] for r in rows}), "nodes": len({r["node"] for r in rows}),
            "statuses": dict(statuses)}


def slices(rows: list[dict]) -> dict[str, list[dict]]:
    """Each actor's time slices, in time order (a unit without slices: one slice spanning it)."""
    out: dict[str, list[dict]] = {}
    for r in rows:
        mine = json.loads(r.get("slices") or "[]") or [
            {"start": r["started"], "end": r["finished"], "tokens_per_s": r["target_tokens"] / max(r["decode_s"], 1e-9),
             "occupancy": r["occupancy"], "refills": r["refills"]}]
        out.setdefault(r["actor"], []).extend(mine)
    return {a: sorted(s, key=lambda x: x["end"]) for a, s in out.items()}


def progress(rows: list[dict]) -> tuple[list[float], list[int]]:
    """Rows committed over the job's time: (seconds since the first unit started, cumulative rows)."""
    t0 = min(r["started"] for r in rows)
    t, n = [0.0], [0]
    for r in sorted(rows, key=lambda r: r["finished"]):
        t.append(r["finished"] - t0)
        n.append(n[-1] + r["sentences"])
    return t, n


def figure(rows: list[dict]):
    """The eight panels as one matplotlib figure (Agg backend: no display needed)."""
    matplotlib = require("matplotlib", "plots", "the stats report")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = min(r["started"] for r in rows)
    fig, axes = plt.subplots(2, 4, figsize=(20, 8.5), constrained_layout=True)
    (tput, occupancy, refills, done), (hist, pruned, shortlist, wait) = axes
    for a, mine in slices(rows).items():
        mid = [(s["start"] + s["end"]) / 2 - t0 for s in mine]
        tput.plot(mid, [s["tokens_per_s"] for s in mine], marker=".", label=a)
        occupancy.plot(mid, [s["occupancy"] for s in mine], marker=".", label=a)
        refills.plot(mid, [s["refills"] for s in mine], marker=".", label=a)
    for a in sorted({r["actor"] for r in rows}):
        units = sorted((r for r in rows if r["actor"] == a), key=lambda r: r["finished"])
        t = [r["finished"] - t0 for r in units]
        pruned.plot(t, [r["pruned_fraction"] for r in units], marker=".", label=a)
        shortlist.plot(t, [r["shortlist_size"] for r in units], marker=".", label=a)
        wait.plot(t, [max(r["wait_s"], 0.0) for r in units], marker=".", label=a)
    done.step(*progress(rows), where="post", color="tab:green")
    sizes = batch_histogram(rows)
    if sizes:
        xs = sorted(sizes)
        hist.bar(xs, [sizes[x] for x in xs], width=0.9, color="tab:blue")
        hist.set_xlabel("actual batch size (sentences in the step)")
        hist.set_ylabel("decoding steps")
    hist.set_title("Batch size per step")
    for ax, title, ylabel in ((tput, "Decoded tokens/s per actor (time slices)", "tokens/s"),
                              (occupancy, "Batch occupancy per actor (time slices)", "live sentences / capacity"),
                              (refills, "Refills per time slice", "refills"),
                              (done, "Rows committed (job)", "rows"),
                              (pruned, "Pruned fraction of candidates (per unit)", "fraction"),
                              (shortlist, "Mean shortlist size (per unit)", "target words"),
                              (wait, "Wait for the next unit", "seconds")):
        ax.set_title(title)
        ax.set_xlabel("seconds since the first unit started")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    if len({r["actor"] for r in rows}) <= 12:
        tput.legend(fontsize=7, loc="lower right")
    return fig


def render(rows: list[dict], out: str, title: str = "Translation job") -> tuple[str, str]:
    """Write ``<out>.png`` and ``<out>.html`` (the PNG embedded, so the page travels alone)."""
    if not rows:
        raise ValueError("no committed units: nothing to report")
    fig = figure(rows)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    png = buf.getvalue()
    with open(out + ".png", "wb") as f:
        f.write(png)
    with open(out + ".html", "w", encoding="utf-8") as f:
        f.write(page(rows, title, base64.b64encode(png).decode()))
    return out + ".png", out + ".html"


def page(rows: list[dict], title: str, png_b64: str) -> str:
    s = summary(rows)
    facts = "".join(f"<li><b>{html.escape(k)}</b>: {html.escape(str(v))}</li>" for k, v in s.items())
    table = actor_table(rows)
    head = "".join(f"<th>{html.escape(k)}</th>" for k in table[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r.values()) + "</tr>" for r in table)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}img{{max-width:100%}}</style></head>
<body><h1>{html.escape(title)}</h1><ul>{facts}</ul>
<img alt="per-actor stats" src="data:image/png;base64,{png_b64}">
<h2>Per-actor stats</h2><table><tr>{head}</tr>{body}</table></body></html>
"""
