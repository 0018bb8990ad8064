"""What the run ran on: GPU and VRAM from ``nvidia-smi`` when the server is local, OS, CPU."""

from __future__ import annotations

import math
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

Runner = Callable[[list[str]], str]


def _run_nvidia_smi(cmd: list[str]) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True)
    return out.stdout


def _short_gpu_name(name: str) -> str:
    """``NVIDIA H200 NVL`` → ``H200 NVL`` (the vendor prefix says nothing here)."""
    name = name.strip()
    for prefix in ("NVIDIA ", "Nvidia "):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def _cpu_name() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or None


def query_gpus(runner: Runner | None = None) -> list[dict[str, Any]]:
    """GPUs as ``[{"name", "vram_gb"}]`` from nvidia-smi; ``[]`` when absent or failing."""
    cmd = ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"]
    if runner is None:
        if shutil.which("nvidia-smi") is None:
            return []
        runner = _run_nvidia_smi
    try:
        text = runner(cmd)
    except (OSError, subprocess.SubprocessError, ValueError):
        return []
    gpus = []
    for line in (text or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2 or not parts[0]:
            continue
        mem = parts[1].split()
        try:
            mib = float(mem[0])
        except (IndexError, ValueError):
            continue
        unit = mem[1].lower() if len(mem) > 1 else "mib"
        gb = vram_gb_from_mib(mib) if unit == "mib" else round(mib)
        gpus.append({"name": _short_gpu_name(parts[0]), "vram_gb": gb})
    return gpus


def vram_gb_from_mib(mib: float) -> int:
    """The "GB" a GPU is sold as, from the MiB nvidia-smi reports.

    nvidia-smi gives the memory the driver can hand out, a little under the card's nominal
    size (ECC and reserved pages), in MiB. Vendors' "GB" figures are that size in GiB,
    rounded up to a whole number: 143771 MiB = 140.4 GiB -> 141 (H200 NVL, "141 GB"),
    81559 MiB = 79.6 GiB -> 80 (H100 80GB), 95830 MiB = 93.6 GiB -> 94 (H100 NVL),
    183359 MiB = 179.1 GiB -> 180 (B200). Rounding to the nearest GiB would say 140 and 179;
    decimal gigabytes (150.8 for the H200 NVL) match no data sheet."""
    return max(0, math.ceil(mib / 1024 - 1e-6))


def parse_gb(v: Any) -> float | None:
    """``"141 GB"``, ``"141GB"``, ``141``, ``"80 GiB"`` → GB as a number; None if unreadable."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return v
    m = re.match(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(?:([GgMmTt])i?[Bb]?)?\s*$", str(v))
    if not m:
        return None
    x = float(m.group(1))
    unit = (m.group(2) or "g").lower()
    x = x / 1024 if unit == "m" else x * 1024 if unit == "t" else x
    return int(x) if x == int(x) else round(x, 1)


HARDWARE_FIELDS = ("type", "gpu", "vram_gb", "os", "cpu", "gpu_count")


def detect_hardware(
    local: bool,
    given: dict[str, Any] | None = None,
    runner: Runner | None = None,
    simulated: bool = False,
) -> dict[str, Any]:
    """``{type, gpu, vram_gb, os, cpu, gpu_count, source, sources}`` of the machine the server
    runs on.

    When ``local`` (the server runs on this machine) the GPU comes from
    ``nvidia-smi``; otherwise GPU fields stay ``None`` unless ``given``. Values in
    ``given`` that are not None override whatever was detected. The OS and CPU
    describe this machine only when ``local``. ``simulated`` (the server is the
    built-in engine) skips nvidia-smi: the engine models a GPU it does not use, and
    a GPU in this machine has nothing to do with its figures; type is ``Simulated``.
    ``sources`` says for each field whether it was ``detected`` or ``given``.
    """
    hw: dict[str, Any] = {
        "type": None,
        "gpu": None,
        "vram_gb": None,
        "os": None,
        "cpu": None,
        "gpu_count": None,
        "source": "given",
    }
    if local and simulated:
        hw["os"] = platform.system().lower() or None
        hw["cpu"] = _cpu_name()
        hw["type"] = "Simulated"
        hw["source"] = "detected"
    elif local:
        hw["os"] = platform.system().lower() or None
        hw["cpu"] = _cpu_name()
        hw["source"] = "detected"
        gpus = query_gpus(runner)
        if gpus:
            hw["type"] = "Discrete GPU"
            hw["gpu"] = gpus[0]["name"]
            hw["vram_gb"] = gpus[0]["vram_gb"]
            hw["gpu_count"] = len(gpus)
            if len(gpus) > 1 and len({g["name"] for g in gpus}) == 1:
                hw["gpu"] = f"{len(gpus)}× {gpus[0]['name']}"
                hw["vram_gb"] = sum(g["vram_gb"] for g in gpus)
        else:
            hw["type"] = "CPU"
    sources = {k: "detected" for k in HARDWARE_FIELDS if hw.get(k) is not None}
    for k, v in (given or {}).items():
        if v is None or v == "":
            continue
        if k in ("vram", "vram_gb"):
            gb = parse_gb(v)
            hw["vram_gb"] = gb if gb is not None else v
            sources["vram_gb"] = "given"
            continue
        hw[k] = v
        sources[k] = "given"
    if given and any(v is not None for v in given.values()) and local:
        hw["source"] = "detected+given"
    hw["sources"] = sources
    return hw


def client_info() -> dict[str, Any]:
    """The benchmark client's host: name and CPU count."""
    return {"host": platform.node() or None, "cpus": os.cpu_count()}
