"""The HTML report in a real headless browser (Debian's chromium): no console errors, no
network requests, charts and tables present. Driven over the DevTools protocol with aiohttp."""

import asyncio
import base64
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import synthetic

#: where the screenshots go: $SPEEDMATRIX_ARTIFACTS, else build/test-artifacts in the clone
ARTIFACTS = Path(
    os.environ.get("SPEEDMATRIX_ARTIFACTS")
    or Path(__file__).resolve().parents[2] / "build" / "test-artifacts"
)

# End-to-end tier: a real browser.
pytestmark = [pytest.mark.browser, pytest.mark.e2e]

CHROMIUM = next(
    (
        p
        for p in (
            shutil.which("chromium"),
            shutil.which("chromium-browser"),
            shutil.which("google-chrome"),
        )
        if p
    ),
    None,
)


class Page:
    """A minimal DevTools client: one page target, commands and collected events."""

    def __init__(self, ws):
        self.ws = ws
        self.next_id = 0
        self.pending: dict[int, asyncio.Future] = {}
        self.events: list[dict] = []
        self.waiters: list[tuple[str, asyncio.Future]] = []
        self.reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self):
        async for msg in self.ws:
            data = json.loads(msg.data)
            if "id" in data and data["id"] in self.pending:
                self.pending.pop(data["id"]).set_result(data)
            elif "method" in data:
                self.events.append(data)
                for name, fut in list(self.waiters):
                    if name == data["method"] and not fut.done():
                        fut.set_result(data)

    async def send(self, method, **params):
        self.next_id += 1
        fut = asyncio.get_running_loop().create_future()
        self.pending[self.next_id] = fut
        await self.ws.send_str(json.dumps({"id": self.next_id, "method": method, "params": params}))
        res = await asyncio.wait_for(fut, 30)
        if "error" in res:
            raise RuntimeError(f"{method}: {res['error']}")
        return res.get("result", {})

    def expect(self, method):
        fut = asyncio.get_running_loop().create_future()
        self.waiters.append((method, fut))
        return fut

    async def eval(self, expr):
        res = await self.send("Runtime.evaluate", expression=expr, returnByValue=True)
        return res["result"].get("value")


