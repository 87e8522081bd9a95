"""Some runs of a study plan trained again, in a folder of their own, and set beside a committed per-seed table:
the same configuration digest says they are the same runs, and equal metrics say the numerics reproduce them.

    .venv/bin/python benchmarks/rerun_runs.py plans/robust_partitions.yaml \\
        results/robust_partitions/runs_per_seed.csv emoji_p1:ms:0 emoji_p1:crt:0 --out results/rerun_partitions_pinned

Each ``dataset:method:seed`` is the plan's run as its comparison resolves it (``OneRun(study_plan=…)``: the
plan's protocol, regime and tuned values), trained in ``<out>/runs`` (kept, as the evidence; delete it to train
again). Writes ``<out>/runs_per_seed.csv`` (the study's per-seed columns, numerics included) and
``<out>/comparison.md``: per run and metric the committed value, the rerun's and whether they are equal to the
last digit. Exit status 1 when a digest or a metric differs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dmlstudy.experiments.one_run import OneRun
from dmlstudy.findings.claims import PER_SEED_METRICS, per_seed_table
from dmlstudy.run.protocol import ProtocolConfig, plan_protocol
from dmlstudy.run.train import run
from dmlstudy.study.grids import results_frame

STUDY = "rerun"
TIMED = {"seconds_to_best"}  # measured time: compared by nothing


def parse_run(text: str) -> tuple[str, str, int]:
    parts = text.split(":")
    if len(parts) != 3 or not parts[2].isdigit():
        raise SystemExit(f"rerun_runs: expected dataset:method:seed (e.g. emoji_p1:ms:0), got {text!r}")
    return parts[0], parts[1], int(parts[2])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("plan")
    parser.add_argument("committed", help="the per-seed table the runs are compared with")
    parser.add_argument("runs", nargs="+", help="dataset:method:seed")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    import pandas as pd  # after dmlstudy, whose import pins numpy's OpenBLAS before numpy loads it

    out = Path(args.out)
    root = out / "runs"
    results = []
    for dataset, method, seed in map(parse_run, args.runs):
        one = OneRun(study_plan=args.plan, dataset=dataset, method=method, seed=seed, study=STUDY, runs_root=str(root))
        results.append((method, run(one.resolved())))
    runs = results_frame(results).assign(regime=ProtocolConfig(**plan_protocol(args.plan)).regime)
    rerun = per_seed_table(runs)
    rerun.to_csv(out / "runs_per_seed.csv", index=False)
    committed = pd.read_csv(args.committed, dtype={"digest": str})
    keys = ["regime", "dataset", "row", "seed"]
    paired = rerun.merge(committed, on=keys, suffixes=(" rerun", " committed"), how="left")
    lines, differs = [], False
    for _, pair in paired.iterrows():
        name = f"{pair['dataset']} {pair['row']} seed {pair['seed']}"
        same_digest = pair["digest rerun"] == pair["digest committed"]
        differs |= not same_digest
        lines.append(
            f"| {name} | digest | {pair['digest committed']} | {pair['digest rerun']} | {'yes' if same_digest else 'NO'} |"
        )
        for metric in PER_SEED_METRICS:
            if metric in TIMED:
                continue
            a, b = pair[f"{metric} committed"], pair[f"{metric} rerun"]
            equal = a == b or (pd.isna(a) and pd.isna(b))
            differs |= not equal
            lines.append(f"| {name} | {metric} | {a!r} | {b!r} | {'yes' if equal else 'NO'} |")
    numerics = ", ".join(sorted(set(rerun["numerics"])))
    (out / "comparison.md").write_text(
        f"# {len(rerun)} runs of `{args.plan}` trained again ({numerics}) beside `{args.committed}`\n\n"
        "| run | field | committed | rerun | equal |\n|---|---|---|---|---|\n" + "\n".join(lines) + "\n"
    )
    print((out / "comparison.md").read_text())
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
