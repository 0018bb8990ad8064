"""A report that cannot be forged (issue 25): every string a server or a user controls (the
served model id, engine, GPU, OS, warnings, error messages, reasons) reaches report.md
escaped and on one line, and report.html escaped, so neither runs a script, loads an image
or grows a section that the run did not write."""

from __future__ import annotations

import copy
import re
from html.parser import HTMLParser

import pytest
import synthetic
from speedmatrix.report import render_report, write_report
from speedmatrix.report.markdown import LINE_CHARS, text
from speedmatrix.results import load
from speedmatrix.runfile import read_run, write_run

FORGED = "\n\n## Summary\n\n- **Peak throughput:** 999,999 tok/s\n\n# Owned"
SCRIPT = '<iframe srcdoc="<script>alert(1)</script>"></iframe>'
IMG = "<img src=x onerror=alert(2)>"
LINK = "[click](javascript:alert(3)) ![pixel](http://evil.example/p.png)"
PIPES = "a | b | c"
TICKS = "```\n## Fenced\n```"
HOSTILE = {
    ("target", "model_name"): "Evil $\\frac{$" + FORGED,  # mathtext that cannot parse
    ("target", "model"): SCRIPT,
    ("run", "served_model"): SCRIPT + FORGED,
    ("engine", "name"): "vllm " + IMG,
    ("engine", "version"): "1.0 | " + TICKS,
    ("engine", "backend"): "*bold* _em_ ~~gone~~",
    ("hardware", "gpu"): "H100 " + IMG + FORGED,
    ("hardware", "os"): LINK,
    ("hardware", "cpu"): "1. numbered\n- listed\n> quoted",
}
MARKERS = ("alert(1)", "alert(2)", "alert(3)", "999,999", "evil.example")


@pytest.fixture(scope="module")
def hostile_doc(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile-base")
    synthetic.build_run(
        d, contexts=(8192,), concurrency=(1, 2), prefill_contexts=(8192,), errors=False
    )
    doc = read_run(d)
    meta = doc["meta"]
    for (part, key), value in HOSTILE.items():
        meta.setdefault(part, {})[key] = value
    meta["warnings"] = ["discovery said: " + SCRIPT + FORGED]
    cell = next(c for c in doc["cells"] if c["phase"] == "decode")
    cell["status"] = "error"
    cell["reason"] = "server said " + IMG + FORGED + " " + PIPES
    cell["errors"] = {"http_500": 3}
    cell["error_examples"] = {"http_500": "HTTP 500: " + PIPES + " " + SCRIPT + FORGED}
    cell["errors_total"] = 3
    return doc


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, hostile_doc):
    d = tmp_path_factory.mktemp("hostile")
    write_run(d, copy.deepcopy(hostile_doc))
    md, page, svgs = render_report(load(d), charts=True)
    return md, page, svgs


def _headings(md: str) -> list[str]:
    return [line for line in md.splitlines() if re.match(r"^#{1,6}\s", line)]


def test_text_escapes_html_markdown_and_newlines():
    for raw, want in (
        ("<script>x</script>", "&lt;script&gt;x&lt;/script&gt;"),
        ("a\n\n## Summary", "a \\#\\# Summary"),
        ("a | b", "a \\| b"),
        ("`code` *b* [l](u)", "\\`code\\` \\*b\\* \\[l\\](u)"),
        ("snake_case _em_", "snake_case \\_em\\_"),
        ("- item", "- item"),  # inside a cell or an item no list starts
        ("+5.4%", "+5.4%"),
        ("0.5.6.post3+g05c", "0.5.6.post3+g05c"),  # a version is left as it reads
        ("R&D\r\nx", "R&amp;D x"),
        ("\u202eevil\x07", "evil"),
    ):
        assert text(raw) == want, raw
    for raw, want in (("- item", "\\- item"), ("1. item", "1\\. item"), ("+5%", "\\+5%")):
        assert text(raw, starts_line=True) == want, raw  # a paragraph: no list, no heading
    assert text("1.5 s", starts_line=True) == "1.5 s"
    long = text("m" * 10_000)
    assert len(long) == LINE_CHARS and long.endswith("…")


def test_markdown_has_no_forged_section_or_markup(hostile):
    md, _, _ = hostile
    heads = _headings(md)
    assert heads[0] == "# Speed test matrix"
    assert [h for h in heads if h.startswith("# ")] == ["# Speed test matrix"]
    assert sum(h == "## Summary" for h in heads) == 1
    assert "## Fenced" not in heads
    for raw in ("<script", "<iframe", "<img"):
        assert raw not in md, raw
    assert not re.search(r"(?<!\\)\]\((javascript|http)", md)  # no link nor image
    # the hostile strings are still there to read, escaped
    assert "&lt;iframe srcdoc=" in md and "H100 &lt;img src=x onerror=alert(2)&gt;" in md
    # each table row has as many cells as its header: a pipe in a message splits nothing
    for block in re.split(r"\n\n", md):
        rows = [r for r in block.splitlines() if r.startswith("| ")]
        if rows:
            widths = {len(re.findall(r"(?<!\\)\|", r)) for r in rows}
            assert len(widths) == 1, block


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.headings: list[str] = []
        self._in: str | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag in ("h1", "h2"):
            self._in = tag
            self.headings.append("")

    def handle_endtag(self, tag):
        if tag == self._in:
            self._in = None

    def handle_data(self, data):
        if self._in:
            self.headings[-1] += data


def _check_html(page: str, expect_summary: int = 1) -> _Tags:
    p = _Tags()
    p.feed(page)
    names = {t for t, _ in p.tags}
    assert not names & {"script", "iframe", "object", "embed"}, names
    # the only images are the report's own charts
    assert all(a.get("src", "").startswith("plots/") for t, a in p.tags if t == "img")
    for tag, attrs in p.tags:
        assert not any(k.startswith("on") for k in attrs), (tag, attrs)
        assert not any("javascript:" in (v or "") for v in attrs.values()), (tag, attrs)
    assert p.headings.count("Summary") == expect_summary
    return p


def test_markdown_renders_safely_with_raw_html_on(hostile):
    # a CommonMark renderer with raw HTML enabled (as the reproduction used)
    markdown_it = pytest.importorskip("markdown_it")
    md, _, _ = hostile
    html = markdown_it.MarkdownIt("commonmark", {"html": True}).enable("table").render(md)
    p = _check_html(html)
    assert p.headings[0] == "Speed test matrix"
    assert not any(t == "a" for t, _ in p.tags)  # no link from a server's string
    assert SCRIPT in html.replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")


def test_html_report_is_safe_with_the_same_payloads(hostile):
    _, page, svgs = hostile
    _check_html(page)
    assert "&lt;iframe" in page
    assert svgs  # the charts carry the run's names too, inlined into the page
    for marker in ("<iframe", "<img src=x"):
        assert marker not in page


def test_written_report_redacts_a_secret_in_its_escaped_forms(tmp_path, hostile_doc):
    doc = copy.deepcopy(hostile_doc)
    secret = "sk-<live>*key*&1"
    doc["meta"]["target"]["model_name"] = f"model {secret}"
    write_run(tmp_path, doc)
    md_path, html_path = write_report(tmp_path, charts=False, exports=False, secrets=[secret])
    md, page = md_path.read_text(), html_path.read_text()
    for form in (secret, text(secret), "sk-&lt;live&gt;*key*&amp;1"):
        assert form not in md and form not in page, form
    assert "model &lt;redacted&gt;" in md
