"""Benchmark of the execution engine: the old process pool against the Dask LocalCluster, side by side.

The same grid of MS runs (the default plan's protocol: SynBirds, dml_convnet, 64 px, d = 128, batch 16 × 4,
AdamW lr 4e-3, cosine schedule; shortened to ``--epochs`` × ``--steps-per-epoch`` so that per-task overhead is
visible) is trained with ``run_grid(configs, workers=2)`` by

* ``pool``: the code of a base-commit worktree (``--base``, the ``ProcessPoolExecutor`` pool) or, without
  ``--base``, this worktree's ``engine.train_task`` mapped over a ``ProcessPoolExecutor`` of 2 spawned
  one-thread processes — the same training code on both sides, so the difference is the executor alone, and
* ``dask``: this worktree (``dmlstudy.study.engine``, a LocalCluster of 2 worker processes, one thread each),

each in a fresh subprocess and a fresh runs folder, alternating pool/dask ``--repeats`` times, so both see the
same background load. The time is that of the ``run_grid`` call (cluster or pool start-up, training, loading
the results), not the interpreter's imports. Overhead = (dask − pool) / pool per repeat pair.

Also: the per-task cost of the engine alone (trivial tasks through ``engine.run_tasks`` on a warm cluster).

Usage (from the worktree; ``--base`` a worktree made by ``git worktree add ../dask-base <base commit>``)::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_engine.py --repeats 2 --epochs 3 --steps-per-epoch 40
    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_engine.py --base /work/wt/dask-base --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

SETUP = r"""
import json, os, sys, time
from dmlstudy.run.protocol import ProtocolConfig
spec = json.loads(sys.argv[1])
protocol = ProtocolConfig(study="bench", runs_root=spec["runs_root"], data_root=spec["data_root"], datasets=["synbirds"],
                          seeds=list(range(spec["runs"])), epochs=spec["epochs"], steps_per_epoch=spec["steps"],
                          eval_every=spec["epochs"], train_classes=0, test_classes=spec["test_classes"], workers=2)
configs = protocol.grid({"ms": {"method": "ms"}})
started = time.perf_counter()
"""

REPORT = r"""
seconds = time.perf_counter() - started
print("RESULT " + json.dumps({"seconds": seconds, "R@1": [m["R@1"] for m in metrics],
                              "train_seconds": sum(m["train_seconds"] for m in metrics)}))
"""

GRID = (
    SETUP
    + r"""
from dmlstudy.study.grids import run_grid
metrics = [result.metrics for _, result in run_grid(configs, workers=2)]
"""
    + REPORT
)

POOL = (
    SETUP
    + r"""
os.environ["DMLSTUDY_TASK_THREADS"] = "1"  # what the LocalCluster gives each of its 2 workers on 2 cores
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from dmlstudy.study import engine
with ProcessPoolExecutor(2, mp_context=get_context("spawn")) as pool:
    metrics = list(pool.map(engine.train_task, [engine.task_values(config) for _, config in configs]))
"""
    + REPORT
)


def grid_once(source: Path, spec: dict, script: str = GRID) -> dict:
    environment = {**os.environ, "PYTHONPATH": str(source), "KMP_DUPLICATE_LIB_OK": "TRUE"}
    environment.pop("DMLSTUDY_SCHEDULER", None)
    environment.pop("DMLSTUDY_TASK_THREADS", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    completed = subprocess.run(
        [sys.executable, "-c", script, json.dumps(spec)],
        env=environment,
        cwd=source,
        capture_output=True,
        text=True,
        check=False,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (
        before.ru_utime + before.ru_stime
    )  # the whole process tree, imports included
    lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
    if completed.returncode or not lines:
        raise RuntimeError(f"grid in {source} failed:\n{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}")
    return {**json.loads(lines[-1][len("RESULT ") :]), "cpu": cpu}


def task_overhead(tasks: int) -> float:
    """Seconds per trivial task through the engine (submit, schedule, run, gather, progress bar)."""
    sys.path.insert(0, str(HERE))
    from dmlstudy.study import engine

    client = engine.get_client(2)
    engine.run_tasks(client, [("warm", abs, (1,), "warm")], what="warm-up", progress=False)
    started = time.perf_counter()
    engine.run_tasks(client, [(f"t{i}", abs, (-i,), f"noop-{i}") for i in range(tasks)], what="no-ops", progress=False)
    seconds = (time.perf_counter() - started) / tasks
    engine.shutdown()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--base",
        type=Path,
        default=None,
        help="worktree of the base commit (its process pool); without it, the pool side runs this tree's "
        "engine.train_task in a ProcessPoolExecutor of 2 one-thread processes (same training code on both sides)",
    )
    parser.add_argument("--data-root", default=str(HERE / "data"))
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps-per-epoch", type=int, default=20)
    parser.add_argument("--test-classes", type=int, default=0, help="0: all test classes (the study's evaluation)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--noop-tasks", type=int, default=50)
    args = parser.parse_args()

    load_start = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as scratch:
        for repeat in range(args.repeats):
            pair = {}
            pool_side = (args.base.resolve(), GRID) if args.base else (HERE, POOL)
            for name, source, script in (("pool", *pool_side), ("dask", HERE, GRID)):
                spec = {
                    "runs_root": f"{scratch}/{name}{repeat}",
                    "data_root": args.data_root,
                    "runs": args.runs,
                    "epochs": args.epochs,
                    "steps": args.steps_per_epoch,
                    "test_classes": args.test_classes,
                }
                pair[name] = grid_once(source, spec, script)
                print(
                    f"repeat {repeat} {name}: {pair[name]['seconds']:.1f} s wall, {pair[name]['cpu']:.1f} s CPU, R@1 {pair[name]['R@1']}",
                    flush=True,
                )
            rows.append(pair)
    noop = task_overhead(args.noop_tasks)
    print(
        f"\nload average at start {load_start:.1f}, at end {os.getloadavg()[0]:.1f}; "
        f"{args.runs} MS runs × {args.epochs} epochs × {args.steps_per_epoch} steps, {args.test_classes or 'all'} test classes, workers = 2\n"
    )
    print(
        "| repeat | pool wall s | dask wall s | wall overhead | pool CPU s | dask CPU s | CPU overhead | same R@1 |\n|---|---|---|---|---|---|---|---|"
    )
    for repeat, pair in enumerate(rows):
        pool, dask = pair["pool"], pair["dask"]
        print(
            f"| {repeat} | {pool['seconds']:.1f} | {dask['seconds']:.1f} | {100 * (dask['seconds'] - pool['seconds']) / pool['seconds']:+.1f} % "
            f"| {pool['cpu']:.1f} | {dask['cpu']:.1f} | {100 * (dask['cpu'] - pool['cpu']) / pool['cpu']:+.1f} % | {pool['R@1'] == dask['R@1']} |"
        )
    total = {
        name: {key: sum(pair[name][key] for pair in rows) for key in ("seconds", "cpu")} for name in ("pool", "dask")
    }
    print(
        f"| all | {total['pool']['seconds']:.1f} | {total['dask']['seconds']:.1f} | "
        f"{100 * (total['dask']['seconds'] - total['pool']['seconds']) / total['pool']['seconds']:+.1f} % | {total['pool']['cpu']:.1f} | "
        f"{total['dask']['cpu']:.1f} | {100 * (total['dask']['cpu'] - total['pool']['cpu']) / total['pool']['cpu']:+.1f} % | |"
    )
    print(f"\nengine per trivial task on a warm 2-worker cluster: {1000 * noop:.1f} ms ({args.noop_tasks} tasks)")


if __name__ == "__main__":
    main()
