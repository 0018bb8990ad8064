"""The seed-format report: the seed's sections, order, wording and number formatting, plus
what the seed lacks (intervals, tails, flags, server view, capacity sources, charts)."""

import json
import re
from pathlib import Path

import pytest
import synthetic
from secrets_check import npz_strings, secrets_found
from speedmatrix.report import formatting as fmt
from speedmatrix.report import plots, render_report, write_report
from speedmatrix.results import load
from speedmatrix.runfile import write_run

SEED = Path(__file__).resolve().parents[1] / "data" / "seed_report.txt"
SEED_SECTIONS = [
    "Hardware",
    "Engine",
    "Run",
    "Launch command",
    "Prefill",
    "Sustained decode",
    "All measurements",
]
EXTRA_SECTIONS = [
    "Confidence intervals and tails",
    "Flags",
    "Server-side view",
    "KV capacity and limits",
]


# ---------------------------------------------------------------- number formatting
@pytest.mark.parametrize(
    "fn,value,text",
    [
        (fmt.tok_s, 10369.6, "10.4K"),
        (fmt.tok_s, 10_200, "10.2K"),
        (fmt.tok_s, 9995.0, "9,995.0"),
        (fmt.tok_s, 1583.94, "1,583.9"),
        (fmt.tok_s, 59.3, "59.3"),
        (fmt.tok_s, 2616.6, "2,616.6"),
        (fmt.tok_s_short, 9995.2, "9,995"),
        (fmt.tok_s_short, 10_369, "10.4K"),
        (fmt.tok_s_short, 8474, "8,474"),
        (fmt.ms, 790.4, "790 ms"),
        (fmt.ms, 1590, "1,590 ms"),
        (fmt.ms, 14523, "14,523 ms"),
        (fmt.ms1, 16.84, "16.8 ms"),
        (fmt.one, 98.1, "98.1"),
        (fmt.one, 1, "1.0"),
        (fmt.count, 1779, "1,779"),
        (fmt.count, 0, "0"),
        (fmt.count, 78501, "78,501"),
        (fmt.seconds, 30, "30.0 s"),
        (fmt.plain_seconds, 30, "30 s"),
        (fmt.tokens, 4096, "4,096 tokens"),
        (fmt.gigabytes, 141, "141 GB"),
        (fmt.context_label, 8192, "8K"),
        (fmt.context_label, 125952, "123K"),
        (fmt.context_label, 131072, "128K"),
        (fmt.context_label, 512, "512"),
        (fmt.status_text, "over_capacity", "Over capacity"),
        (fmt.status_text, "queued", "Requests queued"),
        (fmt.status_text, "valid", "Valid"),
        (fmt.phase_text, "decode", "Sustained decode"),
        (fmt.ratio, 1.0712, "1.07×"),
        (fmt.ci, (59.12, 59.55), "59.1–59.5"),
        (fmt.percent, 0.032, "+3.2%"),
    ],
)
def test_formatting_matches_the_seed(fn, value, text):
    assert (fn(*value) if isinstance(value, tuple) else fn(value)) == text


@pytest.mark.parametrize(
    "fn",
    [
        fmt.tok_s,
        fmt.tok_s_short,
        fmt.ms,
        fmt.ms1,
        fmt.one,
        fmt.count,
        fmt.seconds,
        fmt.gigabytes,
        fmt.context_label,
    ],
)
def test_missing_values_are_an_em_dash(fn):
    assert fn(None) == "—" and fn(float("nan")) == "—"


# ---------------------------------------------------------------- the seed, reproduced
def _num(s):
    s = s.strip()
    if s == "—":
        return None
    m = re.fullmatch(r"([\d,.]+)\s*(K|ms|s)?", s)
    v = float(m.group(1).replace(",", ""))
    return v * 1000 if m.group(2) == "K" else v


def _ctx(label):
    return int(label[:-1]) * 1024


