"""Trials to a plateau: reads the Optuna journals of a tuning plan (default ``benchmarks/tune_plateau.yaml``, 16
trials per row) and applies the rule its header declares (issue 21).

Run: ``.venv/bin/dmlstudy tune benchmarks/tune_plateau.yaml`` first, then
``.venv/bin/python benchmarks/tune_plateau.py [--plan benchmarks/tune_plateau.yaml] [--tolerance 0.005]``.

Per dataset × row it prints the best validation R@1 after 4, 8 and all trials (best-so-far in trial-number
order), the gain of the second half of the budget, the trials to a plateau (:func:`dmlstudy.tuning.
trials_to_plateau`), complete and pruned trials, the trials' summed training seconds, and the value the committed
``plans/tuned/<dataset>.yaml`` chose (the study's 4-trial budget) for comparison. It saves the best-so-far figure
next to the journals (``<runs>/<plan name>/best_so_far.png``). Results go to ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import optuna
import pandas as pd

from dmlstudy.config import load_yaml
from dmlstudy.tuning import (
    OBJECTIVE,
    best_so_far,
    load_tune_config,
    open_storage,
    plot_best_so_far,
    trial_values,
    trials_to_plateau,
    tuned_file,
)


def committed_value(dataset: str, row: str) -> float | None:
    path = tuned_file("plans/tuned", dataset)
    rows = load_yaml(path.read_text()).get("rows", {}) if path.is_file() else {}
    return rows.get(row, {}).get(OBJECTIVE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", default="benchmarks/tune_plateau.yaml")
    parser.add_argument("--tolerance", type=float, default=0.005, help="validation R@1 (0.005 = 0.5 points)")
    args = parser.parse_args()
    config = load_tune_config(args.plan)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    table, curves = [], {}
    for dataset in config.datasets:
        base = config.base_config(dataset)
        for row in config.rows:
            name = f"{dataset}-{row}"
            try:
                study = optuna.load_study(study_name=name, storage=open_storage(config.storage, base, name))
            except KeyError:
                continue  # not tuned yet
            values = trial_values(study)
            curve = best_so_far(values)
            curves[(dataset, row)] = values
            half, finished = config.trials // 2, len(values) >= config.trials
            states = [trial.state for trial in study.trials]
            seconds = sum(
                (trial.datetime_complete - trial.datetime_start).total_seconds()
                for trial in study.trials
                if trial.datetime_complete and trial.datetime_start
            )
            table.append(
                {
                    "dataset": dataset,
                    "row": row,
                    "trials": len(values),
                    "best@4": curve[min(3, len(curve) - 1)],
                    f"best@{half}": curve[half - 1] if len(curve) >= half else None,
                    "best": curve[-1],
                    "second-half gain": curve[-1] - curve[half - 1] if finished else None,
                    "plateaued": (curve[-1] - curve[half - 1] < args.tolerance) if finished else "unfinished",
                    "trials to plateau": trials_to_plateau(values, args.tolerance) if finished else None,
                    "complete": states.count(optuna.trial.TrialState.COMPLETE),
                    "pruned": states.count(optuna.trial.TrialState.PRUNED),
                    "trial seconds": round(seconds),
                    "committed (4 trials)": committed_value(dataset, row),
                }
            )
    frame = pd.DataFrame(table)
    print(frame.to_markdown(index=False, floatfmt=".3f"))
    if curves:
        figure = plot_best_so_far(curves)
        path = Path(base.run_dir.parent) / "best_so_far.png"
        figure.savefig(path, dpi=120, bbox_inches="tight")
        print(f"figure: {path}")


if __name__ == "__main__":
    main()
