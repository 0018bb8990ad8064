"""Make an executable inside a repaired wheel self-contained, as auditwheel does for
extensions (it leaves executables alone).

    python scripts/wheel_bundle_exe.py WHEEL speedmatrix/_bin/speedmatrix-sim --out DIR

Every shared library the executable loads (ldd: the whole closure) that the wheel's
manylinux policy does not allow from the system is copied into the wheel's
``<package>.libs/`` folder with RUNPATH ``$ORIGIN``; the executable's RUNPATH points there
(relative to itself, so it works wherever the wheel is installed). The wheel is unpacked,
patched and packed again (``wheel pack`` rewrites RECORD) into DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def policy_whitelist(wheel: Path) -> set[str]:
    """The libraries the wheel's manylinux tag lets come from the system."""
    import auditwheel

    tag = re.search(r"(manylinux_\d+_\d+|manylinux\d+)_x86_64", wheel.name)
    if not tag:
        sys.exit(f"{wheel.name}: no manylinux tag; run auditwheel repair first")
    policies = json.loads(
        (Path(auditwheel.__file__).parent / "policy" / "manylinux-policy.json").read_text()
    )
    for p in policies:
        if tag.group(1) == p["name"] or tag.group(1) in p.get("aliases", []):
            return set(p["lib_whitelist"])
    sys.exit(f"no auditwheel policy named {tag.group(1)}")


def ldd(path: Path) -> dict[str, str]:
    out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=True).stdout
    libs = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) => (\S+)", line)
        if m:
            if m.group(2) == "not":
                sys.exit(f"{path}: {m.group(1)} not found")
            libs[m.group(1)] = m.group(2)
    return libs


def patchelf(*args: str) -> None:
    subprocess.run(["patchelf", *args], check=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("wheel", type=Path)
    ap.add_argument("exe", help="path of the executable inside the wheel")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    allowed = policy_whitelist(a.wheel)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "wheel", "unpack", "--dest", tmp, str(a.wheel)], check=True
        )
        root = next(Path(tmp).iterdir())
        exe = root / a.exe
        pkg = a.exe.split("/")[0]
        libdir = root / f"{pkg}.libs"
        libdir.mkdir(exist_ok=True)
        copied = []
        for soname, real in sorted(ldd(exe).items()):
            if soname in allowed:
                continue
            dest = libdir / soname
            if not dest.exists():
                shutil.copy2(real, dest)
                os.chmod(dest, 0o755)
                patchelf("--set-rpath", "$ORIGIN", str(dest))
                copied.append(soname)
        rel = os.path.relpath(libdir, exe.parent)
        patchelf("--set-rpath", f"$ORIGIN/{rel}", str(exe))
        print(f"{a.exe}: RUNPATH $ORIGIN/{rel}; bundled {', '.join(copied) or 'nothing new'}")
        a.out.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "wheel", "pack", "--dest-dir", str(a.out), str(root)],
            check=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