def seed_doc():
    """run.json holding exactly the seed report's figures and metadata."""
    cells = []
    status = {"Valid": "valid", "Requests queued": "queued", "Over capacity": "over_capacity"}
    for line in SEED.read_text().splitlines():
        if not (line.startswith(("| Prefill |", "| Sustained decode |"))):
            continue
        f = [x.strip() for x in line.strip().strip("|").split("|")]
        pre = f[0] == "Prefill"
        cells.append(
            {
                "phase": "prefill" if pre else "decode",
                "context": _ctx(f[1]),
                "label": f[1],
                "concurrency": int(f[2]),
                "status": status[f[3]],
                "total_tok_s": None if pre else _num(f[4]),
                "prompt_tok_s": _num(f[4]) if pre else None,
                "per_request_tok_s": _num(f[5]),
                "ttft_ms": _num(f[6]),
                "tbt_ms": _num(f[7]),
                "avg_active": _num(f[8]),
                "completed": int(_num(f[9]) or 0),
                "output_tokens": int(_num(f[10]) or 0),
                "measured_s": _num(f[11]) or 0.0,
                "errors": {},
            }
        )
    launch = (
        '"$HOME/env_h200-meta-sglang/bin/sglang" serve --model-path '
        "meta-models/Muse-Glimmer-30B --served-model-name muse-glimmer --tp 1 "
        "--reasoning-parser muse --tool-call-parser muse --context-length 131072 "
        "--mem-fraction-static 0.856257 --enable-metrics --host 0.0.0.0 --port 8000 "
        "--api-key SEEDSECRETKEY123"
    )
    meta = {
        "target": {
            "url": "http://127.0.0.1:8000/v1",
            "model": "muse-glimmer",
            "model_path": "meta-models/Muse-Glimmer-30B",
        },
        "engine": {
            "name": "sglang",
            "version": "0.5.6.post3.dev9265+g05c584c44",
            "quantization": "BF16",
            "backend": "cuda",
            "repository": "github.com/sgl-project/sglang",
            "build": "cuda-13.2",
            "commit": "05c584c44fb0",
        },
        "hardware": {"type": "Discrete GPU", "gpu": "H200 NVL", "vram_gb": 141, "os": "linux"},
        "run": {
            "served_model": "muse-glimmer",
            "revision": "main",
            "tool": "llm-inference-bench",
            "tool_version": "0.4.29",
            "decode_test": "Fixed duration",
            "prefill_mode": "Measured during decode warm-up",
            "duration_s": 30,
            "max_output": 4096,
            "launch_command": launch,
            "matrix": {
                "contexts": [8192, 16384, 32768, 65536, 125952],
                "concurrency": [1, 2, 4, 8, 16, 32, 64, 128],
                "prefill_contexts": [8192, 16384, 32768, 65536, 125952, 131072],
            },
        },
    }
    return {"schema": "speedmatrix.run/1", "meta": meta, "cells": cells}


@pytest.fixture(scope="module")
def seed_report(tmp_path_factory):
    d = tmp_path_factory.mktemp("seed")
    write_run(d, seed_doc())
    md, page, _ = render_report(load(d), charts=False)
    return md, page


def test_seed_header_lines(seed_report):
    md, _ = seed_report
    seed = SEED.read_text().splitlines()
    lines = md.splitlines()
    assert lines[0] == f"# {seed[0]}"
    assert f"**{seed[1]}**" in lines
    engine = "sglang · 0.5.6.post3.dev9265+g05c584c44 · BF16"
    size = (
        "5 contexts (8K–123K) × 8 concurrency levels (1–128) · prefill at 8K, 16K, 32K, "
        "64K, 123K, 128K"
    )
    assert seed[2] == engine + size  # the seed's text dump joins the two lines
    assert engine in lines and size in lines


def test_seed_metadata_items(seed_report):
    md, _ = seed_report
    seed = SEED.read_text().splitlines()
    start, end = seed.index("Hardware"), seed.index("Launch command")
    block = [x for x in seed[start:end] if x not in ("Hardware", "Engine", "Run")]
    pairs = [
        (block[i].removeprefix("- "), block[i + 1].removeprefix("- "))
        for i in range(0, len(block), 2)
    ]
    assert len(pairs) == 4 + 7 + 7
    for k, v in pairs:
        assert f"- **{k}:** {v}" in md, (k, v)


def test_seed_launch_command_redacted(seed_report):
    md, page = seed_report
    seed = SEED.read_text().splitlines()
    cmd = seed[seed.index("Launch command") + 1]
    assert cmd in md.splitlines()
    assert "SEEDSECRETKEY123" not in md and "SEEDSECRETKEY123" not in page


def test_seed_prefill_lines(seed_report):
    md, _ = seed_report
    seed = [x for x in SEED.read_text().splitlines() if re.match(r"^(prompt tok/s by |\d+K c)", x)]
    seed[0] = seed[0].removeprefix(fmt.PREFILL_CAPTION)
    rows = [ln for ln in md.splitlines() if re.match(r"^\| \d+K context \|", ln)]
    joined = ["".join(c.strip() for c in r.strip("|").split("|")) for r in rows]
    assert joined == seed
    assert fmt.PREFILL_CAPTION in md.splitlines()


