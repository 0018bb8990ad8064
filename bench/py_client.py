"""The reference Python client: today's common design of an LLM load
generator, written to be fair to it.

One asyncio event loop, one aiohttp session, N coroutines in a closed loop
(a finished stream is replaced at once), lines read with `async for line in
resp.content`, one `time.monotonic_ns()` per line (before json.loads, which is
CLOCK_MONOTONIC on Linux, like the core's clock), `json.loads` on every event,
tokens from `usage.completion_tokens` when the server streams it (else one per
non-empty chunk). The connector is uncapped (`limit=0`): aiohttp's default of
100 connections per host would make the comparison meaningless above 100
streams (shared/reference/measurement.md, "Connection caps").
"""

from __future__ import annotations

import asyncio
import json
import time
from array import array
from dataclasses import dataclass, field

import aiohttp


@dataclass
class PyResult:
    t0_ns: int = 0
    t1_ns: int = 0
    t_ns: array = field(default_factory=lambda: array("q"))  # arrival of each token event
    server_ns: array = field(default_factory=lambda: array("q"))  # its sm_t_ns stamp (-1 if none)
    tokens: array = field(default_factory=lambda: array("i"))
    requests: int = 0
    errors: int = 0


async def _run(url: str, body: bytes, concurrency: int, duration_s: float) -> PyResult:
    res = PyResult()
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=120)
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    t_ns, server_ns, tokens = res.t_ns, res.server_ns, res.tokens

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def slot() -> None:
            while True:
                res.requests += 1
                try:
                    async with session.post(url, data=body, headers=headers) as resp:
                        if resp.status != 200:
                            res.errors += 1
                            await resp.read()
                            continue
                        last_usage = 0
                        async for line in resp.content:
                            t = time.monotonic_ns()
                            if not line.startswith(b"data:"):
                                continue
                            payload = line[5:].strip()
                            if payload == b"[DONE]":
                                break
                            ev = json.loads(payload)
                            choices = ev.get("choices") or []
                            text = choices[0].get("text") if choices else None
                            usage = ev.get("usage")
                            if usage and usage.get("completion_tokens") is not None:
                                n = usage["completion_tokens"] - last_usage
                                last_usage = usage["completion_tokens"]
                            else:
                                n = 1 if text else 0
                            if n > 0:
                                t_ns.append(t)
                                server_ns.append(ev.get("sm_t_ns", -1))
                                tokens.append(n)
                except asyncio.CancelledError:
                    raise
                except Exception:  # noqa: BLE001 - counted; the benchmark keeps going
                    res.errors += 1

        res.t0_ns = time.monotonic_ns()
        tasks = [asyncio.create_task(slot()) for _ in range(concurrency)]
        await asyncio.sleep(duration_s)
        res.t1_ns = time.monotonic_ns()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return res


def run(url: str, body: bytes, concurrency: int, duration_s: float) -> PyResult:
    """Closed loop of `concurrency` streams for `duration_s`, then cancel."""
    return asyncio.run(_run(url, body, concurrency, duration_s))
