"""Optuna on the Dask engine: one driver, trials as engine tasks, a journal file under runs/, and a study that
resumes after an interruption without repeating finished trials."""

import json
import math
import textwrap
from pathlib import Path

import optuna
import pandas as pd
import pytest
import torch
import yaml

from dmlstudy import search_space as search
from dmlstudy.cli import main
from dmlstudy.config import load_yaml
from dmlstudy.methods import search_space
from dmlstudy.run.model import build_model
from dmlstudy.run.train import TrainConfig
from dmlstudy.run.tuned import RowResult, TunedValuesError, list_rows, tuned_overrides, write_tuned
from dmlstudy.study import engine, tuning
from dmlstudy.study.tuning import (
    TuneConfig,
    best_so_far,
    finished_trials,
    journal_path,
    load_tune_config,
    row_sampler,
    row_spec,
    trial_config,
    trials_to_plateau,
    tune,
    tune_row,
)

ROOT = Path(__file__).resolve().parents[1]


def learning_rates(trial):
    """A tiny MS space: the learning rate only."""
    return {"lr": trial.suggest_float("lr", 1e-3, 1e-1, log=True)}


class Interrupt(Exception):
    """Stands for the driver being stopped (Ctrl-C, a lost connection)."""


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
            objective="R@1",  # the engine's mechanics on runs without validation classes
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
        objective="R@1",
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
        objective="R@1",
    )
    (trial,) = study.trials
    assert trial.state == optuna.trial.TrialState.PRUNED
    run_dir = trial_config(base, trial.params, "pruned").run_dir
    history = pd.read_csv(run_dir / "history.csv")
    assert 1 in trial.intermediate_values  # the driver read the evaluated epochs from the run's history
    for epoch, value in trial.intermediate_values.items():
        assert value == history.loc[history["epoch"] == epoch, "R@1"].item()
    assert not (run_dir / "metrics.json").is_file()  # stopped, not trained to the end


def test_the_pruner_is_not_told_a_warm_up_evaluation(tmp_path):
    """A pretrained trial's warm-up state is neither chosen nor counted by its run, so the pruner never sees it
    either (Optuna's median rule would otherwise compare the trial's best value so far, warm-up included)."""
    pd.DataFrame({"epoch": [1, 2, 3], "val_R@1": [0.6, 0.4, float("nan")]}).to_csv(tmp_path / "history.csv")
    assert tuning._epoch_values(tmp_path, "val_R@1") == [(1, 0.6), (2, 0.4)]
    assert tuning._epoch_values(tmp_path, "val_R@1", warmup_epochs=1) == [(2, 0.4)]


@pytest.mark.parametrize("warmup_value, differences", [(0.6, 1), (0.3, 0)])
def test_the_pruner_replay_finds_a_decision_the_warm_up_report_changes(tmp_path, warmup_value, differences):
    """benchmarks/pruner_replay.py, the check behind keeping plans/tuned/pretrained/: three finished trials at 0.5
    on epoch 2 and one pruned there, then a trial at 0.4 on epoch 2 is kept by the median rule only if its
    warm-up value (epoch 1) is above 0.5 and counted."""
    import importlib.util

    path = ROOT / "benchmarks" / "pruner_replay.py"
    spec = importlib.util.spec_from_file_location("pruner_replay", path)
    replay = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(replay)
    journal = tmp_path / "row.journal"
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
    study = optuna.create_study(study_name="row", storage=storage, direction="maximize")
    for _ in range(3):
        trial = study.ask()
        for step, value in [(1, 0.3), (2, 0.5), (3, 0.55)]:
            trial.report(value, step)
        study.tell(trial, 0.55)
    trial = study.ask()  # below the median at epoch 2 either way: pruned, as the replay must find too
    trial.report(0.3, 1)
    trial.report(0.2, 2)
    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    trial = study.ask()
    trial.report(warmup_value, 1)
    trial.report(0.4, 2)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=2)
    found, pruned, agreeing = replay.replay(journal, pruner, warmup_epochs=1)
    assert (pruned, agreeing) == (1, 1)
    assert len(found) == differences
    if differences:
        assert "trial 4 kept with the warm-up reported, pruned without" in found[0]


# ----------------------------------------------------------------------------------------------
# Declared search spaces, rows, tuned-values files, dmlstudy tune
# ----------------------------------------------------------------------------------------------
ROWS = list_rows()


