"""The answer first: the summary of a run (peak throughput, single-stream speed, per context
the knee and the KV capacity limit, the flagged cells), and of a request-rate run (the
highest rate kept up with). Numbers come from the matrix pivots of `Run`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from speedmatrix.report import formatting as fmt
from speedmatrix.report.cells import FLAG_SHORT, cell_flags, load_text, ordered_cells
from speedmatrix.report.model import Section, Table
from speedmatrix.report.predicted import PREDICTED_MARK, is_predicted
from speedmatrix.report.rates import figure_grid, load_grid

if TYPE_CHECKING:  # pragma: no cover
    from speedmatrix.results import Run


#: the knee: the most requests at once whose per-request speed is still at least this share
#: of the context's single-stream (N = 1) speed
KNEE_SHARE = 0.5


def summary(run: Run) -> dict[str, Any]:
    """The answer first: peak total tok/s and where, single-stream speed, per context the knee
    (the most requests at once still getting ``KNEE_SHARE`` of single-stream speed each) and
    the capacity limit, and the flagged cells. Numbers only; :func:`summary_section` words
    them. Everything derives from the matrix pivots of :class:`Run`."""
    tot = run.table("total_tok_s")
    per = run.table("per_request_tok_s")
    st = run.statuses()
    md = run.matrix_definition
    conc = [int(n) for n in tot.columns]
    out: dict[str, Any] = {"peak": None, "contexts": [], "flagged": {}, "n_flagged": 0}
    #: (context, concurrency) of the cells the twin predicted (never counted as measured)
    guessed = {
        (int(c["context"]), int(c["concurrency"]))
        for c in ordered_cells(run)
        if c.get("phase") == "decode" and is_predicted(c)
    }
    out["predicted"] = guessed
    vals = tot.to_numpy(float)
    if vals.size and np.isfinite(vals).any():
        pi, pj = np.unravel_index(np.nanargmax(vals), vals.shape)
        out["peak"] = {
            "total_tok_s": float(vals[pi, pj]),
            "context": int(md["contexts"][pi]),
            "label": str(tot.index[pi]),
            "concurrency": conc[pj],
            "predicted": (int(md["contexts"][pi]), conc[pj]) in guessed,
        }
    for i, label in enumerate(tot.index):
        row_per = per.iloc[i].to_numpy(float)
        row_tot = tot.iloc[i].to_numpy(float)
        row_st = list(st.iloc[i])
        single = float(row_per[0]) if conc and conc[0] == 1 else float("nan")
        knee = None
        if np.isfinite(single) and single > 0:
            for n, v in zip(conc, row_per):
                if not np.isfinite(v) or v < KNEE_SHARE * single:
                    break
                knee = n
        fits = [n for n, s in zip(conc, row_st) if s in ("valid", "queued")]
        over = [n for n, s in zip(conc, row_st) if s == "over_capacity"]
        queued = [n for n, s in zip(conc, row_st) if s == "queued"]
        best = int(np.nanargmax(row_tot)) if np.isfinite(row_tot).any() else None
        out["contexts"].append(
            {
                "label": str(label),
                "context": int(md["contexts"][i]),
                "single_tok_s": single,
                "single_predicted": (int(md["contexts"][i]), 1) in guessed,
                "peak_predicted": best is not None
                and (int(md["contexts"][i]), conc[best]) in guessed,
                "knee": knee,
                "peak_tok_s": float(row_tot[best]) if best is not None else float("nan"),
                "peak_at": conc[best] if best is not None else None,
                "largest_measured": max(fits) if fits else None,
                "first_over": min(over) if over else None,
                "first_queued": min(queued) if queued else None,
            }
        )
    for c in ordered_cells(run):
        flags = c.get("flags")
        flags = list(flags) if isinstance(flags, (list, tuple, np.ndarray)) else []
        if flags and c.get("status") in ("valid", "queued"):
            out["n_flagged"] += 1
            for f in flags:
                out["flagged"][f] = out["flagged"].get(f, 0) + 1
    return out


def _cell_items(run: Run, s: dict[str, Any]) -> list[tuple[str, str]]:
    """The summary's "Flagged cells" line (measured cells only) and, where the twin predicted
    some, the "Predicted cells" line."""
    items: list[tuple[str, str]] = []
    n_cells = int(
        sum(
            1
            for c in ordered_cells(run)
            if c.get("status") in ("valid", "queued") and not is_predicted(c)
        )
    )
    if s["n_flagged"]:
        why = ", ".join(
            f"{FLAG_SHORT.get(f, f)} ({n})"
            for f, n in sorted(s["flagged"].items(), key=lambda kv: -kv[1])
        )
        items.append(
            (
                "Flagged cells",
                (
                    f"{s['n_flagged']} of {n_cells} measured cells "
                    f"({fmt.FLAG_MARK} in the grid): {why}; see Flags"
                ),
            )
        )
    else:
        items.append(("Flagged cells", f"None of {n_cells} measured cells"))
    if s["predicted"]:
        items.append(
            (
                "Predicted cells",
                (
                    f"{len(s['predicted'])} decode cells predicted by the twin, not measured "
                    "(marked predicted; see Predicted cells)"
                ),
            )
        )
    return items


def summary_section(run: Run) -> Section:
    s = summary(run)
    items: list[tuple[str, str]] = []
    peak = s["peak"]
    if peak is None:
        items.append(("Peak throughput", "No decode cell was measured."))
    else:
        items.append(
            (
                "Peak throughput",
                (
                    f"{fmt.tok_s(peak['total_tok_s'])} total tok/s at {peak['label']} context × "
                    f"{fmt.plural(peak['concurrency'], 'request')} at once"
                    + (f" ({PREDICTED_MARK})" if peak["predicted"] else "")
                ),
            )
        )
    mark = f" ({PREDICTED_MARK})"
    singles = [(c["label"], c["single_tok_s"], c["single_predicted"]) for c in s["contexts"]]
    singles = [(lab, v, p) for lab, v, p in singles if np.isfinite(v)]
    if singles:
        text = ", ".join(f"{fmt.tok_s(v)} at {lab}{mark if p else ''}" for lab, v, p in singles)
        items.append(("Single-stream speed", f"{text} (tok/s of one request alone)"))
    items += _cell_items(run, s)
    rows = []
    for c in s["contexts"]:
        knee = fmt.DASH if c["knee"] is None else f"{fmt.count(c['knee'])} at once"
        if c["first_over"] is not None:
            limit = (
                f"{fmt.count(c['largest_measured'])} at once fit; "
                f"{fmt.count(c['first_over'])} over capacity"
                if c["largest_measured"] is not None
                else f"over capacity from {fmt.count(c['first_over'])}"
            )
        else:
            limit = "every level fits"
        if c["first_queued"] is not None:
            limit += f"; queued from {fmt.count(c['first_queued'])}"
        peak_txt = (
            fmt.DASH
            if c["peak_at"] is None
            else f"{fmt.tok_s(c['peak_tok_s'])} at {fmt.count(c['peak_at'])}"
            + (mark if c["peak_predicted"] else "")
        )
        single_txt = fmt.tok_s(c["single_tok_s"]) + (
            mark if c["single_predicted"] and np.isfinite(c["single_tok_s"]) else ""
        )
        rows.append([c["label"], single_txt, knee, peak_txt, limit])
    share = f"{KNEE_SHARE:.0%}"
    tbl = Table(
        ["Context", "Single stream tok/s", "Knee", "Peak total tok/s", "KV capacity limit"],
        rows,
        caption=(
            f"Per context: the knee is the most requests at once that still each get at least "
            f"{share} of the single-stream speed; the KV capacity limit is where the planner found "
            "the requests would not fit the server's KV cache."
        ),
        classes=[["txt", "", "txt", "", "txt"] for _ in rows],
    )
    return Section("Summary", items=items, table=tbl if rows else None, anchor="summary")


def flagged_item(measured: list[list[str]]) -> tuple[str, str]:
    """The summary's "Flagged cells" line from the flags of each measured cell."""
    why: dict[str, int] = {}
    for flags in measured:
        for f in flags:
            why[f] = why.get(f, 0) + 1
    n_flagged = sum(1 for flags in measured if flags)
    if not n_flagged:
        return ("Flagged cells", f"None of {len(measured)} measured cells")
    text = ", ".join(
        f"{FLAG_SHORT.get(f, f)} ({n})" for f, n in sorted(why.items(), key=lambda kv: -kv[1])
    )
    line = f"{n_flagged} of {len(measured)} measured cells ({fmt.FLAG_MARK} in the grid): "
    return ("Flagged cells", f"{line}{text}; see Flags")


