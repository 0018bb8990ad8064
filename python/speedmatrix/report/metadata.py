"""The report's header and its metadata sections: the title lines, hardware, engine, run,
launch command, the KV capacity the plan used, where each fact came from, and warnings."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from speedmatrix.naming import display_model_name, precision_label
from speedmatrix.redact import redact
from speedmatrix.report import formatting as fmt
from speedmatrix.report.model import Section, Table

if TYPE_CHECKING:  # pragma: no cover
    from speedmatrix.results import Run


#: the KV cache capacity and server limits the plan used; not the capacity at an SLO (the load
#: a context holds with the SLO met, `goodput.SLO_CAPACITY_TITLE`)
KV_CAPACITY_TITLE = "KV capacity and limits"
KV_CAPACITY_NAMES = {
    "kv_tokens": "KV cache capacity",
    "context_length": "Context length",
    "max_running": "Max running requests",
}


KV_CAPACITY_SOURCE_TEXT = {
    "probed": "Probed from the server",
    "given": "Given by the user",
    "default": "Default",
    "missing": "Not available",
}


def _get(d: dict | None, *keys: str) -> Any:
    for k in keys:
        if d and not fmt.missing(d.get(k)):
            return d.get(k)
    return None


def model_name(meta: dict) -> str:
    """The model in the title: the name the run recorded (given with ``--model-name`` or
    derived from the model path), else the last part of a recorded model path, else the
    served name."""
    run, target, eng = meta.get("run") or {}, meta.get("target") or {}, meta.get("engine") or {}
    path = _get(target, "model_path") or _get(eng, "model_path")
    return str(
        _get(target, "model_name")
        or _get(run, "model_name")
        or display_model_name(path)
        or _get(target, "model")
        or _get(run, "served_model", "model")
        or "Unknown model"
    )


def simulated(meta: dict) -> bool:
    """True for a run against the built-in engine (speedmatrix-sim)."""
    eng, hw = meta.get("engine") or {}, meta.get("hardware") or {}
    return bool(eng.get("simulated")) or str(hw.get("type") or "").lower() == "simulated"


def engine_name(meta: dict) -> str | None:
    """The engine as the report names it; the built-in engine says it is a simulation of
    that engine, so a demo run never reads as a real SGLang or vLLM."""
    name = _get(meta.get("engine"), "name")
    if name is None:
        return None
    return f"{name} (simulated by speedmatrix-sim)" if simulated(meta) else str(name)


def precision(eng: dict) -> str | None:
    """The seed's "Quantization" value: the quantization method, else the weights' dtype
    (BF16 for ``bfloat16``; nothing for ``auto``)."""
    quant = _get(eng, "quantization")
    return str(quant) if quant is not None else precision_label(eng.get("dtype"))


def hardware_name(meta: dict) -> str:
    """``H200 NVL 141GB`` as the seed's title writes it (GPU, then its memory)."""
    hw = meta.get("hardware") or {}
    gpu = _get(hw, "gpu")
    if gpu is None:
        if simulated(meta):
            return "speedmatrix-sim (simulated)"
        return str(_get(hw, "cpu") or "unknown hardware")
    vram = vram_text(hw)
    if vram and vram.endswith(" GB") and not str(gpu).endswith("GB"):
        return f"{gpu} {vram[:-3]}GB"
    return str(gpu)


def _items(pairs: list[tuple[str, Any]]) -> list[tuple[str, str]]:
    return [(k, str(v)) for k, v in pairs if not fmt.missing(v)]


def header_lines(run: Run) -> tuple[str, str, str, str]:
    meta = run.meta
    eng = meta.get("engine") or {}
    title = "Speed test matrix"
    subtitle = f"{model_name(meta)} on {hardware_name(meta)}"
    parts = [
        str(v)
        for v in (engine_name(meta), eng.get("version"), precision(eng))
        if not fmt.missing(v)
    ]
    engine_line = " · ".join(parts) if parts else "unknown engine"
    md = run.matrix_definition
    ctx, conc, pre = md["contexts"], md["concurrency"], md["prefill_contexts"]
    pieces = []
    if ctx or conc:
        pieces.append(
            f"{fmt.plural(len(ctx), 'context')} {fmt.range_text(ctx, fmt.context_label)} × "
            f"{fmt.plural(len(conc), 'concurrency level')} {fmt.range_text(conc)}".replace(
                "  ", " "
            ).strip()
        )
    if pre:
        pieces.append("prefill at " + ", ".join(fmt.context_label(c) for c in pre))
    return title, subtitle, engine_line, " · ".join(pieces)