def _decode_rows(md):
    part = md[md.index("## Sustained decode") : md.index("## All measurements")]
    return [ln for ln in part.splitlines() if re.match(r"^\| \d+K \| ", ln)]


def test_seed_matrix_rows_verbatim(seed_report):
    md, _ = seed_report
    seed = SEED.read_text().splitlines()
    seed_rows = [x for x in seed if re.match(r"^\| \d+K \| ", x)]
    mine = [ln.replace("<br>", "") for ln in _decode_rows(md)]
    assert len(seed_rows) == 5 and mine == seed_rows
    head = next(x for x in seed if x.endswith("| Context | 1 | 2 | 4 | 8 | 16 | 32 | 64 | 128 |"))
    assert head == fmt.MATRIX_CAPTION + "| Context | 1 | 2 | 4 | 8 | 16 | 32 | 64 | 128 |"
    assert "| Context | 1 | 2 | 4 | 8 | 16 | 32 | 64 | 128 |" in md


def test_seed_all_measurements_rows_verbatim(seed_report):
    md, _ = seed_report
    seed_rows = [
        x
        for x in SEED.read_text().splitlines()
        if x.startswith(("| Prefill |", "| Sustained decode |"))
    ]
    lines = md.splitlines()
    mine = [ln for ln in lines if ln.startswith(("| Prefill |", "| Sustained decode |"))]
    assert len(seed_rows) == 46
    assert mine[: len(seed_rows)] == seed_rows
    header = (
        "| Phase | Context | Requests at once | Status | Total tok/s | Per request tok/s | "
        "TTFT | Time between tokens | Average active requests | Completed requests | "
        "Output tokens | Measured for |"
    )
    assert header in lines


def test_seed_wording(seed_report):
    md, page = seed_report
    text = SEED.read_text()
    for s in (fmt.LEGEND, fmt.TTFT_NOTE, fmt.ALL_CAPTION, fmt.MATRIX_CAPTION):
        assert s in text, s  # the constants are the seed's own words
        assert s in md
    assert md.count(fmt.LEGEND) == 2  # under the matrix and under all measurements
    assert "Over capacity" in page and "Requests queued" in page


def _order(text, marks):
    pos = [text.find(m) for m in marks]
    assert all(p >= 0 for p in pos), dict(zip(marks, pos))
    assert pos == sorted(pos), dict(zip(marks, pos))


def test_seed_sections_in_order(seed_report):
    md, page = seed_report
    _order(md, [f"\n## {s}\n" for s in SEED_SECTIONS + EXTRA_SECTIONS])
    _order(page, [f"<h2>{s}</h2>" for s in SEED_SECTIONS + EXTRA_SECTIONS])
    _order(
        page[page.index("<body>") :],
        [
            "<h1>Speed test matrix</h1>",
            "Muse-Glimmer-30B on H200 NVL 141GB",
            "sglang · 0.5.6.post3.dev9265+g05c584c44 · BF16",
            "5 contexts (8K–123K)",
        ],
    )


# ---------------------------------------------------------------- a synthetic run
@pytest.fixture(scope="module")
def full():
    d = synthetic.shared_run("full", report=True)
    return d, (d / "report.md").read_text(), (d / "report.html").read_text(), load(d)


def test_write_report_files(full):
    d, md, page, _ = full
    assert (d / "report.md").is_file() and (d / "report.html").is_file()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    _order(md, [f"\n## {s}\n" for s in SEED_SECTIONS + EXTRA_SECTIONS + ["Charts"]])
    _order(page, [f"<h2>{s}</h2>" for s in SEED_SECTIONS + EXTRA_SECTIONS + ["Charts"]])


def test_matrix_shape_and_statuses(full):
    _, md, page, run = full
    rows = _decode_rows(md)
    assert [r.split("|")[1].strip() for r in rows] == ["8K", "16K", "32K", "64K", "123K"]
    assert all(len(r.strip("|").split("|")) == 1 + 8 for r in rows)
    n_over = int((run.cells["status"] == "over_capacity").sum())
    assert sum(r.count("| Over capacity ") for r in rows) == n_over
    assert page.count('<td class="over">') == n_over
    queued = run.cells[run.cells["status"] == "queued"]
    assert sum(r.count("Requests queued") for r in rows) == len(queued)
    assert "Error<br>" in rows[2]  # the failed 32K × 16 cell
    assert "Error: too many requests failed in this cell" in md
    v = run.cells.set_index("id").loc["decode-c8192-n4-r0"]
    assert f"{fmt.tok_s(v['total_tok_s'])}<br>{fmt.ms(v['ttft_ms'])} TTFT" in rows[0]


