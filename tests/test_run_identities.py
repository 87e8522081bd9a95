"""Every plan's comparison runs keep their names and identities: the folder name (``<regime>-<dataset>-<row>-seed<n>-``
and the digest of the run's configuration) of every run that the comparison entry of each plan in ``plans/`` trains
(main rows, classic rows, ablations), against the list in ``tests/run_identities.txt``. A refactor that moved one
would retrain it and orphan its finished folder; a change meant to move them writes the new list with

    .venv/bin/python tests/test_run_identities.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = Path(__file__).with_name("run_identities.txt")


def plan_run_identities() -> list[str]:
    """``<plan> <run folder name>`` per run of every plan's ``90_compare`` entry, in plan and grid order; a plan
    whose grid cannot be built here (its tuned values are written by a tuning run: ``plans/cub.yaml``) gives
    ``<plan> not built: <error type>``."""
    from dmlstudy.config import load_yaml
    from dmlstudy.experiments import compare

    lines = []
    for plan in sorted((ROOT / "plans").glob("*.yaml")):
        spec = load_yaml(plan.read_text())
        for entry in spec.get("entries", []) if isinstance(spec, dict) else []:
            if not str(entry.get("notebook", "")).endswith("90_compare.ipynb"):
                continue
            parameters = dict(entry.get("parameters") or {})
            parameters["protocol"] = {**parameters.get("protocol", {}), "study": spec.get("study", plan.stem)}
            name = f"plans/{plan.name}"
            try:
                config = compare.CompareStudy(**parameters)
                grid = compare.main_grid(config) + compare.classic_grid(config) + compare.ablations_grid(config)
            except FileNotFoundError as error:
                lines.append(f"{name} not built: {type(error).__name__}")
                continue
            lines += [f"{name} {Path(str(run.run_dir)).name}" for _, run in grid]
    return lines


def test_every_plans_comparison_runs_keep_their_names_and_identities():
    committed = COMMITTED.read_text().splitlines()
    now = plan_run_identities()
    moved = sorted(set(committed) ^ set(now))
    assert not moved, (
        f"{len(moved)} run names or identities differ from tests/run_identities.txt (first: {moved[:4]}); if the "
        "change is meant to move them, write the new list with `.venv/bin/python tests/test_run_identities.py`"
    )
    assert now == committed  # the same order: the same grids
    assert len(now) > 1000


if __name__ == "__main__":
    COMMITTED.write_text("\n".join(plan_run_identities()) + "\n")
    sys.exit(0)
