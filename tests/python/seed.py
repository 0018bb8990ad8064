"""The seed report (tests/data/seed_report.txt, a real SGLang H200 run) as data,
so tests can hold speedmatrix's figures against it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SEED = Path(__file__).resolve().parents[1] / "data" / "seed_report.txt"

STATUS = {"Valid": "valid", "Requests queued": "queued", "Over capacity": "over_capacity"}


@dataclass
class SeedCell:
    phase: str
    label: str
    concurrency: int
    status: str
    total_tok_s: float | None
    per_request_tok_s: float | None
    ttft_ms: float | None
    tbt_ms: float | None
    avg_active: float | None


def _num(text: str) -> float | None:
    text = text.strip()
    if text in ("—", ""):
        return None
    m = re.fullmatch(r"([\d,.]+)\s*(K|ms|s)?", text)
    if not m:
        raise ValueError(f"unreadable seed figure {text!r}")
    value = float(m.group(1).replace(",", ""))
    return value * 1000 if m.group(2) == "K" else value


def seed_cells() -> list[SeedCell]:
    cells = []
    for line in SEED.read_text().splitlines():
        if not line.startswith("| Prefill |") and not line.startswith("| Sustained decode |"):
            continue
        f = [x.strip() for x in line.strip().strip("|").split("|")]
        cells.append(
            SeedCell(
                phase="prefill" if f[0] == "Prefill" else "decode",
                label=f[1],
                concurrency=int(f[2]),
                status=STATUS[f[3]],
                total_tok_s=_num(f[4]),
                per_request_tok_s=_num(f[5]),
                ttft_ms=_num(f[6]),
                tbt_ms=_num(f[7]),
                avg_active=_num(f[8]),
            )
        )
    return cells


def seed_over_capacity() -> set[tuple[str, int]]:
    """(context label, concurrency) of the seed's decode cells marked "Over capacity"."""
    return {
        (c.label, c.concurrency)
        for c in seed_cells()
        if c.phase == "decode" and c.status == "over_capacity"
    }


def label_tokens(label: str) -> int:
    """The context a seed label names, in tokens ("123K" = 123 x 1024)."""
    return round(float(label.rstrip("K")) * 1024)


def reproducible(c: SeedCell) -> bool:
    """Whether the seed-h200 profile must reproduce this measured decode cell: its average
    active requests track its concurrency. The seed's own accounting reads about 1.5 x N in
    clean cells (8K x 2 shows 3.0, 16K x 64 shows 99.6); the 2- and 4-stream cells from 16K
    up show 3.4 to 44 x N (20-88 active where 2 or 4 were sent): work left running on the
    server by earlier cells, which speedmatrix must detect, not imitate."""
    return (
        c.phase == "decode"
        and c.status in ("valid", "queued")
        and c.avg_active is not None
        and c.avg_active <= 1.7 * c.concurrency
    )
