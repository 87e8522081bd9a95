"""The training engine: records, determinism, kill-and-resume, bad parameters."""

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from dmlstudy.cli import config_options
from dmlstudy.run.identity import identity_hash
from dmlstudy.run.train import TrainConfig, run


def test_run_leaves_complete_records(tiny_config):
    result = run(tiny_config(run_name="records"))
    for name, path in result.records.items():
        assert path.is_file(), name
    stored = json.loads(result.records["metrics.json"].read_text())
    assert stored["R@1"] == result.metrics["R@1"] and 0.0 <= stored["R@1"] <= 1.0
    assert {"R@1", "R@2", "R@4", "R@8", "RP", "MAP@R", "NMI", "ESD", "rho"} <= set(stored)
    history = pd.read_csv(result.records["history.csv"])
    assert list(history["epoch"]) == [1, 2] and history["loss"].notna().all()
    assert yaml.safe_load(result.records["config.yaml"].read_text())["run_name"] == "records"
    assert result.run_dir.name == f"records-{identity_hash(result.config.to_dict())}"
    environment = json.loads(result.records["environment.json"].read_text())
    assert environment["packages"]["torch"] == torch.__version__.split("+")[0] or environment["packages"]["torch"]
    with np.load(result.records["embeddings.npz"]) as arrays:
        assert arrays["embeddings"].shape == (72, 128) and arrays["labels"].shape == (72,)


def test_same_seed_gives_identical_metrics_and_other_seed_differs(tiny_config):
    first = run(tiny_config(run_name="a", seed=3))
    second = run(tiny_config(run_name="b", seed=3))
    other = run(tiny_config(run_name="c", seed=4))
    assert first.metrics["R@1"] == second.metrics["R@1"] and first.metrics["MAP@R"] == second.metrics["MAP@R"]
    np.testing.assert_array_equal(first.embeddings["embeddings"], second.embeddings["embeddings"])
    assert not np.array_equal(first.embeddings["embeddings"], other.embeddings["embeddings"])


def test_training_lowers_the_loss(tiny_config):
    # 48 steps: with 24 the MS loss of 4 × 3 batches was still within its batch-to-batch noise (either pipeline)
    result = run(tiny_config(run_name="learns", epochs=8, steps_per_epoch=6, lr_schedule="constant", eval_every=8))
    losses = result.history["loss"].to_numpy()
    assert losses[-4:].mean() < losses[:4].mean()


def test_complete_run_is_loaded_not_retrained(tiny_config):
    first = run(tiny_config(run_name="done"))
    stamp = first.records["metrics.json"].stat().st_mtime_ns
    again = run(tiny_config(run_name="done", resume=True))
    assert again.records["metrics.json"].stat().st_mtime_ns == stamp
    assert again.metrics == first.metrics
    torch.testing.assert_close(again.method.embedding.weight, first.method.embedding.weight)


@pytest.mark.parametrize(("train_classes", "validation_folds"), [(0, 0), (0, 4), (5, 0), (6, 3), (1000, 4)])
def test_the_training_class_count_is_that_of_the_loaded_split(tiny_config, train_classes, validation_folds):
    from dmlstudy.run.data import class_split_counts, load_datasets, training_class_count

    config = tiny_config(train_classes=train_classes, validation_folds=validation_folds)
    loaded = load_datasets(config)
    assert training_class_count(config) == loaded["train"].num_classes
    validation = loaded["validation"]
    assert class_split_counts(config) == (loaded["train"].num_classes, validation.num_classes if validation else 0)


def test_a_finished_run_with_a_class_head_loads_without_reading_its_images(tiny_config, monkeypatch):
    import dmlstudy.run.train as train

    options = dict(run_name="head", method="normsoftmax", validation_folds=4)
    first = run(tiny_config(**options))

    def unread(config):
        raise AssertionError("a finished run read its images")

    monkeypatch.setattr(train, "load_datasets", unread)
    again = run(tiny_config(**options, resume=True))
    assert again.metrics == first.metrics
    for name, value in first.method.state_dict().items():
        torch.testing.assert_close(again.method.state_dict()[name], value)