def _rate_row(
    label: str, peak: Any, loads: list[Any], kept_behind_over: tuple[list, list, list]
) -> list[str]:
    """A context's row of the request-rate summary."""
    kept, behind, over = kept_behind_over
    best = int(np.nanargmax(peak)) if np.isfinite(peak).any() else None
    return [
        label,
        fmt.DASH if best is None else f"{fmt.tok_s(peak[best])} at {load_text(loads[best], True)}",
        load_text(max(kept), True) if kept else fmt.DASH,
        load_text(min(behind), True)
        if behind
        else ("kept up at every rate measured" if kept else fmt.DASH),
        load_text(min(over), True) if over else fmt.DASH,
    ]


def rate_summary_section(run: Run) -> Section:
    """The summary of a request-rate run: peak total tok/s and where, per context the highest
    rate the server kept up with and the first it did not, and the flagged cells."""

    grid = load_grid(run)
    items: list[tuple[str, str]] = []
    if not grid.groups:
        items.append(("Peak throughput", "No decode cell was measured."))
        return Section("Summary", items=items, anchor="summary")
    tot = figure_grid(run, "total_tok_s")
    vals = tot.to_numpy(float)
    if not vals.size or not np.isfinite(vals).any():
        items.append(("Peak throughput", "No decode cell was measured."))
    else:
        pi, pj = np.unravel_index(np.nanargmax(vals), vals.shape)
        items.append(
            (
                "Peak throughput",
                (
                    f"{fmt.tok_s(vals[pi, pj])} total tok/s at {tot.index[pi]} context × "
                    f"{load_text(tot.columns[pj], True)}"
                ),
            )
        )
    rows = []
    measured: list[list[str]] = []  # the flags of each measured cell
    for i, ctx in enumerate(grid.contexts):
        kept: list[Any] = []
        behind: list[Any] = []
        over: list[Any] = []
        for x, cells, st in grid.row(ctx):
            if st == "over_capacity":
                over.append(x)
            if st not in ("valid", "queued"):
                continue
            measured.append(cell_flags(cells))
            (behind if "behind" in measured[-1] else kept).append(x)
        rows.append(
            _rate_row(grid.labels[i], tot.iloc[i].to_numpy(float), grid.loads, (kept, behind, over))
        )
    items.append(flagged_item(measured))
    tbl = Table(
        [
            "Context",
            "Peak total tok/s",
            "Highest rate kept up",
            "Could not keep up from",
            "Over capacity from",
        ],
        rows,
        caption=(
            "Per context: the highest request rate whose backlog did not grow through the "
            "window, the first that did (the server could not keep up), and the first rate "
            "not run because its requests in flight would not fit the KV cache."
        ),
        classes=[["txt", "", "txt", "txt", "txt"] for _ in rows],
    )
    return Section("Summary", items=items, table=tbl if rows else None, anchor="summary")
