"""The status rule of a measured decode cell: error, queued or valid, and why.

Pure: it reads the cell's counts, the server's view (`speedmatrix.verdict.server`) and the
client's, and the rules. Statuses of cells not measured (over capacity, prompts that
could not be made, a window that never started) are set where those cells are made
(`speedmatrix.verdict.cells`).
"""

from __future__ import annotations

from speedmatrix.verdict.names import Status
from speedmatrix.verdict.rules import Rules

__all__ = ["decode_status", "error_text"]


def error_text(errors: dict[str, int], examples: dict[str, str]) -> str:
    """ "http_500 x4, connect x1" and the first message of the most frequent kind."""
    text = ", ".join(f"{k} x{v}" for k, v in sorted(errors.items()))
    if errors:
        top = max(sorted(errors), key=lambda k: errors[k])
        if examples.get(top):
            text += f" ({top}: {examples[top]})"
    return text


def decode_status(
    rules: Rules,
    *,
    errors: dict[str, int],
    error_examples: dict[str, str],
    started: int,
    output_tokens: int,
    server: dict | None,
    queued_client: float,
    stopped_by: str = "",
    stop_reason: str = "",
) -> tuple[Status, str | None]:
    """A measured decode cell's status and its reason (None for a valid cell).

    ``started``: the requests failures count against (closed loop: sent from the ramp's
    start; open loop: the window's arrivals), at least 1; ``server``: `server_view` (None
    without metrics); ``queued_client``: `client_queue_signal`."""
    errors_total = sum(errors.values())
    if stopped_by == "unreachable":
        # the core ended the window: connections kept failing (its one line says how)
        return Status.ERROR, stop_reason or "the server stopped accepting connections"
    if errors_total > rules.error_threshold * started or output_tokens == 0:
        if not errors:
            return Status.ERROR, "no output tokens in the window"
        return Status.ERROR, (
            f"{errors_total} of {started} requests failed: " + error_text(errors, error_examples)
        )
    held = (server or {}).get("waiting_held_mean")
    if server and (held or 0) >= rules.queue_gap_requests:
        return Status.QUEUED, (
            f"the server kept {held:.1f} requests waiting on "
            f"average (up to {server['waiting_max']:g}) once the first wave was "
            "admitted, while it ran no more than before"
        )
    if held is None and queued_client > rules.queue_gap_requests:
        # No waiting count from the server (no metrics, or metrics without a waiting
        # gauge): the client's view decides.
        why = "no server metrics" if not server else "the server reports no waiting count"
        return Status.QUEUED, (
            f"on average {queued_client:.1f} requests were in flight without streaming ({why})"
        )
    return Status.VALID, None
