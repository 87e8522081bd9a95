"""Hyperparameter search with Optuna on the Dask engine.

One driver (this process) asks Optuna for trials (``study.ask()``), submits each trial's run as an engine task
(:func:`dmlstudy.engine.train_task`), reports every evaluated epoch to the pruner as the run writes it, and
tells the result when the task ends (``study.tell()``). Only the driver touches the storage, so Optuna's
journal file (the default, ``<runs_root>/<study>/tuning/<name>.journal``) is safe on one machine and on a
cluster's shared filesystem; an RDB URL (``storage="postgresql://…"``) is the alternative.

Decisions:

* **Search space**: a function ``(trial) -> dict of TrainConfig overrides``; per-method spaces are a later issue.
* **Objective**: the run's final ``objective`` metric (default R@1), which today is measured on the *test*
  classes: a search on it selects hyperparameters on the test set. Validation-class splits are a later issue;
  until then report tuned numbers as such.
* **Trials are runs**: a trial's run folder is named by a digest of its overrides (``<name>-<digest>``), so a
  trial with the same parameters reuses (resumes, or just loads) the same run.
* **Intermediate values** reach the driver through the run's ``history.csv`` (written after every epoch on the
  shared runs root), which the driver reads every ``poll_seconds``: the task needs no channel back to the
  driver, and the storage is written by the driver alone. A pruned trial is told ``PRUNED`` at once, its
  task cancelled, and (``train.run`` has no per-epoch stop) the worker training it restarted by its nanny.
* **Resuming**: re-running :func:`tune` with the same name continues the study: finished trials (complete,
  pruned, failed) count towards ``n_trials`` and are never repeated; a trial left running by an interrupted
  driver is marked failed and its parameters are queued again, so it resumes its run folder from the last
  checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pandas as pd

from dmlstudy import engine
from dmlstudy.train import TrainConfig, load_datasets

SearchSpace = Callable[[optuna.trial.BaseTrial], dict[str, Any]]
INTERRUPTED = "interrupted_trials"  # study user attribute: numbers of trials failed because the driver stopped
FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)


def journal_path(base: TrainConfig, name: str) -> Path:
    return base.run_dir.parent / "tuning" / f"{name}.journal"


def open_storage(storage: str, base: TrainConfig, name: str):
    """``""``: a journal file under the study's runs folder; otherwise an RDB URL (``sqlite:///…``,
    ``postgresql://…``) or a path ending in ``.journal``."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    if storage and "://" in storage:
        return storage
    path = Path(storage) if storage else journal_path(base, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(str(path)))


def trial_config(base: TrainConfig, overrides: dict[str, Any], name: str) -> TrainConfig:
    """The run of a trial: ``base`` with the overrides, named by their digest (same parameters, same run)."""
    unknown = sorted(set(overrides) - set(TrainConfig.field_names()))
    if unknown:
        raise KeyError(
            f"search space returned unknown TrainConfig fields {unknown}; valid: {TrainConfig.field_names()}"
        )
    digest = hashlib.sha1(json.dumps(overrides, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return TrainConfig(
        **{**base.to_dict(), **overrides, "run_name": f"{name}-{digest}", "resume": True, "progress": False}
    )


def _recover_interrupted(study: optuna.Study) -> None:
    """Trials still RUNNING when a driver opens the study were left by an interrupted driver (there is only
    one): fail them and queue their parameters again."""
    stale = [trial for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))]
    if not stale:
        return
    study.set_user_attr(INTERRUPTED, sorted({*study.user_attrs.get(INTERRUPTED, []), *(t.number for t in stale)}))
    for trial in stale:
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
        study.enqueue_trial(trial.params)


def finished_trials(study: optuna.Study) -> int:
    """Trials that count towards ``n_trials``: complete, pruned or failed, except those failed by an interruption."""
    interrupted = set(study.user_attrs.get(INTERRUPTED, []))
    return sum(1 for t in study.get_trials(deepcopy=False, states=FINISHED) if t.number not in interrupted)


