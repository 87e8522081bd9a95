"""Optuna on the Dask engine: one driver, trials as engine tasks, a journal file under runs/, and a study that
resumes after an interruption without repeating finished trials."""

import json

import optuna
import pandas as pd
import pytest

from dmlstudy import engine
from dmlstudy.tuning import finished_trials, journal_path, trial_config, tune


def learning_rates(trial):
    """A tiny MS space: the learning rate only."""
    return {"lr": trial.suggest_float("lr", 1e-3, 1e-1, log=True)}


class Interrupt(Exception):
    """Stands for the driver being stopped (Ctrl-C, a lost session)."""


@pytest.fixture(autouse=True)
def one_thread_tasks(monkeypatch):
    monkeypatch.setenv(engine.THREADS_VARIABLE, "1")
    monkeypatch.delenv(engine.SCHEDULER_VARIABLE, raising=False)


def test_trials_with_the_same_parameters_share_a_run(tiny_config):
    base = tiny_config()
    assert trial_config(base, {"lr": 0.01}, "s").run_dir == trial_config(base, {"lr": 0.01}, "s").run_dir
    assert trial_config(base, {"lr": 0.01}, "s").run_dir != trial_config(base, {"lr": 0.02}, "s").run_dir
    with pytest.raises(KeyError, match="unknown TrainConfig fields \\['learning_rate'\\]"):
        trial_config(base, {"learning_rate": 0.01}, "s")


def test_an_interrupted_search_resumes_without_repeating_finished_trials(tiny_config):
    base = tiny_config(epochs=2, steps_per_epoch=2)
    sampler = optuna.samplers.RandomSampler(seed=0)

    def stop_after_two(study, trial):
        if finished_trials(study) == 2:
            raise Interrupt

    with pytest.raises(Interrupt):
        tune(
            base,
            learning_rates,
            name="lr-search",
            n_trials=4,
            workers=2,
            sampler=sampler,
            on_trial=stop_after_two,
            poll_seconds=0.2,
        )
    assert journal_path(base, "lr-search").is_file()
    first = optuna.load_study(
        study_name="lr-search",
        storage=optuna.storages.JournalStorage(
            optuna.storages.journal.JournalFileBackend(str(journal_path(base, "lr-search")))
        ),
    )
    complete = first.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(complete) == 2
    stamps = {
        t.number: (
            t.params["lr"],
            t.value,
            (trial_config(base, t.params, "lr-search").run_dir / "metrics.json").stat().st_mtime_ns,
        )
        for t in complete
    }

    study = tune(
        base,
        learning_rates,
        name="lr-search",
        n_trials=4,
        workers=2,
        sampler=optuna.samplers.RandomSampler(seed=1),
        poll_seconds=0.2,
    )
    assert finished_trials(study) == 4
    complete = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(complete) == 4
    for number, (lr, value, stamp) in stamps.items():  # the first two: same values, their runs not retrained
        trial = study.trials[number]
        assert (trial.params["lr"], trial.value) == (lr, value)
        assert (trial_config(base, trial.params, "lr-search").run_dir / "metrics.json").stat().st_mtime_ns == stamp
    for trial in complete:  # each told value is its run's final R@1
        metrics = json.loads((trial_config(base, trial.params, "lr-search").run_dir / "metrics.json").read_text())
        assert trial.value == metrics["R@1"]
    assert len({t.params["lr"] for t in complete}) == 4


def test_a_pruned_trial_is_stopped_after_its_first_evaluated_epoch(tiny_config):
    base = tiny_config(epochs=40, steps_per_epoch=8, eval_every=1)  # long enough never to finish before the prune
    pruner = optuna.pruners.ThresholdPruner(lower=2.0)  # R@1 is never ≥ 2: prune at the first report
    study = tune(
        base,
        learning_rates,
        name="pruned",
        n_trials=1,
        workers=2,
        pruner=pruner,
        poll_seconds=0.05,
        sampler=optuna.samplers.RandomSampler(seed=0),
    )
    (trial,) = study.trials
    assert trial.state == optuna.trial.TrialState.PRUNED
    run_dir = trial_config(base, trial.params, "pruned").run_dir
    history = pd.read_csv(run_dir / "history.csv")
    assert 1 in trial.intermediate_values  # the driver read the evaluated epochs from the run's history
    for epoch, value in trial.intermediate_values.items():
        assert value == history.loc[history["epoch"] == epoch, "R@1"].item()
    assert not (run_dir / "metrics.json").is_file()  # stopped, not trained to the end