def test_extras_intervals_tails_flags_server_capacity(full):
    _, md, _page, run = full
    c = run.cells.set_index("id").loc["decode-c8192-n8-r0"]
    ci = fmt.ci(c["total_tok_s_lo"], c["total_tok_s_hi"], fmt.tok_s)
    line = next(ln for ln in md.splitlines() if ln.startswith("| 8K | 8 | Valid |"))
    assert ci in line and fmt.ms(c["ttft_p99_ms"]) in line and fmt.ms1(c["tbt_p99_ms"]) in line
    flags = md[md.index("## Flags") : md.index("## Server-side view")]
    for word in ("Drift", "Busy at start", "Prompt mismatch", "Client bound", "Error"):
        assert word in flags, word
    assert "asked 65,536, server counted 65,539" in flags
    assert "too many failed requests" in flags
    server = md[md.index("## Server-side view") : md.index("## KV capacity and limits")]
    assert "| 8K | 64 | Requests queued | 64.0 | 48.0 | 48 | 16 |" in server
    cap = md[md.index("## KV capacity and limits") :]
    assert "| KV cache capacity | 1,400,000 tokens | Probed from the server |" in cap
    assert "| Max running requests | 48 | Given by the user |" in cap
    assert "## Errors" in md and "http_500 ×" in md


def test_html_is_self_contained_with_charts(full):
    d, md, page, _ = full
    assert page.count("<svg") >= 6
    for bad in ("<script", "<link", 'src="http', "src='http", "url(http", "@import"):
        assert bad not in page
    assert "<style>" in page
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids)), "duplicate ids in the page"
    for name in (
        "decode_heatmap",
        "total_vs_concurrency",
        "prefill_vs_context",
        "ttft_vs_context",
        "tbt_distribution",
        "per_request_vs_concurrency",
    ):
        assert f'id="chart-{name}"' in page
        assert (d / "plots" / f"{name}.svg").is_file()
        assert f"(plots/{name}.svg)" in md


def test_no_secret_anywhere_under_the_output_folder(full):
    d = full[0]
    files = [p for p in d.rglob("*") if p.is_file()]
    assert len(files) > 20
    assert secrets_found(d, synthetic.SECRETS) == []  # records opened and decoded too
    assert "--api-key <redacted>" in full[1]
    # the server's message that echoed the key is kept, without it
    assert "HTTP 500: internal server error (upstream refused api_key=<redacted>)" in (
        npz_strings(d)
    )


def test_report_of_an_interrupted_run():
    # charts of interrupted runs: test_plots.py; here the text of the report
    md, page, _ = render_report(load(synthetic.shared_run("interrupted")), charts=False)
    assert "This run was interrupted" in md and "This run was interrupted" in page
    _order(md, [f"\n## {s}\n" for s in SEED_SECTIONS + ["Not measured"]])
    assert "Not measured" in md and "| Status:" not in md
    assert "- **Status:** Interrupted" in md


def test_report_without_records_or_cells(tmp_path):
    d = synthetic.shared_run("norecords")
    figs = plots.all_figures(load(d))
    assert "tbt_distribution" not in figs and "decode_heatmap" in figs
    md, _, svgs = render_report(load(d), charts=False)
    assert svgs == {}
    assert "## All measurements" in md
    empty = tmp_path / "empty"
    write_run(empty, {"schema": "speedmatrix.run/1", "meta": {}, "cells": []})
    md_path, _html_path = write_report(empty, charts=False)
    text = md_path.read_text()
    for s in SEED_SECTIONS:
        assert f"## {s}" in text
    assert "Unknown model on unknown hardware" in text
    assert "Not given." in text and "No prefill cells were measured." in text


def test_report_secrets_argument(tmp_path):
    d = tmp_path / "run"
    doc = json.loads((synthetic.shared_run("full") / "run.json").read_text())
    doc["meta"]["run"]["revision"] = "rev-with-plainsecret"
    write_run(d, doc)
    md_path, html_path = write_report(d, charts=False, secrets=["plainsecret"])
    assert "plainsecret" not in md_path.read_text() + html_path.read_text()