def _epoch_values(run_dir: Path, objective: str) -> list[tuple[int, float]]:
    """``(epoch, value)`` of every evaluated epoch in a run's history so far (none while it is being written)."""
    try:
        history = pd.read_csv(run_dir / "history.csv")
    except (FileNotFoundError, pd.errors.EmptyDataError, pd.errors.ParserError):
        return []
    if objective not in history:
        return []
    return [
        (int(epoch), float(value))
        for epoch, value in zip(history["epoch"], history[objective])
        if not math.isnan(value)
    ]


def tune(
    base: TrainConfig,
    space: SearchSpace,
    *,
    name: str,
    n_trials: int,
    workers: int = 1,
    storage: str = "",
    objective: str = "R@1",
    direction: str = "maximize",
    sampler: optuna.samplers.BaseSampler | None = None,
    pruner: optuna.pruners.BasePruner | None = None,
    poll_seconds: float = 1.0,
    on_trial: Callable[[optuna.Study, optuna.trial.FrozenTrial], None] | None = None,
) -> optuna.Study:
    """Run (or continue) the Optuna study ``name`` until ``n_trials`` trials have finished, ``workers`` trials
    at a time on the engine (see the module docstring). ``on_trial(study, trial)`` is called after each tell."""
    if n_trials < 1 or workers < 1:
        raise ValueError(f"tune: n_trials and workers must be ≥ 1, got {n_trials} and {workers}")
    study = optuna.create_study(
        study_name=name,
        storage=open_storage(storage, base, name),
        direction=direction,
        sampler=sampler,
        pruner=pruner,
        load_if_exists=True,
    )
    _recover_interrupted(study)
    load_datasets(base)  # generate an embedded dataset here once, not in every worker at the same time
    client = engine.get_client(workers)
    slots = max(1, sum(info.get("nthreads", 1) for info in client.scheduler_info()["workers"].values()))
    in_flight: dict[Any, tuple[optuna.trial.Trial, TrainConfig]] = {}
    reported: dict[int, int] = {}  # trial number -> last epoch reported

    def tell(trial, state, value=None):
        frozen = study.tell(trial, value, state=state) if value is not None else study.tell(trial, state=state)
        if on_trial is not None:
            on_trial(study, frozen)

    try:
        while True:
            while finished_trials(study) + len(in_flight) < n_trials and len(in_flight) < slots:
                trial = study.ask()
                try:
                    config = trial_config(base, space(trial), name)
                except Exception:  # a bad search space: the trial fails, the error reaches the caller
                    study.tell(trial, state=optuna.trial.TrialState.FAIL)
                    raise
                trial.set_user_attr("run_dir", str(config.run_dir))
                future = client.submit(
                    engine.train_task, engine.task_values(config), key=engine.run_task_key(config), pure=False
                )
                in_flight[future] = (trial, config)
            if not in_flight:
                return study
            done = {future for future in in_flight if future.done()}
            if not done:
                time.sleep(poll_seconds)
            for future in list(in_flight):
                trial, config = in_flight[future]
                if future in done:
                    del in_flight[future]
                    if future.status == "finished":
                        tell(trial, optuna.trial.TrialState.COMPLETE, future.result()[objective])
                    else:
                        trial.set_user_attr("error", engine.failure_line(future))
                        tell(trial, optuna.trial.TrialState.FAIL)
                    future.release()
                    continue
                for epoch, value in _epoch_values(config.run_dir, objective):
                    if epoch > reported.get(trial.number, 0):
                        trial.report(value, epoch)
                        reported[trial.number] = epoch
                if reported.get(trial.number) and trial.should_prune():
                    del in_flight[future]
                    _stop(client, future)
                    tell(trial, optuna.trial.TrialState.PRUNED)
    finally:
        for future in in_flight:  # interrupted: the trials stay RUNNING in storage and are recovered next time
            future.cancel()


def _stop(client, future) -> None:
    """Cancel a trial's task; if a worker is already training it, restart that worker (its nanny starts a
    fresh process), since a running task cannot be interrupted."""
    addresses = [address for address, keys in client.processing().items() if future.key in keys]
    future.cancel()
    if addresses:  # the nanny starts a fresh worker; do not fail the search if that is slow
        client.restart_workers(addresses, raise_for_error=False)
