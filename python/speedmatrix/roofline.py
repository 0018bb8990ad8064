"""The client's roofline on this host as a file (`speedmatrix selftest` measures it,
speedmatrix.selftest): where it is kept per host, reading and writing it, what a run
copies into run.json (``meta["client_roofline"]``), and its text table. No I/O beyond the
cache file, so a run reads it without loading the engine."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

__all__ = [
    "cache_path",
    "default_loops",
    "format_table",
    "load_cached",
    "roofline_for_run",
    "save",
]


def default_loops(cpus: int | None = None) -> list[int]:
    """1, 2, 4, ... up to the cores minus one (at least 1 and 2)."""
    most = max((cpus or os.cpu_count() or 1) - 1, 2)
    out = [1]
    while out[-1] * 2 < most:
        out.append(out[-1] * 2)
    if out[-1] != most:
        out.append(most)
    return out


def cache_path(host: str | None = None) -> Path:
    """Where this host's roofline is kept: $SPEEDMATRIX_SELFTEST_DIR/<host>.json, else
    $XDG_CACHE_HOME (else ~/.cache)/speedmatrix/selftest/<host>.json."""
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in (host or platform.node()))
    folder = os.environ.get("SPEEDMATRIX_SELFTEST_DIR")
    if folder:
        return Path(folder) / f"{name or 'host'}.json"
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "speedmatrix" / "selftest" / f"{name or 'host'}.json"


def load_cached(host: str | None = None) -> dict | None:
    """This host's cached roofline, or None (none yet, or unreadable)."""
    try:
        data = json.loads(cache_path(host).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("loops") else None


def save(roofline: dict) -> Path:
    path = cache_path(roofline.get("host"))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(roofline, indent=1))
    tmp.replace(path)
    return path


def roofline_for_run() -> dict | None:
    """What a run copies into run.json when it starts: the cached roofline of this host
    (None when `speedmatrix selftest` never ran here: a run does not measure it itself)."""
    return load_cached()


def format_table(roofline: dict) -> str:
    """The roofline as a text table."""
    head = (
        f"client roofline of {roofline.get('host')} ({roofline.get('cpus')} CPUs, load "
        f"average {roofline.get('load_average')}, {roofline.get('measured_at')})"
    )
    lines = [
        head,
        (
            f"{'loops':>5}  {'requests/s':>10}  {'events/s':>10}  {'tokens/s':>11}  "
            f"{'lockstep p99':>12}"
        ),
    ]
    for r in roofline.get("loops") or []:
        lines.append(
            f"{r['client_threads']:>5}  {r['requests_per_s']:>10,.0f}  {r['events_per_s']:>10,.0f}"
            f"  {r['tokens_per_s']:>11,.0f}  {r['lockstep_p99_delay_ms']:>9.2f} ms"
            f" ({r['lockstep_streams']} streams)"
        )
    return "\n".join(lines)
