"""Trials to a plateau: reads the Optuna journals of a tuning plan (default ``benchmarks/tune_plateau.yaml``, 16
trials per row) and applies the rule its header declares.

Run: ``.venv/bin/dmlstudy tune benchmarks/tune_plateau.yaml`` first, then
``.venv/bin/python benchmarks/tune_plateau.py [--plan benchmarks/tune_plateau.yaml] [--tolerance 0.005]``.

Per dataset × row it prints the best validation R@1 after 4, 8 and all trials (best-so-far in trial-number
order), the gain of the second half of the budget, the trials to a plateau (:func:`dmlstudy.study.tuning.
trials_to_plateau`), complete and pruned trials, the trials' summed training seconds, and the value the committed
``plans/tuned/<dataset>.yaml`` chose (scratch) for comparison. It saves the best-so-far figure
next to the journals (``<runs>/<plan name>/best_so_far.png``, or ``--figure``). Results go to
``benchmarks/README.md`` and ``benchmarks/tune_plateau.png``.

Noise yardstick (``--seed-runs``, default ``runs/default``, the default study's runs when present): a trial's value
is the best validation R@1 of one seed, so a best-so-far curve creeps up by chance alone. For each row the
script takes the standard deviation over seeds of the best validation R@1 of the study's runs of that row in the
plan's regime (``[pretrained-]<dataset>-<row>-seed<s>-…``: the tuned values, trained on the same folds as a
trial) and prints the gain the second half of the budget would show if every trial had the same expected value:
``sd · (E[max of n] − E[max of m])`` for ``n`` complete trials in all and ``m`` in the first half (expected maxima
of standard normal samples).

Confirmation (``--confirm-seeds 1 2 3 4``): a best-so-far value is a maximum over noisy single-seed trials, so it
overstates its configuration (the winner's curse). For every row whose best trial of the whole budget is not its
best of the first 4 (the study's budget), both configurations and the committed ``plans/tuned/`` values train
again with each of the given seeds — fresh seeds, not seed 0 that chose them — on the same folds, through the
engine. The paired differences of the budget choice's best validation R@1 from each of the other two are judged
by the study's rule (:func:`dmlstudy.verdicts.judge`: 95 % t-interval, ±1 point equivalence margin).
``--confirm-rows glyphs:softmax …`` restricts the confirmation to those rows. Still validation classes only: no
test image is read.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import numpy as np
import optuna
import pandas as pd

from dmlstudy.config import load_yaml
from dmlstudy.run.regimes import run_prefix
from dmlstudy.run.tuned import OBJECTIVE, tuned_file, tuned_overrides
from dmlstudy.search_space import merged
from dmlstudy.study import engine
from dmlstudy.study.tuning import (
    best_so_far,
    load_tune_config,
    open_storage,
    plot_best_so_far,
    row_sampler,
    row_spec,
    trial_config,
    trial_values,
    trials_to_plateau,
)
from dmlstudy.verdicts import judge


def committed_value(dataset: str, row: str) -> float | None:
    path = tuned_file("plans/tuned", dataset)
    rows = load_yaml(path.read_text()).get("rows", {}) if path.is_file() else {}
    return rows.get(row, {}).get(OBJECTIVE)


def seed_spread(runs: Path, dataset: str, row: str, regime: str = "scratch") -> float | None:
    """Sd over seeds of the best validation R@1 of the study's runs of ``regime``,
    ``[<regime>-]<dataset>-<row>-seed<s>-<digest>`` (the scratch runs have no prefix)."""
    label = f"{run_prefix(regime)}{dataset}-{row}"
    pattern = re.compile(rf"{re.escape(label)}-seed\d+-[0-9a-f]{{8}}")
    values = [
        pd.read_csv(history)[OBJECTIVE].max()
        for history in sorted(runs.glob(f"{label}-seed*/history.csv"))
        if pattern.fullmatch(history.parent.name)
    ]
    return float(np.std(values, ddof=1)) if len(values) >= 3 else None


def expected_maximum(count: int) -> float:
    """E[max of ``count`` independent standard normal samples] (0 for one sample), by quadrature."""
    if count <= 1:
        return 0.0
    from scipy.stats import norm

    x = np.linspace(-8.0, 8.0, 16001)
    density = count * norm.pdf(x) * norm.cdf(x) ** (count - 1)
    return float(np.trapezoid(x * density, x))


def best_trial(study: optuna.Study, first: int | None = None) -> optuna.trial.FrozenTrial:
    """The complete trial with the highest value (among the first ``first`` trial numbers, if given)."""
    complete = [
        trial
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if first is None or trial.number < first
    ]
    return max(complete, key=lambda trial: trial.value)


def confirm(
    config, studies: dict[tuple[str, str], optuna.Study], seeds: list[int], committed: str = "plans/tuned"
) -> pd.DataFrame:
    """Train each changed row's 4-trial choice, whole-budget choice and committed values (``committed``: the
    tuned-values folder the study read) with ``seeds``; judge the budget choice against the other two, paired."""
    runs, arms = {}, {}
    for (dataset, row), study in studies.items():
        early, late = best_trial(study, first=4), best_trial(study)
        if early.number == late.number:
            continue
        arms[(dataset, row)] = (early, late)
        choices = {
            "early": row_sampler(row)(optuna.trial.FixedTrial(early.params)),
            "late": row_sampler(row)(optuna.trial.FixedTrial(late.params)),
            "committed": merged(row_spec(row), tuned_overrides(committed, dataset, row)),
        }
        names = {"early": f"trial{early.number}", "late": f"trial{late.number}", "committed": "committed"}
        if choices["committed"] == choices["early"]:
            names["committed"] = names["early"]  # the same values: the same runs
        for arm, overrides in choices.items():
            for seed in seeds:
                base = dataclasses.replace(config.base_config(dataset), seed=seed)
                runs[(dataset, row, arm, seed)] = trial_config(
                    base, overrides, f"{dataset}-{row}-{names[arm]}-seed{seed}"
                )
    client = engine.get_client(config.workers)
    unique = {engine.run_task_key(run): run for run in runs.values()}
    metrics = engine.run_tasks(
        client,
        [(key, engine.train_task, (engine.task_values(run),), key) for key, run in unique.items()],
        what="confirmation runs",
    )
    table = []
    for (dataset, row), (early, late) in arms.items():
        values = {
            arm: [metrics[engine.run_task_key(runs[(dataset, row, arm, seed)])][OBJECTIVE] for seed in seeds]
            for arm in ("early", "late", "committed")
        }
        versus = {
            arm: judge([100 * (a - b) for a, b in zip(values["late"], values[arm])]) for arm in ("early", "committed")
        }
        table.append(
            {
                "dataset": dataset,
                "row": row,
                "4-trial choice": f"trial {early.number}: {early.value:.3f}",
                "budget choice": f"trial {late.number}: {late.value:.3f}",
                "seeds": " ".join(map(str, seeds)),
                "4-trial mean": np.mean(values["early"]),
                "committed mean": np.mean(values["committed"]),
                "budget mean": np.mean(values["late"]),
                **{
                    f"{label}: {column}": value
                    for arm, label in (("early", "vs 4-trial"), ("committed", "vs committed"))
                    for column, value in (
                        ("Δ", versus[arm].mean),
                        ("CI", f"{versus[arm].low:.1f} … {versus[arm].high:.1f}"),
                        ("verdict", versus[arm].outcome),
                        ("seeds to decide", versus[arm].seeds_to_decide),
                    )
                },
            }
        )
    return pd.DataFrame(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", default="benchmarks/tune_plateau.yaml")
    parser.add_argument("--tolerance", type=float, default=0.005, help="validation R@1 (0.005 = 0.5 points)")
    parser.add_argument("--seed-runs", default="runs/default", help="a study's runs folder for the seed spread")
    parser.add_argument("--figure", default="", help="best-so-far figure [default: <runs>/<plan name>/best_so_far.png]")
    parser.add_argument("--confirm-seeds", type=int, nargs="*", default=[], help="retrain changed choices with these")
    parser.add_argument(
        "--confirm-rows", nargs="*", default=[], metavar="DATASET:ROW", help="confirm only these rows [default: all]"
    )
    args = parser.parse_args()
    config = load_tune_config(args.plan)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    table, curves, studies = [], {}, {}
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
            if finished:
                studies[(dataset, row)] = study
            states = [trial.state for trial in study.trials]
            seconds = sum(
                (trial.datetime_complete - trial.datetime_start).total_seconds()
                for trial in study.trials
                if trial.datetime_complete and trial.datetime_start
            )
            complete = [value is not None for value in values]
            spread = seed_spread(Path(args.seed_runs), dataset, row, config.regime)
            chance = (
                spread * (expected_maximum(sum(complete)) - expected_maximum(sum(complete[:half])))
                if spread is not None and finished
                else None
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
                    "seed sd": spread,
                    "chance gain": chance,
                    "complete": states.count(optuna.trial.TrialState.COMPLETE),
                    "pruned": states.count(optuna.trial.TrialState.PRUNED),
                    "trial seconds": round(seconds),
                    "plans/tuned": committed_value(dataset, row),
                }
            )
    frame = pd.DataFrame(table)
    print(frame.to_markdown(index=False, floatfmt=".3f"))
    if curves:
        figure = plot_best_so_far(curves)
        path = Path(args.figure) if args.figure else Path(base.run_dir.parent) / "best_so_far.png"
        figure.savefig(path, dpi=120, bbox_inches="tight")
        print(f"figure: {path}")
    if args.confirm_rows:
        studies = {key: study for key, study in studies.items() if ":".join(key) in args.confirm_rows}
    if args.confirm_seeds and studies:
        print(confirm(config, studies, args.confirm_seeds).to_markdown(index=False, floatfmt=".3f"))


if __name__ == "__main__":
    main()
