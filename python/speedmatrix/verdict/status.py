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
    concurrency: int | None = None,
) -> tuple[Status, str | None]:
    """A measured decode cell's status and its reason (None for a valid cell).

    ``started``: the requests failures count against (closed loop: sent from the ramp's
    start; open loop: the window's arrivals), at least 1; ``server``: `server_view` (None
    without metrics); ``queued_client``: `client_queue_signal`; ``concurrency``: a closed
    loop's N (None for an open loop, whose in-flight count is not asked)."""
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
    capped = _running_capped(rules, server, concurrency)
    if capped:
        return Status.QUEUED, capped
    if held is None and queued_client > rules.queue_gap_requests:
        # No waiting count from the server (no metrics, or metrics without a waiting
        # gauge): the client's view decides.
        why = "no server metrics" if not server else "the server reports no waiting count"
        return Status.QUEUED, (
            f"on average {queued_client:.1f} requests were in flight without streaming ({why})"
        )
    return Status.VALID, None


def _running_capped(rules: Rules, server: dict | None, concurrency: int | None) -> str | None:
    """The reason a cell is queued when the server never ran all N at once and requests
    waited on average at least the gap once the first wave settled, held or not. Short
    requests against the sampling interval can hide a queue from the held rule: a sample
    that falls between one request's end and the closed loop's next send reads no
    waiting, breaking every run of held samples (llama.cpp, 70 ms requests against
    250 ms samples), while its running gauge never once reaches N."""
    if not server or not concurrency:
        return None
    running_max, settled = server.get("running_max"), server.get("waiting_mean_settled")
    if running_max is None or settled is None:
        return None
    if running_max >= concurrency or settled < rules.queue_gap_requests:
        return None
    return (
        f"the server never ran more than {running_max:g} of the {concurrency} requests "
        f"at once and kept {settled:.1f} waiting on average once the first wave settled"
    )