@pytest.mark.slow
@pytest.mark.e2e
def test_report_of_a_real_run_against_the_built_in_engine(tmp_path):
    """End to end with the seed-h200 profile: sections, matrix shape, over capacity, and no
    trace of the API key or of the key inside the launch command under the output folder."""
    try:
        from speedmatrix import _native

        _native.sim_binary()
        import speedmatrix as sm
    except (ImportError, FileNotFoundError) as exc:
        pytest.skip(f"the compiled core or the built-in engine is not built: {exc}")
    key, launch_key = "sk-e2e-SECRET-4242424242", "hf_E2eLaunchSecretToken99"
    out = tmp_path / "run"
    matrix = sm.Matrix(
        contexts=["1k", "4k"],
        concurrency=[1, 16],
        duration_s=1.0,
        max_output=256,
        prefill_contexts=["1k", "4k"],
        idle_timeout_s=10,
    )
    with sm.Sim("seed-h200", overrides={"kv_tokens": 60000}) as sim:
        sm.run(
            sim.url,
            matrix,
            out=out,
            api_key=key,
            progress=False,
            info={"launch_command": f"sglang serve --api-key {key} --hf-token {launch_key}"},
        )
    md = (out / "report.md").read_text()
    page = (out / "report.html").read_text()
    _order(md, [f"\n## {s}\n" for s in SEED_SECTIONS + EXTRA_SECTIONS])
    _order(page, [f"<h2>{s}</h2>" for s in SEED_SECTIONS + EXTRA_SECTIONS])
    rows = _decode_rows(md)
    assert [r.split("|")[1].strip() for r in rows] == ["1K", "4K"]
    assert all(len(r.strip("|").split("|")) == 3 for r in rows)
    assert rows[1].rstrip().endswith("| Over capacity |")  # 16 × (4,096 + 256) > 60,000
    assert "--api-key <redacted> --hf-token <redacted>" in md
    assert secrets_found(out, [key, launch_key]) == []
    # the built-in engine says it is one: no real SGLang, no GPU of this machine
    meta = json.loads((out / "run.json").read_text())["meta"]
    assert meta["engine"]["simulated"] is True and meta["engine"]["backend"] == "simulated"
    assert meta["hardware"]["type"] == "Simulated" and meta["hardware"]["gpu"] is None
    assert meta["target"]["model_path"] and meta["target"]["model_name_source"] == "model_path"
    assert " on speedmatrix-sim (simulated)**" in md
    assert "sglang (simulated by speedmatrix-sim)" in md


def test_repeated_cells_get_a_repetition_column(tmp_path):
    synthetic.build_run(
        tmp_path, contexts=(8192,), concurrency=(1,), prefill_contexts=(8192,), duration_s=2.0
    )
    doc = json.loads((tmp_path / "run.json").read_text())
    doc["cells"].append(
        dict(doc["cells"][1], id="decode-c8192-n1-r1", repetition=1, total_tok_s=70.0)
    )
    write_run(tmp_path, doc)
    md, _, _ = render_report(load(tmp_path), charts=False)
    assert "| Measured for | Repetition |" in md
    rows = [ln for ln in md.splitlines() if ln.startswith("| Sustained decode | 8K | 1 |")]
    assert [r.rsplit("|", 2)[1].strip() for r in rows] == ["1", "2"]
    one = synthetic.shared_run("full")
    md1, _, _ = render_report(load(one), charts=False)
    assert "Repetition" not in md1


# ---------------------------------------------------------------- metadata and its sources
def _meta_report(tmp_path, edit) -> tuple[str, str]:
    """Report text of the synthetic run with ``edit(doc)`` applied to its run.json."""
    d = tmp_path / "run"
    doc = json.loads((synthetic.shared_run("full") / "run.json").read_text())
    edit(doc)
    write_run(d, doc)
    md, page, _ = render_report(load(d), charts=False)
    return md, page


def test_title_model_is_derived_from_the_model_path(full):
    _, md, _page, run = full
    assert "model_name" not in run.meta["target"]  # nothing hand-set: derived from the path
    assert "**Muse-Glimmer-30B on H200 NVL 141GB**" in md
    assert "- **Model path:** meta-models/Muse-Glimmer-30B" in md
    assert "| Model | Name | Muse-Glimmer-30B | From the model path the server reports |" in md


def test_given_model_name_wins_over_the_path(tmp_path):
    def edit(doc):
        doc["meta"]["target"].update(model_name="Glimmer 30B", model_name_source="given")

    md, _ = _meta_report(tmp_path, edit)
    assert "**Glimmer 30B on H200 NVL 141GB**" in md
    assert "| Model | Name | Glimmer 30B | Given by the user |" in md