def test_every_registered_method_and_the_softmax_variant_is_a_row_with_a_learning_rate():
    assert {"ms", "crt", "diml", "cross_attention", "dgcrl", "softmax", "triplet", "proxyanchor"} <= set(ROWS)
    for row in ROWS:
        space = search_space(row)
        assert space["lr"] == search.LR
        assert all(key in TrainConfig.field_names() or key.startswith("method_kwargs.") for key in space)
    assert "head_lr" in search_space("proxyanchor") and "head_lr" not in search_space("triplet")
    # softmax is DGCRL without the switched-off parts: no N-S scale, no margin, no decorrelation
    assert set(search_space("softmax")) == set(search_space("dgcrl")) - {
        "method_kwargs.alpha",
        "method_kwargs.margin",
        "method_kwargs.decorrelation_weight",
    }


def _tiny_forward_and_loss(config: TrainConfig) -> None:
    method = build_model(config, num_classes=6)
    images, labels = torch.randn(12, 3, 32, 32), torch.arange(6).repeat_interleave(2)
    assert method(images).shape == (12, config.embedding_dim)
    loss, _ = method.loss(images, labels)
    assert torch.isfinite(loss)
    loss.backward()


@pytest.mark.parametrize("row", ROWS)
def test_a_rows_space_builds_a_config_and_a_model_at_its_paper_values_and_at_a_sampled_trial(row):
    space = search_space(row)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3), direction="maximize")
    study.enqueue_trial(search.paper_values(space))
    sample = row_sampler(row)
    paper, drawn = sample(study.ask()), sample(study.ask())
    for overrides in (paper, drawn):
        config = TrainConfig(**search.merged({"image_size": 32, "embedding_dim": 16}, overrides))
        _tiny_forward_and_loss(config)
    expected = search.merged(row_spec(row), search.nested(search.paper_values(space)))
    assert paper == expected
    if space:  # a drawn trial differs from the paper values and stays inside the declared ranges
        flat = {key: value for key, value in search.paper_values(space).items()}
        assert any(drawn_value != flat[key] for key, drawn_value in _leaves(drawn, space).items())
        for key, value in _leaves(drawn, space).items():
            parameter = space[key]
            assert parameter.low <= value <= parameter.high if hasattr(parameter, "low") else value in parameter.choices


def _leaves(overrides: dict, space) -> dict:
    values = {}
    for key in space:
        node = overrides
        for part in key.split("."):
            node = node[part]
        values[key] = node
    return values


@pytest.mark.parametrize(
    "name,value,message",
    [
        ("pruner", "hyperband", r"parameter 'pruner' must be one of \['halving', 'median', 'none'\], got 'hyperband'"),
        ("validation_folds", 0, r"parameter 'validation_folds' must be ≥ 2: trials are scored on validation classes"),
        ("trials", 0, r"parameters 'trials' and 'workers' must be ≥ 1"),
        ("rows", ["ms", "msx"], r"parameter 'rows': unknown rows \['msx'\]; valid: \[.*'ms'"),
        (
            "regime",
            "no-such-regime",
            r"parameter 'regime': unknown regime 'no-such-regime'; valid: \[.*'pretrained', 'scratch'\]",
        ),
    ],
)
def test_a_tuning_plan_with_a_bad_value_names_the_parameter(name, value, message):
    with pytest.raises(ValueError, match=message):
        TuneConfig(**{name: value})


def test_a_tuning_plans_rows_are_names_the_registry_or_the_rows_of_a_study_plans_comparison(tmp_path):
    from dmlstudy.rows import RERANK
    from dmlstudy.study.plan import load_plan

    [comparison] = [
        e.parameters for e in load_plan(ROOT / "plans" / "default.yaml") if "classic_methods" in e.parameters
    ]
    shown = [*comparison["methods"], *comparison["classic_methods"]]
    expected = list(dict.fromkeys("ms" if name == RERANK else name for name in shown))  # re-ranking reads ms runs
    assert load_tune_config(ROOT / "plans" / "tune.yaml").rows == expected
    assert load_tune_config(ROOT / "plans" / "tune_pretrained.yaml").rows == expected
    assert TuneConfig(rows="registry").rows == list_rows()
    assert TuneConfig(rows=["triplet", "registry"]).rows == ["triplet", *(r for r in list_rows() if r != "triplet")]
    plan = _write(tmp_path / "study.yaml", "entries: [{name: a, notebook: notebooks/01_train.ipynb}]\n")
    with pytest.raises(ValueError, match=r"study\.yaml: no entry of this study plan lists rows"):
        TuneConfig(rows=str(plan))