def vram_text(hw: dict) -> str | None:
    v = hw.get("vram_gb")
    if fmt.missing(v):
        v = hw.get("vram")
    if v is None or fmt.missing(v):
        return None
    try:
        return fmt.gigabytes(float(v))
    except (TypeError, ValueError):
        return str(v)


def hardware_section(run: Run) -> Section:
    hw = run.meta.get("hardware") or {}
    items = _items(
        [
            ("Type", fmt.code_text(hw.get("type")) if hw.get("type") else None),
            ("GPU", hw.get("gpu")),
            ("VRAM", vram_text(hw)),
            ("OS", hw.get("os")),
            ("CPU", hw.get("cpu")),
        ]
    )
    return Section("Hardware", items=items or [("Type", "Not recorded")], anchor="hardware")


def engine_section(run: Run) -> Section:
    e = run.meta.get("engine") or {}
    t = run.meta.get("target") or {}
    items = _items(
        [
            ("Engine", engine_name(run.meta)),
            ("Version", e.get("version")),
            ("Quantization", precision(e)),
            ("Backend", e.get("backend")),
            ("Repository", e.get("repository")),
            ("Build", e.get("build")),
            ("Commit", e.get("commit")),
            ("Model path", t.get("model_path") or e.get("model_path")),
            ("Tensor parallel", e.get("tp_size")),
        ]
    )
    return Section("Engine", items=items or [("Engine", "Not recorded")], anchor="engine")


def _preset_text(preset: Any) -> str | None:
    """How the run's matrix differs from the preset it started from (`meta.run.preset`,
    as the demo and ``--preset`` record it); None when it is the preset's or none."""
    if not isinstance(preset, dict) or not preset.get("name"):
        return None
    if not preset.get("text"):
        return f"the {preset['name']} preset, unchanged"
    return str(preset["text"])


def run_section(run: Run) -> Section:
    r = run.meta.get("run") or {}
    t = run.meta.get("target") or {}
    tool = r.get("tool")
    if tool and r.get("tool_version"):
        tool = f"{tool} v{r['tool_version']}"
    status = None
    if r.get("interrupted"):
        status = "Interrupted"
    items = _items(
        [
            ("Served model", r.get("served_model") or t.get("model")),
            ("Revision", r.get("revision")),
            ("Benchmark tool", tool),
            ("Decode test", fmt.code_text(r["decode_test"]) if r.get("decode_test") else None),
            ("Prefill mode", fmt.code_text(r["prefill_mode"]) if r.get("prefill_mode") else None),
            (
                "Time per measurement",
                fmt.plain_seconds(r["duration_s"])
                if not fmt.missing(r.get("duration_s"))
                else None,
            ),
            (
                "Max output",
                fmt.tokens(r["max_output"]) if not fmt.missing(r.get("max_output")) else None,
            ),
            ("Matrix", _preset_text(r.get("preset"))),
            ("API", t.get("api")),
            ("Target", redact(str(t["url"])) if t.get("url") else None),
            ("Started", r.get("started_at")),
            ("Finished", r.get("finished_at")),
            ("Status", status),
        ]
    )
    return Section("Run", items=items, anchor="run")


def launch_section(run: Run) -> Section:
    cmd = (run.meta.get("run") or {}).get("launch_command")
    if fmt.missing(cmd):
        return Section("Launch command", text=["Not given."], anchor="launch-command")
    return Section("Launch command", code=redact(str(cmd)), anchor="launch-command")


