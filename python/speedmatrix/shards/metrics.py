"""The server's /metrics sampled once, by the driver, over a sharded cell (the shards
sample nothing): the core's reduction (`_core.reduce_prometheus`) of each page, stamped
on the driver's clock when the scrape was asked, in the shape of a cell's samples."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from speedmatrix._native import _core

__all__ = ["MetricsSampler"]


class MetricsSampler:
    """``s = MetricsSampler(get_text, url, names, how, interval_s)``; ``s.start()`` ...
    ``s.finish()``; then ``s.samples()``. ``get_text(url) -> str`` raises on a failed scrape (counted)."""

    def __init__(
        self,
        get_text: Callable[[str], str],
        url: str,
        names: list[str],
        how: list[str],
        interval_s: float = 0.25,
    ):
        self._get, self._url = get_text, url
        self._names, self._how = list(names), list(how)
        self._interval_s = interval_s if interval_s > 0 else 0.25
        self._t: list[int] = []
        self._values: list[list[float]] = []
        self._failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="speedmatrix-metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def finish(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            t = int(_core.now_ns())
            try:
                text = self._get(self._url)
                values = list(_core.reduce_prometheus(text, self._names, self._how))
            except Exception:  # noqa: BLE001 - a failed scrape is counted, as the core does
                self._failures += 1
            else:
                self._t.append(t)
                self._values.append(values)
            self._stop.wait(self._interval_s)

    def latest(self) -> dict[str, float]:
        """The latest sample by name (the live view's server gauges); {} before one."""
        if not self._values:
            return {}
        return dict(zip(self._names, self._values[-1]))

    def samples(self) -> dict[str, Any]:
        """``{"names", "t_ns", "values" (samples x names), "failures"}``."""
        values = np.asarray(self._values, dtype=float).reshape(len(self._t), len(self._names))
        return {
            "names": list(self._names),
            "t_ns": np.asarray(self._t, dtype=np.int64),
            "values": values,
            "failures": self._failures,
        }
