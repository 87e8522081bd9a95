"""Replay a tuning plan's finished Optuna journals through its pruner twice: once with every evaluated epoch
reported (as the searches ran) and once without the warm-up epochs (as ``dmlstudy.study.tuning`` reports them now),
and list every moment at which the two would have decided differently.

The pruner's inputs change only when an operation is appended to a study's journal (a report, a finished trial),
so comparing the two decisions for every running trial after every operation covers every poll the search made.
No difference anywhere means the search would have taken the same path under either rule, so the tuned values it
chose stand. The pruner, its settings, the warm-up and the journals' folder all come from the plan.

    .venv/bin/python benchmarks/pruner_replay.py plans/tune_pretrained.yaml
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import optuna
from optuna.study import StudyDirection
from optuna.trial import TrialState

from dmlstudy.study.tuning import PRUNERS, journal_path, load_tune_config

# Optuna's journal operation codes (optuna.storages.journal._storage.JournalOperation)
CREATE_TRIAL, SET_TRIAL_STATE_VALUES, SET_TRIAL_INTERMEDIATE_VALUE = 4, 6, 7


def replay(journal: Path, pruner: optuna.pruners.BasePruner, warmup_epochs: int) -> tuple[list[str], int, int]:
    """The moments in ``journal`` at which reporting the warm-up epochs or not changes the pruner's decision;
    then how many trials the journal records as pruned, and for how many of them the replay (warm-up reported,
    as the searches ran) decides "prune" just before: the replay's check on itself."""
    trials: list[dict] = []
    differences: list[str] = []
    pruned = agreeing = 0

    def frozen(trial: dict, skip_warmup: bool) -> SimpleNamespace:
        values = {step: value for step, value in trial["values"].items() if not (skip_warmup and step <= warmup_epochs)}
        return SimpleNamespace(
            intermediate_values=values, last_step=max(values) if values else None, number=trial["number"]
        )

    def decisions(skip_warmup: bool) -> dict[int, bool]:
        completed = [frozen(t, skip_warmup) for t in trials if t["state"] == TrialState.COMPLETE]
        study = SimpleNamespace(
            direction=StudyDirection.MAXIMIZE,
            get_trials=lambda deepcopy=False, states=None: completed,
        )
        return {
            t["number"]: pruner.prune(study, frozen(t, skip_warmup))
            for t in trials
            if t["state"] == TrialState.RUNNING and t["values"]
        }

    for line_number, line in enumerate(journal.read_text().splitlines(), 1):
        op = json.loads(line)
        code = op["op_code"]
        if code == CREATE_TRIAL:
            trials.append(
                {"number": len(trials), "state": TrialState(op.get("state", TrialState.RUNNING)), "values": {}}
            )
        elif code == SET_TRIAL_STATE_VALUES:
            if op["state"] == TrialState.PRUNED:
                pruned += 1
                agreeing += bool(decisions(False).get(op["trial_id"]))
            trials[op["trial_id"]]["state"] = TrialState(op["state"])
        elif code == SET_TRIAL_INTERMEDIATE_VALUE:
            trials[op["trial_id"]]["values"][int(op["step"])] = float(op["intermediate_value"])
        else:
            continue
        reported, skipped = decisions(False), decisions(True)
        for number in reported:
            if reported[number] != skipped[number]:
                differences.append(
                    f"{journal.name}:{line_number}: trial {number} "
                    f"{'pruned' if reported[number] else 'kept'} with the warm-up reported, "
                    f"{'pruned' if skipped[number] else 'kept'} without (values {trials[number]['values']})"
                )
    return differences, pruned, agreeing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("plan", type=Path, help="the tuning plan whose journals to replay (plans/tune_pretrained.yaml)")
    parser.add_argument(
        "--warmup-epochs", type=int, default=None, help="epochs left out of the reports (default: the plan regime's)"
    )
    args = parser.parse_args(argv)
    config = load_tune_config(args.plan)
    base = config.base_config(config.datasets[0])
    warmup = base.warmup_epochs if args.warmup_epochs is None else args.warmup_epochs
    folder = journal_path(base, "any").parent
    files = sorted(folder.glob("*.journal"))
    if not files:
        parser.error(f"no *.journal file in {folder}: run `dmlstudy tune {args.plan}` first")
    pruner = PRUNERS[config.pruner](config)
    total = pruned = agreeing = 0
    for journal in files:
        differences, journal_pruned, journal_agreeing = replay(journal, pruner, warmup)
        total, pruned, agreeing = total + len(differences), pruned + journal_pruned, agreeing + journal_agreeing
        print(f"{journal.name}: {len(differences)} differing decisions")
        for line in differences:
            print("  " + line)
    print(
        f"{len(files)} journals, warm-up of {warmup} epoch(s) left out: {total} differing decisions; "
        f"the replay prunes {agreeing} of the {pruned} trials they record as pruned"
    )
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
