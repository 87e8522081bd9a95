"""How fast the ``dmlstudy`` command answers what needs no training: ``--help``, ``list methods`` and a mistyped
method name (which argparse refuses, listing the valid ones).

Each command runs as a fresh subprocess ``--repeats`` times; the table gives the best wall time and the best CPU
time (user + system of the child) with the target. Two reference rows put them in scale: the interpreter's own
start, and importing torch and timm (what the command paid before its names came from :mod:`dmlstudy.catalog`).
On a machine shared with other jobs read the CPU column: wall times are inflated there.

Usage: ``python benchmarks/bench_cli.py [--repeats 5]``
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INSTALLED = shutil.which("dmlstudy", path=str(Path(sys.executable).parent))
DMLSTUDY = [INSTALLED] if INSTALLED else [sys.executable, "-m", "dmlstudy"]
COMMANDS = [  # label, command line, expected exit status, target (s)
    ("dmlstudy --help", [*DMLSTUDY, "--help"], 0, 1.0),
    ("dmlstudy list methods", [*DMLSTUDY, "list", "methods"], 0, 1.0),
    ("dmlstudy train --method nosuch", [*DMLSTUDY, "train", "--method", "nosuch"], 2, 2.0),
    ("python -c pass (reference)", [sys.executable, "-c", "pass"], 0, None),
    ("python -c 'import torch, timm' (reference)", [sys.executable, "-c", "import torch, timm"], 0, None),
]


def timed(command: list[str], expected: int) -> tuple[float, float]:
    """Wall and CPU seconds of one run of ``command`` (which must exit with ``expected``)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != expected:
        raise RuntimeError(f"{' '.join(command)} exited with {done.returncode}, expected {expected}:\n{done.stderr}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per command; the best is reported")
    args = parser.parse_args()
    print(f"best of {args.repeats} runs, {'the installed dmlstudy script' if INSTALLED else 'python -m dmlstudy'}\n")
    print("| command | exit | wall (s) | CPU (s) | target (s) |\n|---|---:|---:|---:|---:|")
    for label, command, expected, target in COMMANDS:
        times = [timed(command, expected) for _ in range(args.repeats)]
        wall, cpu = min(wall for wall, _ in times), min(cpu for _, cpu in times)
        shown_target = f"≤ {target:g}" if target is not None else ""
        print(f"| `{label}` | {expected} | {wall:.2f} | {cpu:.2f} | {shown_target} |", flush=True)


if __name__ == "__main__":
    main()
