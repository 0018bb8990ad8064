"""The report's client section: per decode cell, the event loops the client ran with, its
CPU, and its headroom against this host's roofline (`speedmatrix selftest`, docs/SCALE.md)
— so a reader sees the client was not the bottleneck, or where it came close."""

from __future__ import annotations

from typing import TYPE_CHECKING

from speedmatrix.report import formatting as fmt
from speedmatrix.report.cells import load_header, load_of, ordered_cells
from speedmatrix.report.model import Section, Table

if TYPE_CHECKING:  # pragma: no cover
    from speedmatrix.results import Run

#: the flag the section explains
NEAR = "client_near_limit"


def _roofline_text(roof: dict | None) -> str:
    if not roof:
        return (
            "No client roofline for the host of this run (`speedmatrix selftest` never ran "
            "there): the headroom is unknown."
        )
    rows = roof.get("loops") or []
    parts = [
        f"{r.get('client_threads')} loop(s) {fmt.count(r.get('events_per_s'))} events/s, "
        f"{fmt.count(r.get('requests_per_s'))} requests/s"
        for r in rows
    ]
    return (
        f"The client's roofline on {roof.get('host')} ({roof.get('cpus')} CPUs, measured "
        f"{roof.get('measured_at')} by `speedmatrix selftest`): {'; '.join(parts)}. Headroom "
        "is that over what the cell's window made the client take in; below 2× the cell is "
        "flagged client near its limit."
    )


def client_section(run: Run) -> Section | None:
    """The client's view per decode cell; None for a run with none."""
    rows, kept = [], []
    for c in ordered_cells(run):
        if c["phase"] != "decode" or c["status"] in ("over_capacity", "error"):
            continue
        if c.get("predicted") is True:  # the twin's cell: no client ever ran it
            continue
        kept.append(c)
        head = c.get("client_headroom")
        near = NEAR in (c.get("flags") or [])
        rows.append(
            [
                c["label"],
                load_of(c),
                fmt.count(c.get("client_threads") or 1),
                fmt.one(c.get("client_cpu_s")),
                fmt.DASH if head is None or fmt.missing(head) else f"{float(head):.1f}×",
                "near its limit" if near else "",
            ]
        )
    if not rows:
        return None
    columns = ["Context", load_header(run), "Client threads", "Client CPU (s)", "Headroom", ""]
    shards = [1 if fmt.missing(c.get("shards")) else int(c["shards"]) for c in kept]
    if any(k > 1 for k in shards):  # --ray: loops per shard, CPU summed over the shards
        columns.insert(2, "Client shards")
        for row, k in zip(rows, shards):
            row.insert(2, fmt.count(k))
    tbl = Table(columns, rows, caption="The benchmark client in each cell.")
    return Section(
        "Client headroom",
        table=tbl,
        text=[_roofline_text(run.meta.get("client_roofline"))],
        anchor="client-headroom",
    )