def _start_chromium(profile):
    cmd = [
        CHROMIUM,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-sync",
        "--remote-debugging-port=0",
        "--remote-allow-origins=*",
        f"--user-data-dir={profile}",
        "about:blank",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    lines = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            if proc.poll() is not None:
                break
            continue
        lines.append(line)
        m = re.search(r"DevTools listening on (ws://\S+)", line)
        if m:
            return proc, m.group(1)
    proc.kill()
    raise RuntimeError("chromium did not start:\n" + "".join(lines[-20:]))


async def _inspect(url, screenshot: str | None = None):
    import aiohttp

    profile = tempfile.mkdtemp(prefix="sm-chromium-")
    proc, browser_ws = _start_chromium(profile)
    try:
        port = re.search(r":(\d+)/", browser_ws).group(1)
        async with aiohttp.ClientSession() as http:
            for _ in range(50):
                async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
                    targets = [t for t in await r.json() if t.get("type") == "page"]
                if targets:
                    break
                await asyncio.sleep(0.1)
            async with http.ws_connect(targets[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                page = Page(ws)
                for domain in ("Runtime", "Log", "Page", "Network"):
                    await page.send(f"{domain}.enable")
                loaded = page.expect("Page.loadEventFired")
                await page.send("Page.navigate", url=url)
                await asyncio.wait_for(loaded, 30)
                await asyncio.sleep(0.3)  # late console messages
                info = {
                    "svg": await page.eval("document.querySelectorAll('figure.chart svg').length"),
                    "svg_sizes": await page.eval(
                        "[...document.querySelectorAll('figure.chart svg')].map(s => "
                        "s.getBoundingClientRect().width * s.getBoundingClientRect().height)"
                    ),
                    "h2": await page.eval(
                        "[...document.querySelectorAll('h2')].map(h => h.textContent)"
                    ),
                    "matrix_rows": await page.eval(
                        "document.querySelectorAll('table.matrix tbody tr').length"
                    ),
                    "matrix_cols": await page.eval(
                        "document.querySelector('table.matrix thead tr').children.length"
                    ),
                    "over": await page.eval("document.querySelectorAll('td.over').length"),
                    "title": await page.eval("document.title"),
                    "flagged": await page.eval("document.querySelectorAll('td.flagged').length"),
                    "below": await page.eval("document.querySelectorAll('td.below').length"),
                    "charts": await page.eval(
                        "[...document.querySelectorAll('figure.chart')].map(f => f.id)"
                    ),
                }
                if screenshot:
                    info["screenshots"] = await _screenshots(page, screenshot)
                page.reader.cancel()
                return info, page.events
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(profile, ignore_errors=True)


async def _screenshots(page, name: str) -> list[Path]:
    """The top of the page as a reader first sees it (1280 × 900) and the whole page, as PNG
    files under ARTIFACTS, for a person to look at."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await page.send(
        "Emulation.setDeviceMetricsOverride",
        width=1280,
        height=900,
        deviceScaleFactor=1,
        mobile=False,
    )
    await asyncio.sleep(0.2)
    out = []
    for suffix, full in (("top", False), ("full", True)):
        res = await page.send("Page.captureScreenshot", format="png", captureBeyondViewport=full)
        path = ARTIFACTS / f"{name}-{suffix}.png"
        path.write_bytes(base64.b64decode(res["data"]))
        out.append(path)
    return out


def _problems(events):
    out = []
    for e in events:
        m, p = e["method"], e.get("params", {})
        if m == "Runtime.exceptionThrown":
            out.append(("exception", p["exceptionDetails"].get("text")))
        elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append(("console", [a.get("value") for a in p.get("args", [])]))
        elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
            out.append(("log", p["entry"].get("text")))
    return out


def _requests(events):
    return [
        e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"
    ]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_report_html_in_headless_chromium():
    d = synthetic.shared_run("full", report=True)
    info, events = asyncio.run(_inspect((d / "report.html").resolve().as_uri(), "report"))
    assert _problems(events) == []
    assert all(p.stat().st_size > 20_000 for p in info["screenshots"])
    assert all(u.startswith(("file:", "data:", "about:")) for u in _requests(events)), _requests(
        events
    )
    assert info["svg"] >= 6 and all(s > 10_000 for s in info["svg_sizes"])
    assert info["h2"][:8] == [
        "Summary",
        "Hardware",
        "Engine",
        "Run",
        "Launch command",
        "Prefill",
        "Sustained decode",
        "All measurements",
    ]
    assert info["matrix_rows"] == 5 and info["matrix_cols"] == 9
    run = json.loads((d / "run.json").read_text())
    assert info["over"] == sum(c["status"] == "over_capacity" for c in run["cells"])
    flagged = {
        (c["context"], c["concurrency"])
        for c in run["cells"]
        if c["phase"] == "decode" and c["flags"] and c["status"] in ("valid", "queued")
    }
    assert info["flagged"] == len(flagged) > 0
    assert info["title"].startswith("Speed test matrix")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_slo_report_html_in_headless_chromium(tmp_path):
    """A report judged against an SLO (the goodput grid, the capacity table and chart) renders
    with no console error, its below-target cells marked in the page."""
    from speedmatrix.report import write_report
    from speedmatrix.results import load

    d = tmp_path / "slo"
    synthetic.build_run(
        d, contexts=(8192, 32768), concurrency=(1, 4, 16, 64), prefill_contexts=(), duration_s=2.0
    )
    tbt = sorted(c["tbt_ms"] for c in load(d).doc["cells"] if c.get("tbt_ms"))
    write_report(d, slo=f"tpot={(tbt[0] + tbt[-1]) / 2:.3f}ms", attainment="90%")
    info, events = asyncio.run(_inspect((d / "report.html").resolve().as_uri(), "report-slo"))
    assert _problems(events) == []
    assert all(u.startswith(("file:", "data:", "about:")) for u in _requests(events))
    assert {"Goodput at SLO", "Capacity at SLO"} <= set(info["h2"])
    md = (d / "report.md").read_text()
    assert info["below"] == md.count("▼ below") > 0
    assert "chart-capacity_vs_load" in info["charts"]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_the_checker_sees_console_errors(tmp_path):
    """The harness itself must be able to fail: a page with a script error is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        "<!DOCTYPE html><html><body><script>console.error('boom');"
        "undefinedFunction();</script><svg></svg></body></html>"
    )
    _, events = asyncio.run(_inspect(bad.as_uri()))
    kinds = {k for k, _ in _problems(events)}
    assert {"console", "exception"} <= kinds


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_compare_html_in_headless_chromium(tmp_path):
    from speedmatrix.report.compare import write_compare

    _, html_path = write_compare(
        synthetic.shared_run("full"), synthetic.shared_run("faster"), tmp_path / "cmp"
    )
    info, events = asyncio.run(_inspect(html_path.resolve().as_uri(), "compare"))
    assert _problems(events) == []
    assert all(u.startswith(("file:", "data:", "about:")) for u in _requests(events))
    assert info["svg"] == 2
    assert info["h2"][:2] == ["Runs", "Sustained decode"]
    assert info["matrix_rows"] == 5