def test_a_row_without_a_learning_rate_in_its_search_space_is_refused():
    from dmlstudy.methods import METHOD_INFO, METHODS, register_method
    from dmlstudy.methods.baseline import Baseline

    register_method("no_lr_space", search_space={"method_kwargs.pooling": search.Choice(("avg", "max"), "avg")})(
        Baseline
    )
    try:
        with pytest.raises(ValueError, match=r"\['no_lr_space'\] declare no 'lr' in their search space"):
            TuneConfig(rows=["ms", "no_lr_space"])
    finally:
        METHODS.pop("no_lr_space")
        METHOD_INFO.pop("no_lr_space")


def test_trials_start_and_train_as_the_plans_regime_says():
    from dmlstudy.run.regimes import regime_overrides

    scratch, pretrained = (
        TuneConfig(regime=name, epochs=6).base_config("glyphs") for name in ("scratch", "pretrained")
    )
    assert scratch.checkpoint_path == "" and not scratch.freeze_bn and scratch.warmup_epochs == 0
    overrides = regime_overrides("pretrained", backbone="dml_convnet", epochs=6)
    assert {name: getattr(pretrained, name) for name in overrides} == overrides and overrides["freeze_bn"]
    assert pretrained.final_test is False and pretrained.run_dir != scratch.run_dir
    with pytest.raises(ValueError, match="parameter 'regime': 'pretrained' loads weights of backbone 'dml_convnet'"):
        TuneConfig(regime="pretrained", backbone="resnet18")


def test_the_softmax_row_keeps_its_variants_switched_off_parts():
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    overrides = row_sampler("softmax")(study.ask())
    assert overrides["method"] == "dgcrl"
    assert overrides["method_kwargs"] == {"normalize_scale": False, "margin": 0.0, "decorrelation": "none"}
    assert set(overrides) == {"method", "method_kwargs", "lr", "head_lr"}


def test_trials_to_plateau_counts_the_trials_whose_best_is_within_tolerance_of_the_last_best():
    values = [0.40, None, 0.43, 0.41, 0.446, None, 0.449]  # best so far: .40 .40 .43 .43 .446 .446 .449
    assert trials_to_plateau(values, tolerance=0.005) == 5  # .446 ≥ .449 − .005 first at the fifth trial
    assert trials_to_plateau(values, tolerance=0.02) == 3
    assert trials_to_plateau(values, tolerance=0.0) == 7
    assert trials_to_plateau([None, None], tolerance=0.005) == 0


def test_flattened_is_the_inverse_of_nested():
    values = {"lr": 0.001, "method_kwargs": {"loss_kwargs": {"alpha": 2.0, "beta": 40.0}, "num_blocks": 4}}
    flat = search.flattened(values)
    assert flat == {"lr": 0.001, "method_kwargs.loss_kwargs.alpha": 2.0, "method_kwargs.loss_kwargs.beta": 40.0,
                    "method_kwargs.num_blocks": 4}  # fmt: skip
    assert search.nested(flat) == values


def test_search_space_primitives_reject_paper_values_outside_their_range():
    with pytest.raises(ValueError, match="outside"):
        search.LogFloat(1e-4, 1e-2, paper=0.1)
    with pytest.raises(ValueError, match="low must be > 0"):
        search.LogFloat(0.0, 1.0, paper=0.5)
    with pytest.raises(TypeError, match="integers"):
        search.Int(1, 6, paper=2.5)


def _write(path, text: str):
    path.write_text(textwrap.dedent(text))
    return path


