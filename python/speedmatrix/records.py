"""A cell's raw records, the same type whether live or saved.

`Records.from_result` takes a live `_core.CellResult`; `Records.from_saved` reads a
saved ``records/<cell>.npz`` (through `speedmatrix.runfile.load_records`). Both give
the request and event columns, the /metrics samples and the cell's clock stamps
(window, warm-up start, end) with the client's own figures: everything
`speedmatrix.verdict` needs and nothing else.

Per-token arrivals, gaps and bins have one derivation, the C++ one
(`_core.token_arrivals`, `_core.summarize_cell`): `Records.arrivals` and
`Records.bins` return its arrays, used by `speedmatrix.results.Run`, the plots and
`compare`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from speedmatrix._native import _core
from speedmatrix.runfile import load_records

__all__ = ["STAMPS", "Records", "tbt_samples", "token_arrivals"]

_OUTCOME_ERROR = 3  # Outcome::kError (records.hpp)

#: the per-cell scalars saved beside the arrays (``cell_<name>`` in the npz)
STAMPS = (
    "ramp_start_ns",
    "ramp_capped",
    "stopped_by",
    "stalls",
    "warmup_retried",
    "backoffs",
    "backoff_s",
    "stop_reason",
    "window_start_ns",
    "window_end_ns",
    "warmup_start_ns",
    "end_ns",
    "client_cpu_s",
    "client_threads",
    "shards",
    "loop_lag_max_ms",
    "fatal_error",
    "events_note",
)


def _empty_metrics() -> dict[str, Any]:
    return {"names": [], "t_ns": np.zeros(0, np.int64), "values": np.zeros((0, 0)), "failures": 0}


@dataclass
class Records:
    """One cell's raw records: ``requests`` and ``events`` (dicts of column arrays),
    ``metrics`` (``names``, ``t_ns``, ``values``, ``failures``) and the cell's stamps.

    Also readable as a mapping (``rec["requests"]``) for code written against the
    dicts `Run.records` used to return."""

    requests: dict[str, np.ndarray]
    events: dict[str, np.ndarray]
    metrics: dict[str, Any] = field(default_factory=_empty_metrics)
    #: the window's first N requests were sent (-1: a run saved before steady-state
    #: windows, whose window opened at the send: t0)
    ramp_start_ns: int = -1
    #: the ramp cap, not steady state, opened the window
    ramp_capped: bool = False
    #: why the window ended: "duration" | "precision" | "requests" | "stop" | "unreachable"
    #: ("" = unknown)
    stopped_by: str = ""
    #: "unreachable": the core's one line on the connections that failed in a row
    stop_reason: str = ""
    #: window requests the loop cut as stalls; warm-up requests sent a second time
    stalls: int = 0
    warmup_retried: int = 0
    #: closed loop: slot waits the core imposed after a 429 (Retry-After) or a failed
    #: connection, and the slot time they took in the window (s)
    backoffs: int = 0
    backoff_s: float = 0.0
    window_start_ns: int = -1
    window_end_ns: int = -1
    warmup_start_ns: int = -1
    end_ns: int = -1
    client_cpu_s: float = 0.0
    #: the event loops the client ran the cell with (1: a run saved before there were more)
    client_threads: int = 1
    #: the client processes the cell ran on (--ray --shards: its records are their pooled
    #: records, `speedmatrix.shards`; 1: one process)
    shards: int = 1
    loop_lag_max_ms: float = 0.0
    fatal_error: str = ""
    #: why the token events were held in memory instead of spilled to disk ("" = as planned)
    events_note: str = ""
    #: stamps not in the records file (runs saved before they were) taken from the
    #: stored cell; `fatal_error` is then unknown ("")
    stamps_from_cell: bool = False

    # ---- building -----------------------------------------------------------------------
    @classmethod
    def from_result(cls, res: Any) -> Records:
        """From a live `_core.CellResult`."""
        return cls(
            requests=res.requests,
            events=res.events,
            metrics=dict(res.metrics),
            ramp_start_ns=int(res.ramp_start_ns),
            ramp_capped=bool(res.ramp_capped),
            stopped_by=str(res.stopped_by or ""),
            stop_reason=str(res.stop_reason or ""),
            stalls=int(res.stalls),
            warmup_retried=int(res.warmup_retried),
            backoffs=int(res.backoffs),
            backoff_s=float(res.backoff_s),
            window_start_ns=int(res.window_start_ns),
            window_end_ns=int(res.window_end_ns),
            warmup_start_ns=int(res.warmup_start_ns),
            end_ns=int(res.end_ns),
            client_cpu_s=float(res.client_cpu_s),
            client_threads=int(getattr(res, "client_threads", 1)),
            loop_lag_max_ms=float(res.loop_lag_max_ms),
            fatal_error=str(res.fatal_error or ""),
            events_note=str(getattr(res, "events_note", "") or ""),
        )

    @classmethod
    def from_loaded(cls, loaded: dict, cell: dict | None = None) -> Records:
        """From `speedmatrix.runfile.load_records`'s dict; stamps missing from the file
        come from the stored ``cell`` (t0_ns, t1_ns, ramp_start_ns, ramp_capped, stopped_by,
        warmup_start_ns, end_ns, client)."""
        stamps = dict(loaded.get("stamps") or {})
        cell = cell or {}
        from_cell = not stamps
        if from_cell:
            client = cell.get("client") or {}
            stamps = {
                "ramp_start_ns": cell.get("ramp_start_ns"),
                "ramp_capped": cell.get("ramp_capped"),
                "stopped_by": cell.get("stopped_by"),
                "stalls": (cell.get("errors") or {}).get("stall"),
                "warmup_retried": cell.get("warmup_retried"),
                "backoffs": cell.get("backoffs"),
                "backoff_s": cell.get("backoff_s"),
                "stop_reason": cell.get("stop_reason"),
                "window_start_ns": cell.get("t0_ns"),
                "window_end_ns": cell.get("t1_ns"),
                "warmup_start_ns": cell.get("warmup_start_ns"),
                "end_ns": cell.get("end_ns"),
                "client_cpu_s": client.get("cpu_s"),
                "client_threads": cell.get("client_threads"),
                "shards": cell.get("shards"),
                "loop_lag_max_ms": client.get("loop_lag_max_ms"),
            }

        def num(name: str, default: Any, kind: type) -> Any:
            v = stamps.get(name)
            return default if v is None else kind(v)

        return cls(
            requests=loaded.get("requests") or {},
            events=loaded.get("events") or {},
            metrics=loaded.get("metrics") or _empty_metrics(),
            ramp_start_ns=num("ramp_start_ns", -1, int),
            ramp_capped=num("ramp_capped", False, bool),
            stopped_by=str(stamps.get("stopped_by") or ""),
            stop_reason=str(stamps.get("stop_reason") or ""),
            stalls=num("stalls", 0, int),
            warmup_retried=num("warmup_retried", 0, int),
            backoffs=num("backoffs", 0, int),
            backoff_s=num("backoff_s", 0.0, float),
            window_start_ns=num("window_start_ns", -1, int),
            window_end_ns=num("window_end_ns", -1, int),
            warmup_start_ns=num("warmup_start_ns", -1, int),
            end_ns=num("end_ns", -1, int),
            client_cpu_s=num("client_cpu_s", 0.0, float),
            client_threads=num("client_threads", 1, int),
            shards=num("shards", 1, int),
            loop_lag_max_ms=num("loop_lag_max_ms", 0.0, float),
            fatal_error=str(stamps.get("fatal_error") or ""),
            events_note=str(stamps.get("events_note") or ""),
            stamps_from_cell=from_cell,
        )

    @classmethod
    def from_saved(cls, run_dir: str | os.PathLike, cell: dict) -> Records:
        """The saved records of ``cell`` (its ``records`` path) in ``run_dir``."""

        return cls.from_loaded(load_records(run_dir, cell["records"]), cell)

    def stamps(self) -> dict[str, Any]:
        """The scalars saved beside the arrays (`STAMPS`)."""
        return {name: getattr(self, name) for name in STAMPS}

    # ---- mapping access (the dict shape of older code) ------------------------------------
    def __getitem__(self, key: str) -> Any:
        if key in ("requests", "events", "metrics"):
            return getattr(self, key)
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return key in ("requests", "events", "metrics")

    # ---- derived arrays (C++) -------------------------------------------------------------
    def has_events(self) -> bool:
        return bool(self.events) and len(self.events.get("t_ns", ())) > 0

    def arrivals(self, phase: int = 1) -> dict[str, np.ndarray]:
        """Token arrivals of these records (`token_arrivals`)."""
        return token_arrivals(self.requests, self.events, phase)

    def tbt_samples(self, t0: int, t1: int) -> np.ndarray:
        """The multiset whose median is the cell's tbt_ms (`tbt_samples`)."""
        return tbt_samples(self.requests, self.events, t0, t1)

    def bins(self, t0: int, t1: int, bin_s: float = 1.0) -> np.ndarray:
        """Output tok/s per ``bin_s`` bin of [t0, t1] (`_core.summarize_cell`'s bins: a
        remainder shorter than a bin widens the last one)."""
        if not self.has_events() or t1 <= t0:
            return np.zeros(0)
        fig = _core.summarize_cell(self.requests, self.events, int(t0), int(t1), float(bin_s))
        return np.asarray(fig["bin_tok_s"], dtype=float)