def test_killed_run_resumes_to_the_same_metrics(tiny_config, tmp_path):
    reference = run(tiny_config(run_name="uninterrupted", epochs=5, steps_per_epoch=3))
    killed = tiny_config(run_name="killed", epochs=5, steps_per_epoch=3)
    arguments = [sys.executable, "-m", "dmlstudy", "train", *config_options(killed.to_dict())]
    process = subprocess.Popen(arguments, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoint = killed.run_dir / "checkpoint.pt"
    deadline = time.time() + 120
    while not checkpoint.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert checkpoint.exists(), "the run never wrote a checkpoint"
    assert not (killed.run_dir / "metrics.json").exists(), "the run finished before it could be killed"
    stored_epoch = torch.load(checkpoint, weights_only=False)["epoch"]
    assert stored_epoch < 4
    resumed = run(tiny_config(run_name="killed", epochs=5, steps_per_epoch=3, resume=True))
    assert len(resumed.history) == 5
    assert resumed.metrics["R@1"] == reference.metrics["R@1"]
    np.testing.assert_allclose(resumed.embeddings["embeddings"], reference.embeddings["embeddings"], atol=1e-6)


@pytest.mark.parametrize(
    "name,value,message",
    [
        ("epochs", "3", "parameter 'epochs' must be of type int, got str"),
        ("lr", "fast", "parameter 'lr' must be of type float"),
        ("progress", 1, "parameter 'progress' must be of type bool"),
        ("method_kwargs", [1], "parameter 'method_kwargs' must be of type dict"),
        ("samples_per_class", 1, "samples_per_class"),
        ("optimizer", "adagrad", r"parameter 'optimizer' must be one of \['adam', 'adamw', 'sgd'\], got 'adagrad'"),
        ("lr_schedule", "step", r"parameter 'lr_schedule' must be one of \['constant', 'cosine'\], got 'step'"),
    ],
)
def test_bad_parameters_are_named(name, value, message):
    with pytest.raises((TypeError, ValueError), match=message):
        TrainConfig(**{name: value})


def test_integer_learning_rate_is_accepted_as_float():
    assert TrainConfig(lr=1).lr == 1.0


@pytest.mark.parametrize(
    "field,value,message",
    [("method", "msx", "valid names"), ("dataset", "cub", "valid names"), ("backbone", "resnet_50", "timm")],
)
def test_unknown_names_list_the_valid_ones(tiny_config, field, value, message):
    with pytest.raises(KeyError, match=message):
        run(tiny_config(**{field: value}))


def test_resuming_another_configuration_trains_it_in_its_own_folder(tiny_config):
    from dmlstudy.run.identity import RunWarning

    first = run(tiny_config(run_name="fixed", epochs=1))
    with pytest.warns(
        RunWarning, match=r"fixed-[0-9a-f]{8} holds one with other settings \(epochs: stored 1 ≠ requested 2"
    ):
        second = run(tiny_config(run_name="fixed", epochs=2, resume=True))
    assert second.run_dir != first.run_dir and len(second.history) == 2
    again = run(tiny_config(run_name="fixed", epochs=1, resume=True, progress=True))  # presentation fields may differ
    assert again.run_dir == first.run_dir and again.metrics == first.metrics


def test_evaluation_splits_are_memoized_and_equal_to_fresh_reads(tiny_config):
    import torch

    from dmlstudy.run.data import load_datasets

    config = tiny_config(input_pipeline="files")  # the tensor pipeline's splits are tested in test_tensor_pipeline.py
    memoized, fresh = load_datasets(config)["query"], load_datasets(config)["query"]
    first = [memoized[i] for i in range(len(memoized))]
    for (image, label), (again, again_label) in zip(first, (fresh[i] for i in range(len(fresh)))):
        assert torch.equal(image, again) and label == again_label
    paths = getattr(memoized, "dataset", memoized).paths  # the split, or the ImageListDataset under a Subset
    moved = [path.rename(path.with_suffix(".moved")) for path in paths]
    try:  # a memoized item is never read from disk again
        assert all(memoized[i][0] is first[i][0] for i in range(len(memoized)))
    finally:
        for path, target in zip(moved, paths):
            path.rename(target)


def test_the_backbone_has_its_own_rate_and_stands_still_while_the_heads_warm_up():
    from dmlstudy.run.model import build_model
    from dmlstudy.run.train import TrainConfig, group_learning_rates

    config = TrainConfig(method="proxyanchor", epochs=4, lr=1e-3, head_lr=1e-2, backbone_lr_scale=0.1, warmup_epochs=1)
    method = build_model(config, num_classes=5)
    groups = method.parameter_groups(lr=1e-3, head_lr=1e-2, weight_decay=0.0, backbone_lr=1e-4)
    by_name = {g["name"]: g for g in groups}
    assert {n: g["lr"] for n, g in by_name.items()} == {"model": 1e-3, "backbone": 1e-4, "head": 1e-2}
    backbone = {id(p) for p in method.backbone.parameters()}
    assert {id(p) for p in by_name["backbone"]["params"]} == {
        id(p) for p in method.backbone.parameters() if p.requires_grad
    }
    assert not backbone & {id(p) for p in by_name["model"]["params"]}
    names, base = [g["name"] for g in groups], [g["lr"] for g in groups]
    assert group_learning_rates(config, base, names, 0) == [pytest.approx(1e-3), 0.0, pytest.approx(1e-2)]
    later = group_learning_rates(config, base, names, 1)
    assert later[1] > 0 and later[0] / later[1] == pytest.approx(10.0) and later[2] / later[0] == pytest.approx(10.0)
    assert method.parameter_groups(lr=1e-3, head_lr=1e-2, weight_decay=0.0)[0]["name"] == "model"  # no split by default
    with pytest.raises(ValueError, match="warmup_epochs"):
        TrainConfig(epochs=2, warmup_epochs=2)


def test_fields_added_at_their_neutral_value_keep_the_run_folders_recorded_before_them():
    from dmlstudy.run import identity
    from dmlstudy.run.train import TrainConfig

    values = TrainConfig().to_dict()
    before = {
        k: v for k, v in values.items() if k not in identity.HASHED_WHEN_SET
    }  # a record written before the fields
    assert identity.identity_hash(values) == identity.identity_hash(before)
    assert identity.differing_fields(before, values) == {}
    changed = {**values, "warmup_epochs": 1}
    assert identity.identity_hash(changed) != identity.identity_hash(values)
    assert identity.differing_fields(before, changed) == {"warmup_epochs": (0, 1)}