def test_dtype_is_the_precision_when_quantization_is_absent(full):
    _, md, _page, run = full
    assert run.meta["engine"]["quantization"] is None
    assert "sglang · 0.5.6.post3.dev9265+g05c584c44 · BF16" in md
    assert "- **Quantization:** BF16" in md


def test_engine_and_hardware_sources_are_shown(full):
    _, md, page, _ = full
    block = md[md.index("## Probed and given") :]
    for line in (
        "| Engine | Version | 0.5.6.post3.dev9265+g05c584c44 | Probed from the server |",
        "| Engine | Backend | cuda | Given by the user |",
        "| Engine | Repository | github.com/sgl-project/sglang | Default |",
        "| Hardware | GPU | H200 NVL | Detected on this machine |",
        "| Hardware | VRAM | 141 GB | Detected on this machine |",
        "| Hardware | OS | linux | Given by the user |",
    ):
        assert line in block, line
    assert "<h2>Probed and given</h2>" in page


def test_simulated_run_does_not_pose_as_real_hardware(tmp_path):
    def edit(doc):
        doc["meta"]["engine"].update(simulated=True, backend="simulated", repository=None)
        doc["meta"]["hardware"] = {
            "type": "Simulated",
            "gpu": None,
            "vram_gb": None,
            "os": "linux",
            "cpu": "Some CPU",
        }

    md, _page = _meta_report(tmp_path, edit)
    assert "**Muse-Glimmer-30B on speedmatrix-sim (simulated)**" in md
    assert "sglang (simulated by speedmatrix-sim) · 0.5.6" in md
    assert "- **Engine:** sglang (simulated by speedmatrix-sim)" in md
    assert "- **Type:** Simulated" in md and "- **Backend:** simulated" in md
    assert "H200" not in md.split("## Launch command")[0]


def test_warnings_section_when_the_run_recorded_warnings(tmp_path, full):
    assert "## Warnings" not in full[1]  # none recorded: no section

    def edit(doc):
        doc["meta"]["warnings"] = [
            "no Prometheus metrics at /metrics (start SGLang with --enable-metrics)",
            "plan: 123K × 16 skipped; server said --api-key leaked-KEY-123 is invalid",
            "",
        ]

    md, page = _meta_report(tmp_path, edit)
    block = md[md.index("## Warnings") :]
    assert "no Prometheus metrics at /metrics (start SGLang with --enable-metrics)" in block
    # "<redacted>" is escaped in Markdown, where a bare "<redacted>" is an HTML tag
    assert "--api-key &lt;redacted&gt;" in block and "leaked-KEY-123" not in md + page
    assert "The run recorded 2 warnings: see Warnings." in md
    assert "<h2>Warnings</h2>" in page and 'href="#warnings"' in page


def test_errors_show_an_example_message_per_kind(full, tmp_path):
    _, md, _page, _ = full
    errors = md[md.index("## Errors") :]
    assert re.search(
        r"\| http_500 × [\d,]+ \(e\.g\. “HTTP 500: internal server error "
        r"\(upstream refused api_key=&lt;redacted&gt;\)”\) \|",
        errors,
    ), errors

    def edit(doc):
        cell = next(c for c in doc["cells"] if c["status"] == "error")
        cell["errors"] = {"http_401": 3, "timeout": 2}
        cell["error_examples"] = {
            "http_401": "HTTP 401: invalid token=tok-SECRET-77 for user",
            "timeout": "no bytes in 30 s",
        }

    md2, page2 = _meta_report(tmp_path, edit)
    assert "tok-SECRET-77" not in md2 + page2
    assert (
        "http_401 × 3 (e.g. “HTTP 401: invalid token=&lt;redacted&gt; for user”); "
        "timeout × 2 (e.g. “no bytes in 30 s”)" in md2
    )


def test_every_flag_the_verdict_sets_has_report_text():
    # A flag without text would reach the report as its bare identifier (flags are set by
    # the verdict's rules, in FLAG_RULES).
    from speedmatrix.report.cells import FLAG_SHORT, FLAG_TEXT
    from speedmatrix.verdict import FLAG_RULES

    set_by_verdict = {flag.value for flag, _rule in FLAG_RULES}
    assert {"busy_at_start", "drift", "long_ramp", "output_not_forced"} <= set_by_verdict
    for name in set_by_verdict:
        assert FLAG_TEXT.get(name, "").strip() and FLAG_SHORT.get(name, "").strip(), name