def token_arrivals(requests: dict, events: dict | None, phase: int = 1) -> dict[str, np.ndarray]:
    """Token arrivals (`_core.token_arrivals`, the one derivation): ``request``, ``t_ns``,
    ``tokens``, ``gap_ms`` (ms per token since the request's previous arrival; NaN for its
    first), one read's events merged, ordered by request then time. ``phase`` 1 = window
    requests, 0 = warm-up, -1 = all."""
    if not events or not len(events.get("t_ns", ())) or not requests:
        return {
            "request": np.zeros(0, np.int32),
            "t_ns": np.zeros(0, np.int64),
            "tokens": np.zeros(0, np.int64),
            "gap_ms": np.zeros(0, float),
        }
    if "prompt_tokens" not in requests:  # not read by the arrivals; records built by hand lack it
        requests = {**requests, "prompt_tokens": np.zeros(len(requests["sent_ns"]), np.int64)}
    arrivals = _core.token_arrivals(requests, events, phase)
    return {k: np.asarray(v) for k, v in arrivals.items()}


def tbt_samples(requests: dict, events: dict | None, t0: int, t1: int) -> np.ndarray:
    """Per-token gaps (ms) between token arrivals of the window requests that did not fail,
    arrivals in [t0, t1], an arrival's gap once per token: the multiset whose median is the
    cell's ``tbt_ms`` (`_core.summarize_cell` takes its median from the same arrivals)."""
    a = token_arrivals(requests, events, 1)
    q = a["request"]
    failed = np.asarray(requests.get("outcome", ()), dtype=np.int64) == _OUTCOME_ERROR
    ok = ~failed[q] if len(failed) else np.ones(len(q), bool)
    sel = ok & (a["t_ns"] >= t0) & (a["t_ns"] <= t1) & np.isfinite(a["gap_ms"])
    return np.repeat(a["gap_ms"][sel], a["tokens"][sel])