def test_tuned_values_are_read_nested_and_an_absent_row_or_file_gives_the_paper_defaults(tmp_path):
    path = _write(
        tmp_path / "synbirds.yaml",
        """
        dataset: synbirds
        rows:
          ms: {overrides: {lr: 1.0e-3, method_kwargs: {loss_kwargs: {alpha: 3}}}, val_R@1: 0.5, trials: 4}
          cross_attention: {overrides: {method_kwargs: {num_blocks: 2}}, val_R@1: 0.4, trials: 4}
        """,
    )
    assert tuned_overrides(path, "synbirds", "ms") == {"lr": 1e-3, "method_kwargs": {"loss_kwargs": {"alpha": 3}}}
    assert tuned_overrides(tmp_path, "synbirds", "cross_attention") == {"method_kwargs": {"num_blocks": 2}}
    assert tuned_overrides(tmp_path, "synbirds", "dgcrl") == {}
    assert tuned_overrides(tmp_path, "glyphs", "ms") == {}


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ("nosuchmethod: {overrides: {lr: 0.001}}", "key 'rows.nosuchmethod': unknown row"),
        ("ms: {overrides: {lr: fast}}", "key 'rows.ms.overrides.lr' must be float, got str 'fast'"),
        (
            "cross_attention: {overrides: {method_kwargs: {num_blocks: 2.5}}}",
            "key 'rows.cross_attention.overrides.method_kwargs.num_blocks' must be int, got float 2.5",
        ),
        ("triplet: {overrides: {head_lr: 0.01}}", "key 'rows.triplet.overrides.head_lr' is not in triplet's search"),
    ],
)
def test_a_tuned_file_with_an_unknown_row_or_a_wrong_type_names_the_file_the_key_and_the_type(tmp_path, rows, message):
    path = _write(tmp_path / "glyphs.yaml", f"dataset: glyphs\nrows:\n  {rows}\n")
    with pytest.raises(TunedValuesError) as error:
        tuned_overrides(path, "glyphs", "ms")
    assert str(error.value).startswith(f"{path}: ") and message in str(error.value)


def test_best_so_far_is_the_running_maximum_of_complete_trials():
    curve = best_so_far([None, 0.2, None, 0.1, 0.4])
    assert math.isnan(curve[0]) and curve[1:] == [0.2, 0.2, 0.2, 0.4]


def test_a_row_study_killed_after_k_trials_resumes_at_trial_k_plus_one(tmp_path, monkeypatch):
    """Trial 0 is the paper defaults; after an interruption at k = 2 finished trials the next run of the same
    plan asks trial 2 first and keeps trials 0 and 1 as they were."""
    plan = _write(tmp_path / "plan.yaml", SMOKE_OVERRIDES.format(root=tmp_path, trials=4, rows="[triplet]"))
    config = load_tune_config(plan)
    calls = []
    original = tuning.tune

    def interrupted(*args, **kwargs):
        def stop_after_two(study, trial):
            calls.append(trial.number)
            if finished_trials(study) == 2:
                raise Interrupt

        return original(*args, **kwargs, on_trial=stop_after_two)

    monkeypatch.setattr(tuning, "tune", interrupted)
    with pytest.raises(Interrupt):
        tune_row(config, "synbirds", "triplet", poll_seconds=0.1)
    monkeypatch.setattr(tuning, "tune", original)
    assert calls == [0, 1]
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(
            str(journal_path(config.base_config("synbirds"), "synbirds-triplet"))
        )
    )
    first = optuna.load_study(study_name="synbirds-triplet", storage=storage).trials
    assert first[0].params == search.paper_values(search_space("triplet"))
    result = tune_row(config, "synbirds", "triplet", poll_seconds=0.1)
    study = optuna.load_study(study_name="synbirds-triplet", storage=storage)
    assert result.trials == finished_trials(study) == 4
    assert [t.number for t in study.trials] == [0, 1, 2, 3]  # resumed at trial 2 = k + 1 in 1-based counting
    for before, after in zip(first[:2], study.trials[:2]):
        assert (before.params, before.value, before.state) == (after.params, after.value, after.state)


SMOKE_OVERRIDES = """
name: tune_test
datasets: [synbirds]
rows: {rows}
trials: {trials}
startup_trials: 1
workers: 1
pruner: none
out_dir: {root}/tuned
figure: {root}/best.png
runs_root: {root}/runs
epochs: 2
eval_every: 1
validation_folds: 4
patience: 1
image_size: 32
embedding_dim: 16
classes_per_batch: 4
samples_per_class: 3
steps_per_epoch: 2
train_classes: 12
test_classes: 8
"""


