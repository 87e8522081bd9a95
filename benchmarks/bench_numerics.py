"""What the pinned numerics cost: training steps and a whole run, pinned against native kernels, side by side.

Run: ``.venv/bin/python benchmarks/bench_numerics.py [--pairs 4] [--steps 20]``. Each measurement is a fresh
process, so that each library chooses its kernels at start-up as it would in a study; the pinned and native
processes alternate (pinned, native, native, pinned, …), and every figure is the median of ``--pairs`` pairs with
the ratio native / pinned of each pair (> 1: pinning is faster), so a machine's load drifts out of the ratio.

* **step**: ``--steps`` training steps (loss, backward, AdamW) of CRT, cross-attention and MS on the imagenet
  regime's :class:`~dmlstudy.models.trunk_cache.StemCachedBackbone` fed stem activations at 128 px (batch 64),
  native at one thread (the kernels' cost alone) and native at every core (``DMLSTUDY_NUMERICS=native``'s
  default);
* **run**: ``dmlstudy train`` with TrainConfig's CI-sized defaults (MS, 16 SynBirds classes), the whole process
  from its start (import, data, training, evaluation, records), in a temporary project folder.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROWS = ("crt", "cross_attention", "ms")
STEP_SCRIPT = """
import json, sys, time
import dmlstudy
import torch
from dmlstudy import numerics
from dmlstudy.methods import build_method
from dmlstudy.models.trunk_cache import StemCachedBackbone
steps, threads = int(sys.argv[1]), int(sys.argv[2])
if threads:
    torch.set_num_threads(threads)
torch.manual_seed(0)
activations, labels = torch.randn(64, 192, 4, 4), torch.arange(16).repeat_interleave(4)
seconds = {}
for row in ROWS_HERE:
    method = build_method(row, backbone=StemCachedBackbone(pretrained=True, conv_head=False, freeze_bn=True),
                          embedding_dim=128, num_classes=421)
    optimizer = torch.optim.AdamW([p for p in method.parameters() if p.requires_grad], lr=1e-4)
    for step in range(steps + 2):
        if step == 2:
            started = time.perf_counter()
        loss, _ = method.loss(activations, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    seconds[row] = (time.perf_counter() - started) / steps
print(json.dumps({"seconds": seconds, "numerics": numerics.observed()["numerics"], "threads": torch.get_num_threads()}))
""".replace("ROWS_HERE", repr(ROWS))


def _environment(mode: str, home: str) -> dict[str, str]:
    from dmlstudy import numerics

    base = {key: value for key, value in os.environ.items() if key not in numerics.PINNED_VARIABLES}
    return {**base, "DMLSTUDY_NUMERICS": mode, "DMLSTUDY_HOME": home}


def step_seconds(mode: str, steps: int, threads: int, home: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", STEP_SCRIPT, str(steps), str(threads)],
        capture_output=True,
        text=True,
        check=True,
        env=_environment(mode, home),
        cwd=Path(__file__).parents[1],
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_seconds(mode: str, home: str) -> float:
    started = time.perf_counter()
    subprocess.run(
        [str(Path(sys.executable).with_name("dmlstudy")), "train", "--run-name", f"bench-{mode}-{time.time_ns()}"],
        capture_output=True,
        text=True,
        check=True,
        env=_environment(mode, home),
        cwd=home,
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=4, help="pinned/native pairs of each measurement")
    parser.add_argument("--steps", type=int, default=20, help="timed training steps per row and process")
    args = parser.parse_args()
    from dmlstudy.numerics import cpu_model

    with tempfile.TemporaryDirectory() as home:
        subprocess.run(
            [str(Path(sys.executable).with_name("dmlstudy")), "data", "generate", "synbirds"],
            capture_output=True,
            check=True,
            env=_environment("pinned", home),
            cwd=home,
        )
        load_before = os.getloadavg()[0]
        steps = {case: [] for case in ("pinned", "native 1 thread", "native all cores")}
        runs = {"pinned": [], "native": []}
        for pair in range(args.pairs):
            order = ("pinned", "native") if pair % 2 == 0 else ("native", "pinned")
            for mode in order:
                if mode == "pinned":
                    steps["pinned"].append(step_seconds("pinned", args.steps, 0, home))
                else:
                    steps["native 1 thread"].append(step_seconds("native", args.steps, 1, home))
                    steps["native all cores"].append(step_seconds("native", args.steps, 0, home))
                runs[mode].append(run_seconds(mode, home))
        load_after = os.getloadavg()[0]
    print(
        f"{cpu_model()}, {os.cpu_count()} cores; {args.pairs} pairs, load average {load_before:.1f} → {load_after:.1f}"
    )
    tags = {case: sorted({found["numerics"] for found in found_list}) for case, found_list in steps.items()}
    print(f"numerics tags: {tags}")
    print(
        "| measurement | pinned (s) | native, 1 thread (s) | native / pinned | native, all cores (s) | native / pinned |"
    )
    print("|---|---|---|---|---|---|")
    for row in ROWS:
        pinned = [found["seconds"][row] for found in steps["pinned"]]
        one = [found["seconds"][row] for found in steps["native 1 thread"]]
        every = [found["seconds"][row] for found in steps["native all cores"]]
        ratio_one = statistics.median(b / a for a, b in zip(pinned, one))
        ratio_every = statistics.median(b / a for a, b in zip(pinned, every))
        print(
            f"| {row} step | {statistics.median(pinned):.4f} | {statistics.median(one):.4f} | {ratio_one:.2f} "
            f"| {statistics.median(every):.4f} | {ratio_every:.2f} |"
        )
    ratio = statistics.median(b / a for a, b in zip(runs["pinned"], runs["native"]))
    print(
        f"| whole CI-sized MS run (process) | {statistics.median(runs['pinned']):.1f} | – | – "
        f"| {statistics.median(runs['native']):.1f} | {ratio:.2f} |"
    )


if __name__ == "__main__":
    main()
