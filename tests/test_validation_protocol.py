"""The validation protocol in the training engine: class-disjoint validation folds, the checkpoint chosen on
them, patience, test classes read once (never by tuning runs), and paired seeds across methods."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from dmlstudy.data import ClassBalancedBatchSampler
from dmlstudy.data.base import ImageListDataset
from dmlstudy.data.folds import class_folds, fold_classes, split_by_classes
from dmlstudy.run import checkpoint_selection, guard, identity
from dmlstudy.run import data as run_data
from dmlstudy.run import train as train_module
from dmlstudy.run.checkpoint_selection import CheckpointSelection
from dmlstudy.run.data import load_datasets
from dmlstudy.run.model import build_model
from dmlstudy.run.train import TrainConfig, run


@pytest.mark.parametrize("num_classes,folds", [(100, 4), (12, 4), (13, 4), (7, 2)])
def test_folds_are_class_disjoint_balanced_and_deterministic(num_classes, folds):
    assignment = class_folds(num_classes, folds)
    assert assignment.shape == (num_classes,)
    sizes = np.bincount(assignment, minlength=folds)
    assert sizes.sum() == num_classes and sizes.max() - sizes.min() <= 1
    np.testing.assert_array_equal(assignment, class_folds(num_classes, folds))
    held_out = [set(fold_classes(num_classes, folds, k)[1]) for k in range(folds)]
    for k in range(folds):
        kept, validation = fold_classes(num_classes, folds, k)
        assert not set(kept) & set(validation) and len(kept) + len(validation) == num_classes
        for other in range(k + 1, folds):
            assert not held_out[k] & held_out[other]
    assert set().union(*held_out) == set(range(num_classes))
    assert not np.array_equal(assignment, np.arange(num_classes) % folds), "the classes are not permuted"


@pytest.mark.parametrize("folds,message", [(1, "≥ 2"), (20, "at least 20")])
def test_impossible_folds_are_refused(folds, message):
    with pytest.raises(ValueError, match=message):
        class_folds(12, folds)


def test_split_by_classes_renumbers_labels_and_keeps_names():
    dataset = ImageListDataset(
        [f"{i}.png" for i in range(10)], [0, 0, 1, 1, 2, 2, 3, 3, 4, 4], class_names=list("abcde")
    )
    part = split_by_classes(dataset, [1, 4], role="validation classes")
    assert [p.name for p in part.paths] == ["2.png", "3.png", "8.png", "9.png"]
    assert part.labels.tolist() == [0, 0, 1, 1] and part.class_names == ["b", "e"]
    assert "validation classes" in part.name


@pytest.mark.parametrize("pipeline", ["tensor", "files"])
def test_validation_classes_never_train(tiny_config, pipeline):
    config = tiny_config(validation_folds=4, validation_fold=1, input_pipeline=pipeline)
    datasets = load_datasets(config)
    train_split = datasets["train"].split if pipeline == "tensor" else datasets["train"].dataset
    validation = datasets["validation"].split if pipeline == "tensor" else datasets["validation"]
    train_names = {train_split.class_names[label] for label in train_split.labels}
    validation_names = {validation.class_names[label] for label in validation.labels}
    assert len(validation_names) == 3 and len(train_names) == 9 and not train_names & validation_names
    assert not {p.parent for p in train_split.paths} & {p.parent for p in validation.paths}
    assert sorted(set(train_split.labels)) == list(range(9)), "training labels must be contiguous for proxy heads"


def test_tuning_runs_never_read_the_test_classes(tiny_config, monkeypatch):
    built, read = [], []
    real_build = run_data.build_dataset
    real_read = ImageListDataset.read_image

    def recording_build(name, root, split, *args, **kwargs):
        built.append(split)
        return real_build(name, root, split, *args, **kwargs)

    def recording_read(self, index):
        read.append(self.paths[index])
        return real_read(self, index)

    monkeypatch.setattr(run_data, "build_dataset", recording_build)
    monkeypatch.setattr(ImageListDataset, "read_image", recording_read)
    test_split = real_build("cub200", tiny_config().data_root + "/cub200", "test")
    test_files = set(test_split.paths)
    for pipeline in ("files", "tensor"):
        built.clear()
        result = run(tiny_config(validation_folds=4, final_test=False, input_pipeline=pipeline, run_name=pipeline))
        assert built == ["train"], f"{pipeline}: splits built {built}"
        assert "R@1" not in result.metrics and result.metrics["val_R@1"] > 0
    assert read and not set(read) & test_files, "a tuning run decoded a test image"


def test_final_run_reports_the_best_validation_state_once(tiny_config, monkeypatch):
    evaluated = []
    real_evaluate = train_module.evaluate

    def counting(method, datasets, **options):
        evaluated.append(len(datasets["query"]))
        return real_evaluate(method, datasets, **options)

    monkeypatch.setattr(train_module, "evaluate", counting)
    config = tiny_config(validation_folds=4, epochs=4, steps_per_epoch=2, lr=0.02, input_pipeline="files")
    result = run(config)
    history = result.history
    assert "R@1" not in history and history["val_R@1"].notna().all(), "epochs are evaluated on validation classes only"
    best = int(history["val_R@1"].idxmax())
    assert result.metrics["best_epoch"] == history["epoch"][best]
    assert result.metrics["val_R@1"] == history["val_R@1"].max()
    test_images = 12 * 6  # the tiny set's test split; its 12 training classes hold 72 images, 18 of them in fold 0
    assert evaluated.count(test_images) == 1 and len(evaluated) == len(history) + 1, "the test classes are read once"
    assert "best validation R@1" in result.metrics["selection"]
    reloaded = run(config)  # the finished run, loaded: the reported (best) state, not the last epoch's
    for name, tensor in result.method.state_dict().items():
        torch.testing.assert_close(reloaded.method.state_dict()[name], tensor)
    stored = torch.load(result.run_dir / "checkpoint.pt", weights_only=False)
    assert not {"optimizer", "selection"} & set(stored), "a finished run keeps the reported weights only"
    assert len(stored["history"]) == stored["epoch"] + 1 == len(history)


def test_a_last_epoch_checkpoint_with_a_validation_choice_reports_the_chosen_state(tiny_config, tmp_path):
    result = run(tiny_config(validation_folds=4, epochs=2, steps_per_epoch=2, input_pipeline="files"))
    chosen = result.method.state_dict()
    last = {name: torch.zeros_like(tensor) for name, tensor in chosen.items()}
    torch.save({"epoch": 1, "method": last, "selection": {"state": chosen}}, tmp_path / "checkpoint.pt")
    loaded = train_module.load_reported_state(build_model(result.config, 12), tmp_path, torch.device("cpu"))
    for name, tensor in chosen.items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor)


def test_selection_keeps_the_best_and_stops_after_patience():
    method = torch.nn.Linear(2, 2)
    selection = CheckpointSelection(patience=2)
    for epoch, value in enumerate([0.5, 0.6, 0.6, 0.55], start=1):
        with torch.no_grad():
            method.weight.fill_(epoch)
        assert not selection.stopped
        selection.observe(value, epoch=epoch, method=method, trained_seconds=10.0 * epoch, arrays={})
    assert selection.stopped and selection.epoch == 2 and selection.value == 0.6 and selection.seconds == 20.0
    assert float(selection.state["weight"][0, 0]) == 2.0
    never = CheckpointSelection(patience=0)
    for epoch in range(1, 6):
        never.observe(0.1, epoch=epoch, method=method, trained_seconds=0.0, arrays={})
    assert not never.stopped and never.epoch == 1


def test_warm_up_evaluations_are_recorded_but_neither_chosen_nor_counted():
    method = torch.nn.Linear(2, 2)
    # the run that prompted the rule (pretrained Glyphs softmax, seed 2): its warm-up scored best, unfreezing dipped
    values = [0.402, 0.317, 0.397, 0.45, 0.44, 0.43]
    before, now = CheckpointSelection(patience=2), CheckpointSelection(patience=2, warmup_epochs=1)
    for epoch, value in enumerate(values, start=1):
        for selection in (before, now):
            if not selection.stopped:
                selection.observe(value, epoch=epoch, method=method, trained_seconds=float(epoch), arrays={})
    assert before.stopped and before.epoch == 1, "the rule before 2026-11-26 stopped at epoch 3 on the warm-up"
    assert now.stopped and (now.epoch, now.value, now.seconds) == (4, 0.45, 4.0)
    short = CheckpointSelection(patience=2, warmup_epochs=2)
    for epoch, value in enumerate([0.9, 0.8, 0.1], start=1):
        short.observe(value, epoch=epoch, method=method, trained_seconds=0.0, arrays={})
    assert (short.epoch, short.value, short.stopped) == (3, 0.1, False), "the first evaluation after the warm-up"


def test_a_saved_warm_up_choice_is_dropped_in_the_warm_up_and_restarts_a_run_after_it():
    method = torch.nn.Linear(2, 2)
    before = CheckpointSelection(patience=2)  # a checkpoint written by the rule before 2026-11-26
    before.observe(0.5, epoch=1, method=method, trained_seconds=1.0, arrays={})
    saved = before.to_checkpoint()
    during = CheckpointSelection(patience=2, warmup_epochs=1)
    assert during.load(saved, epochs_done=1) and (during.epoch, during.state) == (0, None)
    assert not CheckpointSelection(patience=2, warmup_epochs=1).load(saved, epochs_done=2)
    before.observe(0.6, epoch=2, method=method, trained_seconds=2.0, arrays={})
    after = CheckpointSelection(patience=2, warmup_epochs=1)
    assert after.load(before.to_checkpoint(), epochs_done=2) and (after.epoch, after.value) == (2, 0.6)


@pytest.mark.parametrize("warmup", [0, 1])
@pytest.mark.parametrize("patience", [1, 2, 3])
def test_a_run_is_censored_exactly_when_the_selection_never_stopped_it(patience, warmup):
    method, cap = torch.nn.Linear(2, 2), 6
    rng = np.random.default_rng(patience)
    for trial in range(200):
        values = np.round(rng.uniform(0.4, 0.6, size=cap), 2) if trial % 2 else np.sort(rng.uniform(0.4, 0.6, cap))
        if trial % 3 == 0:
            values[0] = 0.7  # a warm-up that scores above everything after it
        selection, rows = CheckpointSelection(patience, warmup), []
        for epoch, value in enumerate(values, start=1):  # train.run's loop: stop once the selection says so
            if selection.stopped:
                break
            selection.observe(float(value), epoch=epoch, method=method, trained_seconds=0.0, arrays={})
            rows.append({"epoch": epoch, "val_R@1": float(value)})
        history = pd.DataFrame(rows)
        censored = checkpoint_selection.best_epoch_censored(history, patience, warmup)
        assert censored == (not selection.stopped), (values, patience, warmup)
        assert int(checkpoint_selection.selection_evaluations(history, warmup).idxmax()) == selection.epoch


def test_a_record_that_reports_a_warm_up_epoch_is_trained_again(tiny_config):
    config = tiny_config(
        validation_folds=4, epochs=3, steps_per_epoch=2, warmup_epochs=1, patience=1, input_pipeline="files"
    )
    first = run(config)
    assert first.metrics["best_epoch"] >= 2 and train_module.is_complete(config)
    metrics = json.loads((config.run_dir / "metrics.json").read_text())
    (config.run_dir / "metrics.json").write_text(json.dumps({**metrics, "best_epoch": 1}))  # as the old rule could
    assert identity.chosen_in_warmup(config.run_dir) == 1 and not train_module.is_complete(config)
    with pytest.warns(identity.RunWarning, match="reports warm-up epoch 1, chosen before warm-up evaluations"):
        again = run(config)
    assert train_module.is_complete(config)
    assert {k: again.metrics[k] for k in ("R@1", "best_epoch", "val_R@1")} == {
        k: first.metrics[k] for k in ("R@1", "best_epoch", "val_R@1")
    }


def test_an_epoch_checkpoint_that_chose_a_warm_up_epoch_starts_the_run_again(tiny_config):
    spec = dict(validation_folds=4, epochs=3, steps_per_epoch=2, warmup_epochs=1, input_pipeline="files")
    reference = run(tiny_config(run_name="whole", **spec))
    config = tiny_config(run_name="cut", resume=True, **spec)
    history = config.run_dir / "history.csv"

    def two_epochs() -> bool:
        return history.is_file() and len(pd.read_csv(history)) == 2

    with guard.stop_when(two_epochs), pytest.raises(guard.RunStopped, match="epoch 2/3"):
        run(config)
    checkpoint = torch.load(config.run_dir / "checkpoint.pt", weights_only=False)
    checkpoint["selection"].update(epoch=1, value=1.0, since=1)  # the choice the rule before 2026-11-26 could save
    torch.save(checkpoint, config.run_dir / "checkpoint.pt")
    with pytest.warns(identity.RunWarning, match="chose warm-up epoch 1, which warm-up evaluations no longer can"):
        resumed = run(config)
    assert len(resumed.history) == 3 and resumed.metrics["R@1"] == reference.metrics["R@1"]
    assert resumed.metrics["best_epoch"] == reference.metrics["best_epoch"] >= 2


def test_censoring_without_patience_or_validation_looks_at_the_last_evaluation():
    rising = pd.DataFrame({"epoch": [1, 2, 3], "R@1": [0.1, 0.2, 0.3]})  # test classes only: never stops early
    peaked = pd.DataFrame({"epoch": [1, 2, 3], "R@1": [0.1, 0.3, 0.2]})
    assert checkpoint_selection.best_epoch_censored(rising, patience=2)
    assert not checkpoint_selection.best_epoch_censored(peaked, patience=2)
    validated = pd.DataFrame({"epoch": [1, 2, 3], "R@1": [np.nan] * 3, "val_R@1": [0.1, 0.3, 0.2]})
    assert not checkpoint_selection.best_epoch_censored(validated, patience=0)
    assert checkpoint_selection.best_epoch_censored(validated, patience=2)
    assert not checkpoint_selection.best_epoch_censored(pd.DataFrame({"epoch": [1], "loss": [1.0]}), patience=2)


def test_patience_stops_a_run_early(tiny_config):
    result = run(tiny_config(validation_folds=4, patience=1, epochs=12, steps_per_epoch=1, lr=1e-9))
    assert result.metrics["epochs_trained"] < 12, "a run whose validation R@1 cannot improve must stop"
    assert result.metrics["epochs_trained"] == result.metrics["best_epoch"] + 1


@pytest.mark.parametrize(
    "field,value,message", [("validation_folds", 1, "0 \\(none\\) or ≥ 2"), ("patience", 2, "needs validation classes")]
)
def test_protocol_fields_are_checked(field, value, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**{field: value})


def test_seed_pairs_methods_on_initialisation_and_batches(tiny_config):
    """Common random numbers: seed s gives MS and triplet (and any method) the same backbone weights at step 0,
    the same batches and the same augmented pixels."""
    first, second = tiny_config(method="ms", seed=3), tiny_config(method="triplet", seed=3, lr=1e-3)
    models = [build_model(config, 12).backbone.state_dict() for config in (first, second)]
    for name, tensor in models[0].items():
        torch.testing.assert_close(models[1][name], tensor)
    other_seed = build_model(tiny_config(method="ms", seed=4), 12).backbone.state_dict()
    assert any(not torch.equal(other_seed[name], tensor) for name, tensor in models[0].items())
    batches = []
    for config in (first, second):
        train = load_datasets(config)["train"]
        sampler = ClassBalancedBatchSampler(
            train.labels, classes_per_batch=4, samples_per_class=3, num_batches=3, seed=config.seed
        )
        sampler.set_epoch(1)
        train.set_epoch(1)
        indices = list(sampler)
        batches.append((indices, train.batch(indices[0], "cpu")[0]))
    assert batches[0][0] == batches[1][0]
    torch.testing.assert_close(batches[0][1], batches[1][1])


def test_the_selection_rule_is_the_same_for_runs_that_stopped_at_other_epochs():
    validated, plain = TrainConfig(validation_folds=4, patience=2), TrainConfig()
    for config in (validated, plain):
        texts = {config.selection_text(best_epoch=b, epochs_trained=t) for b, t in ((2, 4), (6, 6))}
        assert len(texts) == 2 and len({train_module.selection_rule(text) for text in texts}) == 1
    assert train_module.selection_rule(validated.selection_text(best_epoch=2, epochs_trained=4)) == (
        "best validation R@1 (fold 0 of 4 class-disjoint folds of the training classes), patience 2 evaluations"
    )
    assert train_module.selection_rule(plain.selection_text(best_epoch=6, epochs_trained=6)) == (
        "last epoch; no validation classes"
    )
