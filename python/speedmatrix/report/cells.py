"""What every section reads of a run's cells: their order, the flags and statuses the
verdict gave them (read here, never decided), a grid cell's stacked lines, the sentences
that explain the marks, and a cell's load (requests at once, or a request rate)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from speedmatrix.report import formatting as fmt
from speedmatrix.results import combined_status

if TYPE_CHECKING:  # pragma: no cover
    from speedmatrix.results import Run


FLAG_TEXT = {
    "busy_at_start": "Busy at start: the server was not idle when the cell began.",
    "drift": "Drift: throughput changed significantly across the window.",
    "prompt_mismatch": "Prompt mismatch: the server counted a different prompt length than asked.",
    "estimated_tokens": (
        "Estimated tokens: output tokens were counted one per streamed chunk, not taken "
        "from the server's usage, so they can read low where a chunk carries several tokens."
    ),
    "client_bound": "Client bound: the benchmark client was busy enough to limit the figures.",
    "interrupted": "Interrupted: the run stopped during or after this cell.",
    "server_running_mismatch": (
        "Server running mismatch: the server ran more requests than the "
        "cell sent (work left over from earlier cells)."
    ),
    "long_ramp": (
        "Long ramp: the N requests did not all stream (nor settle at a plateau) before "
        "the ramp cap, so the window opened before steady state and the figures may "
        "read lower."
    ),
    "stalls": (
        "Stalls: streams went silent mid-window and were cut and replaced (errors.stall); "
        "the figures are those of the other streams."
    ),
    "ttft_unserved": (
        "TTFT reads low: requests sent in the window were still waiting for their "
        "first token when it ended, longer than the median TTFT, which counts only "
        "the requests that got one (see the cell's ttft_unserved)."
    ),
    "output_not_forced": (
        "Output not forced: the server cannot be told to ignore end-of-sequence, "
        "so requests may end early and be replaced (more prefill in the window)."
    ),
    "rate_limited": (
        "Rate limited: the server answered 429 Too Many Requests (errors.http_429); each "
        "slot waited as it asked (Retry-After, at most 10 s) or backed off (backoffs, "
        "backoff_s), so the figures are those of a throttled client, not the server's capacity."
    ),
    "behind": (
        "Server could not keep up: at this request rate the backlog grew through the "
        "window (latency from the scheduled time grew, or arrivals were unfinished at "
        "the drain bound; see the cell's open_loop.reason)."
    ),
}


FLAG_SHORT = {
    "busy_at_start": "Busy at start",
    "drift": "Drift",
    "prompt_mismatch": "Prompt mismatch",
    "estimated_tokens": "Estimated tokens",
    "client_bound": "Client bound",
    "interrupted": "Interrupted",
    "server_running_mismatch": "Server running mismatch",
    "long_ramp": "Long ramp",
    "stalls": "Stalls",
    "output_not_forced": "Output not forced",
    "ttft_unserved": "TTFT reads low",
    "behind": "Server could not keep up",
    "rate_limited": "Rate limited",
}


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
    """Why a cell is `error`: ``not_run`` (the server stopped answering before it),
    ``failed`` (it ran and too many of its requests failed) or ``unmeasured`` (it could not
    be measured at all: no prompts, no window, no output)."""
    if any(not fmt.missing(c.get("not_run")) for c in cells):
        return "not_run"
    for c in cells:
        errs = c.get("errors_total")
        ran = not fmt.missing(c.get("measured_s")) and float(c.get("measured_s") or 0) > 0
        if errs is not None and not fmt.missing(errs) and int(errs) > 0 and ran:
            return "failed"
    return "unmeasured"


def cell_flags(cells: list[dict]) -> list[str]:
    """The flags of a matrix cell's reported repetitions (valid and queued), in first-seen
    order."""
    out: list[str] = []
    for c in cells:
        if c.get("status") not in ("valid", "queued"):
            continue
        flags = c.get("flags")
        for f in list(flags) if isinstance(flags, (list, tuple, np.ndarray)) else []:
            if f not in out:
                out.append(str(f))
    return out


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
