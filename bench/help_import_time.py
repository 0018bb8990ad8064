"""How long `speedmatrix --help` takes, and how much of it is speedmatrix's own imports.

    PYTHONPATH=python python bench/help_import_time.py

Prints the median wall time of `python -m speedmatrix.cli --help` and of a bare
`python -c pass` (the interpreter's own start) over 7 runs, their difference, and the
cumulative import time of speedmatrix.cli from `-X importtime`. The budget is 0.5 s for the
whole command; the heavy libraries (numpy, pandas, matplotlib, scipy, pyarrow, rich) must not
be imported by --help at all (tests/python/test_cli_teaches.py checks that).
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import time


def _wall(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t


def main() -> None:
    env = dict(os.environ)
    help_cmd = [sys.executable, "-m", "speedmatrix.cli", "--help"]
    bare = [sys.executable, "-c", "pass"]
    runs = 7
    h = statistics.median(_wall(help_cmd) for _ in range(runs))
    b = statistics.median(_wall(bare) for _ in range(runs))
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import speedmatrix.cli"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stderr
    cum = max(
        (
            int(m.group(1))
            for m in re.finditer(r"\|\s+(\d+) \|\s+speedmatrix\.cli$", out, re.MULTILINE)
        ),
        default=0,
    )
    print(f"speedmatrix --help: {h:.3f} s (median of {runs})")
    print(f"python -c pass:     {b:.3f} s")
    print(f"difference:         {h - b:.3f} s")
    print(f"import speedmatrix.cli (cumulative, -X importtime): {cum / 1e6:.3f} s")


if __name__ == "__main__":
    main()
