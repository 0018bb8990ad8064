"""What every section reads of a run's cells: their order, the flags and statuses the
verdict gave them (read here, never decided), a grid cell's stacked lines, the sentences
that explain the marks, and a cell's load (requests at once, or a request rate)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from speedmatrix.report import formatting as fmt
from speedmatrix.results import combined_status
from speedmatrix.verdict import Flag, reported_flags
from speedmatrix.verdict import error_kind as verdict_error_kind

if TYPE_CHECKING:  # pragma: no cover
    from speedmatrix.results import Run


# a flag's words are the verdict's (speedmatrix.verdict.names), written once
FLAG_TEXT = {f.value: f.text for f in Flag}
FLAG_SHORT = {f.value: f.short for f in Flag}


def by_rate(run: Run) -> bool:
    """True for a request-rate (open-loop) run: its decode cells are contexts × rates."""
    return any(
        c.get("phase") == "decode" and c.get("rate_per_s") is not None
        for c in run.doc.get("cells") or []
    )


def ordered_cells(run: Run) -> list[dict]:
    df = run.cells
    if df.empty:
        return []
    order = {"prefill": 0, "decode": 1}
    df = df.assign(_p=df["phase"].map(order).fillna(2))
    keys = ["_p", "context", "concurrency", "repetition"]
    if "rate_per_s" in df:  # an open-loop run: its cells by rate (concurrency is the gate)
        keys.insert(3, "rate_per_s")
    df = df.sort_values(keys, kind="stable")
    return [r.to_dict() for _, r in df.iterrows()]


def error_kind(cells: list[dict]) -> str:
    """Why a cell is `error` (`speedmatrix.verdict.error_kind`)."""
    return verdict_error_kind(cells)


def cell_flags(cells: list[dict]) -> list[str]:
    """The flags of a matrix cell's reported repetitions (`speedmatrix.verdict.reported_flags`)."""
    return reported_flags(cells)


def decode_cells(run: Run) -> dict[tuple[int, int], list[dict]]:
    """The decode cells of each (context, concurrency), repetitions together."""
    out: dict[tuple[int, int], list[dict]] = {}
    for c in ordered_cells(run):
        if c.get("phase") == "decode":
            out.setdefault((int(c["context"]), int(c["concurrency"])), []).append(c)
    return out


def cell_lines(
    status: str | None,
    total: Any,
    ttft: Any,
    errors_total: Any,
    flags: list[str] | None = None,
    error_kind: str = "failed",
) -> list[str]:
    if status is None:
        return ["Not measured"]
    if status == "over_capacity":
        return ["Over capacity"]
    if status == "error":
        if error_kind == "not_run":
            return ["Not run"]
        lines = ["Error"]
        if error_kind == "failed" and not fmt.missing(errors_total) and int(errors_total):
            lines.append(f"{fmt.count(errors_total)} failed")
        elif error_kind == "unmeasured":
            lines.append("not measured")
        return lines
    lines = [fmt.tok_s(total)]
    if status == "queued":
        lines.append("Requests queued")
    lines.append(f"{fmt.ms(ttft)} TTFT")
    if flags:
        lines.append(f"{fmt.FLAG_MARK} " + ", ".join(FLAG_SHORT.get(f, f) for f in flags))
    return lines


def status_notes(run: Run, statuses: list[Any], kinds: list[str], flagged: bool) -> list[str]:
    """The sentences that explain the grid's marks, one per kind of mark present."""
    text = []
    if flagged:
        text.append(fmt.FLAGGED_LEGEND)
    if "failed" in kinds:
        text.append(fmt.ERROR_FAILED_LEGEND)
    if "unmeasured" in kinds:
        text.append(fmt.ERROR_UNMEASURED_LEGEND)
    if "not_run" in kinds:
        text.append(fmt.NOT_RUN_LEGEND)
    if any(s is None for s in statuses):
        text.append(fmt.NOT_MEASURED_LEGEND)
    return text


def load_of(c: dict) -> str:
    """A cell's load as the tables show it: requests at once, or the request rate of an
    open-loop cell (whose concurrency is only its gate)."""
    rate: Any = c.get("rate_per_s")
    if not fmt.missing(rate):
        return f"{float(rate):g} req/s"
    return fmt.count(c.get("concurrency"))


def load_header(run: Run) -> str:
    return "Load (requests at once or req/s)" if by_rate(run) else "Requests at once"


def load_text(x: Any, rate: bool) -> str:
    """``8 req/s`` or ``16 at once``."""
    if fmt.missing(x):
        return fmt.DASH
    v = float(x)
    if rate:
        return f"{v:,.3g} req/s" if v < 1000 else f"{v:,.0f} req/s"
    return f"{v:,.3g} at once" if not v.is_integer() else f"{int(v):,d} at once"


def status_of(cells: list[dict]) -> str | None:
    return combined_status([str(c.get("status") or "") for c in cells]) if cells else None


def cell_class(status: str | None) -> str:
    return {"over_capacity": "over", "queued": "queued", "error": "error", None: "missing"}.get(
        status, "valid"
    )


def status_lines(status: str | None, cells: list[dict]) -> list[str]:
    kind = error_kind(cells) if status == "error" else "failed"
    errs = sum(
        int(c.get("errors_total") or 0) for c in cells if not fmt.missing(c.get("errors_total"))
    )
    return cell_lines(status, None, None, errs, None, kind)


def missing_cells(run: Run) -> list[tuple[str, int, str]]:
    """(phase, context, load text) of the matrix's cells the run never reached."""
    by_rate = bool(run.matrix_definition["request_rates"])
    return [
        (p, c, f"{n:g} req/s" if by_rate and p == "decode" else fmt.count(n))
        for p, c, n in run.missing_cells()
    ]


def rate_text(v: Any) -> str:
    """A goodput in req/s: two decimals below 10, one above."""
    if fmt.missing(v):
        return fmt.DASH
    v = float(v)
    return f"{v:,.2f}" if abs(v) < 10 else f"{v:,.1f}"


def share_text(v: Any) -> str:
    return fmt.DASH if fmt.missing(v) else f"{float(v) * 100:.1f}%"