def kv_capacity_section(run: Run) -> Section:
    cap = run.meta.get("capacity") or {}
    rows = []
    for k, v in cap.items():
        if isinstance(v, dict):
            val, src = v.get("value"), v.get("source")
        else:
            val, src = v, None
        name = KV_CAPACITY_NAMES.get(k, k.replace("_", " ").capitalize())
        shown = (
            fmt.count(val)
            if isinstance(val, (int, float)) and not fmt.missing(val)
            else (fmt.DASH if fmt.missing(val) else str(val))
        )
        if k in ("kv_tokens", "context_length") and shown != fmt.DASH:
            shown += " tokens"
        detail = v.get("detail") if isinstance(v, dict) else None
        source = fmt.code_text(src)  # a dash when the source was not recorded
        if isinstance(src, str):
            source = KV_CAPACITY_SOURCE_TEXT.get(src, source)
        rows.append([name, shown, source, fmt.DASH if fmt.missing(detail) else str(detail)])
    tbl = Table(
        ["Value", "Used", "Source", "Detail"],
        rows,
        caption="What the plan used, and whether it was probed from the server or given.",
    )
    text = [] if rows else ["No capacity values were recorded."]
    return Section(KV_CAPACITY_TITLE, table=tbl if rows else None, text=text, anchor="kv-capacity")


SOURCE_TEXT = {
    "probed": "Probed from the server",
    "given": "Given by the user",
    "detected": "Detected on this machine",
    "default": "Default",
    "missing": "Not available",
    "model_path": "From the model path the server reports",
    "served_model": "The served model name",
}


ENGINE_FACTS = (
    ("name", "Engine"),
    ("version", "Version"),
    ("commit", "Commit"),
    ("quantization", "Quantization"),
    ("backend", "Backend"),
    ("build", "Build"),
    ("repository", "Repository"),
)


HARDWARE_FACTS = (
    ("type", "Type"),
    ("gpu", "GPU"),
    ("vram_gb", "VRAM"),
    ("os", "OS"),
    ("cpu", "CPU"),
)


def _source_text(src: Any) -> str:
    return SOURCE_TEXT.get(src, fmt.code_text(src)) if not fmt.missing(src) else fmt.DASH


def _source_rows(
    part: str, facts: tuple[tuple[str, str], ...], values: dict[str, Any], sources: Any
) -> list[list[str]]:
    """[part, label, value, source] of each fact that has a value and a recorded source."""
    sources = sources if isinstance(sources, dict) else {}
    return [
        [part, label, str(values[key]), _source_text(sources[key])]
        for key, label in facts
        if key in sources and not fmt.missing(values[key])
    ]


def sources_section(run: Run) -> Section | None:
    """Where the model name, the engine facts and the hardware came from (probed, detected or
    given); capacity has its own table. None for runs that recorded no sources."""
    meta = run.meta
    t, e, hw = meta.get("target") or {}, meta.get("engine") or {}, meta.get("hardware") or {}
    rows = []
    name_source = t.get("model_name_source")
    if not name_source and not t.get("model_name") and (t.get("model_path") or e.get("model_path")):
        name_source = "model_path"  # the title derives it here (see model_name)
    if name_source:
        rows.append(["Model", "Name", model_name(meta), _source_text(name_source)])
    engine = {key: engine_name(meta) if key == "name" else e.get(key) for key, _ in ENGINE_FACTS}
    rows += _source_rows("Engine", ENGINE_FACTS, engine, e.get("sources"))
    hardware = {k: vram_text(hw) if k == "vram_gb" else hw.get(k) for k, _ in HARDWARE_FACTS}
    rows += _source_rows("Hardware", HARDWARE_FACTS, hardware, hw.get("sources"))
    if not rows:
        return None
    return Section(
        "Probed and given",
        table=Table(
            ["Part", "Field", "Value", "Source"],
            rows,
            caption="Where the report's metadata came from: probed from the server, detected on "
            "the machine, or given by the user.",
        ),
        anchor="sources",
    )


def warnings_section(run: Run) -> Section | None:
    """The run's warnings (discovery, plan): None when there are none."""
    warns = run.meta.get("warnings")
    if isinstance(warns, str):
        warns = [warns]
    if not isinstance(warns, (list, tuple)):
        return None
    items = [redact(str(w)).strip() for w in warns if not fmt.missing(w) and str(w).strip()]
    if not items:
        return None
    return Section("Warnings", text=items, anchor="warnings")