def test_dmlstudy_tune_on_the_smoke_plan_writes_checked_tuned_values_and_the_figure(tmp_path):
    smoke = load_tune_config(ROOT / "plans" / "tune_smoke.yaml")
    assert len(smoke.rows) == 2 and smoke.trials <= 3
    status = main(
        [
            "tune",
            str(ROOT / "plans" / "tune_smoke.yaml"),
            "--runs-root",
            str(tmp_path / "runs"),
            "--out-dir",
            str(tmp_path / "tuned"),
            "--figure",
            str(tmp_path / "best.png"),
        ]
    )
    assert status == 0
    assert (tmp_path / "best.png").stat().st_size > 0
    for dataset in smoke.datasets:
        path = tmp_path / "tuned" / f"{dataset}.yaml"
        text = path.read_text()
        assert text.startswith("# Tuned hyperparameters") and "# command: dmlstudy tune" in text
        content = load_yaml(text)
        assert sorted(content["rows"]) == sorted(smoke.rows)
        for row in smoke.rows:
            entry = content["rows"][row]
            assert entry["trials"] == smoke.trials
            overrides = tuned_overrides(path, dataset, row)
            assert set(search.paper_values(search_space(row))) == set(_leaves(overrides, search_space(row)))
            storage = optuna.storages.JournalStorage(
                optuna.storages.journal.JournalFileBackend(
                    str(tmp_path / "runs" / smoke.name / "tuning" / f"{dataset}-{row}.journal")
                )
            )
            study = optuna.load_study(study_name=f"{dataset}-{row}", storage=storage)
            assert entry["val_R@1"] == pytest.approx(study.best_value)  # the best trial's objective
            best_run = trial_config(
                load_tune_config(ROOT / "plans" / "tune_smoke.yaml", runs_root=str(tmp_path / "runs")).base_config(
                    dataset
                ),
                search.merged(row_spec(row), overrides),
                f"{dataset}-{row}",
            ).run_dir
            metrics = json.loads((best_run / "metrics.json").read_text())
            assert entry["val_R@1"] == pytest.approx(metrics["val_R@1"], abs=1e-6)
            assert "R@1" not in metrics  # final_test=False: the test classes were never evaluated


def test_the_regime_tuning_check_pairs_each_seeds_runs_by_their_tuned_values(tmp_path):
    """benchmarks/regime_tuning.py, the rule of plans/tune_pretrained.yaml: per seed, the pretrained run with the
    scratch values against the one with the pretrained regime's own values, judged on seeds 1-4 only."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "regime_tuning.py"
    spec = importlib.util.spec_from_file_location("regime_tuning", path)
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    tuned, runs = tmp_path / "tuned", tmp_path / "runs"
    same = RowResult("glyphs", "triplet", {"lr": 0.001}, 0.5, 4, [], 1.0)  # both tunings chose these
    write_tuned(tuned / "glyphs.yaml", "glyphs", [RowResult("glyphs", "ms", {"lr": 0.002}, 0.5, 4, [], 1.0), same], {})
    own = {"lr": 0.0005, "method_kwargs": {"loss_kwargs": {"alpha": 3.0}}}
    mine = RowResult("glyphs", "ms", own, 0.6, 4, [], 1.0)
    write_tuned(tuned / "pretrained" / "glyphs.yaml", "glyphs", [mine, same], {})
    values = {0: (0.50, 0.60), 1: (0.50, 0.53), 2: (0.52, 0.54), 3: (0.49, 0.52), 4: (0.51, 0.535)}
    for seed, (reused, mine) in values.items():
        for digest, config, value in (
            ("0000000a", {"lr": 0.002, "method_kwargs": {}}, reused),
            ("0000000b", {"lr": 0.0005, "method_kwargs": {"loss_kwargs": {"alpha": 3.0}}}, mine),
        ):
            folder = runs / f"pretrained-glyphs-ms-seed{seed}-{digest}"
            folder.mkdir(parents=True)
            (folder / "config.yaml").write_text(yaml.safe_dump(config))
            (folder / "metrics.json").write_text(json.dumps({"val_R@1": value}))
        folder = runs / f"pretrained-glyphs-triplet-seed{seed}-0000000d"
        folder.mkdir()
        (folder / "config.yaml").write_text(yaml.safe_dump({"lr": 0.001}))
        (folder / "metrics.json").write_text(json.dumps({"val_R@1": reused}))
    (runs / "pretrained-glyphs-ms-seed0-0000000c").mkdir()  # a run still training: no metrics.json
    table = check.verdicts(check.paired_values(runs, tuned), [1, 2, 3, 4]).set_index("row")
    assert table.loc["ms", "seeds"] == "1 2 3 4"
    assert table.loc["ms", "Δ"] == pytest.approx(2.625) and table.loc["ms", "verdict"] == "held"
    assert table.loc["ms", "seed 0 Δ (chose the values)"] == pytest.approx(10.0)
    assert table.loc["ms", "values"] == "changed" and table.loc["triplet", "values"] == "the same runs"
    assert table.loc["triplet", "Δ"] == 0
