"""Runs that never collide or vanish: identity, reuse without overwrite, one writer, stale locks,
full disks, YAML floats, non-finite inputs, early errors, signals."""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from dmlstudy import records
from dmlstudy.cli import build_parser, config_options, main
from dmlstudy.config import load_yaml
from dmlstudy.run.guard import HOLDER_FILE, RunConflictError, RunLockedError, RunStopped, stop_when
from dmlstudy.run.identity import LEDGER_VARIABLE, RunWarning, identity_hash
from dmlstudy.run.train import TrainConfig, run


def cli_arguments(config: TrainConfig) -> list[str]:
    """``python -m dmlstudy train`` with every field of ``config`` as an option."""
    return [sys.executable, "-m", "dmlstudy", "train", *config_options(config.to_dict())]


def wait_for(path, process, seconds=180):
    deadline = time.time() + seconds
    while not path.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    return path.exists()


def record_bytes(run_dir):
    return {path.name: path.read_bytes() for path in sorted(run_dir.iterdir()) if path.is_file()}


def test_two_configurations_get_two_folders(tiny_config):
    slow, fast = run(tiny_config(lr=1e-3)), run(tiny_config(lr=4e-3))
    assert slow.run_dir != fast.run_dir and slow.run_dir.parent == fast.run_dir.parent
    assert slow.run_dir.name == f"cub200-ms-seed0-{identity_hash(slow.config.to_dict())}"
    for result in (slow, fast):
        assert yaml.safe_load((result.run_dir / "config.yaml").read_text())["lr"] == result.config.lr
        assert json.loads((result.run_dir / "metrics.json").read_text()) == result.metrics
    # presentation and location fields do not change the identity; result-changing ones do
    assert identity_hash(tiny_config(progress=True, device="auto", eval_batch_size=7).to_dict()) == identity_hash(
        tiny_config().to_dict()
    )
    assert identity_hash(tiny_config(epochs=3).to_dict()) != identity_hash(tiny_config().to_dict())


def test_rerun_without_overwrite_keeps_the_finished_record_byte_identical(tiny_config):
    first = run(tiny_config(run_name="kept"))
    before = record_bytes(first.run_dir)
    stamps = {name: (first.run_dir / name).stat().st_mtime_ns for name in before}
    again = run(tiny_config(run_name="kept"))  # no resume, no overwrite: loaded, not retrained
    assert record_bytes(first.run_dir) == before
    assert stamps == {name: (first.run_dir / name).stat().st_mtime_ns for name in before}
    assert again.metrics == first.metrics
    with pytest.warns(RunWarning, match="--overwrite: deleting the records"):
        replaced = run(tiny_config(run_name="kept", overwrite=True))
    assert (first.run_dir / "metrics.json").stat().st_mtime_ns != stamps["metrics.json"]
    assert (replaced.metrics["R@1"], replaced.metrics["MAP@R"]) == (
        first.metrics["R@1"],
        first.metrics["MAP@R"],
    )  # retrained: same numbers
    assert (
        yaml.safe_load((first.run_dir / "config.yaml").read_text())["overwrite"] is False
    )  # the record never says overwrite


def test_a_folder_holding_another_configuration_is_refused(tiny_config):
    first = run(tiny_config(run_name="taken"))
    stored = yaml.safe_load((first.run_dir / "config.yaml").read_text())
    (first.run_dir / "config.yaml").write_text(yaml.safe_dump({**stored, "lr": 0.5}))  # e.g. a hash collision
    before = record_bytes(first.run_dir)
    with pytest.raises(
        RunConflictError, match=r"another configuration \(lr: stored 0.5 ≠ requested 0.004\).*--overwrite"
    ):
        run(tiny_config(run_name="taken"))
    assert record_bytes(first.run_dir) == before


def test_concurrent_writers_one_fails_clearly_and_records_stay_consistent(tiny_config):
    config = tiny_config(run_name="contended", epochs=400, steps_per_epoch=1, eval_every=400)
    holder = config.run_dir / HOLDER_FILE
    first = subprocess.Popen(cli_arguments(config), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(config.run_dir / "checkpoint.pt", first), "the first writer never started training"
        second = subprocess.run(cli_arguments(config), capture_output=True, text=True, timeout=180)
        assert second.returncode == 1
        assert f"error: run folder {config.run_dir} is being written by PID {first.pid} on host" in second.stderr
        assert "Traceback" not in second.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        _, stderr = first.communicate(timeout=120)
    assert first.returncode == 143, stderr
    assert not holder.exists()
    stored = yaml.safe_load((config.run_dir / "config.yaml").read_text())
    assert stored == {**config.to_dict(), "resume": False, "overwrite": False}
    checkpoint = torch.load(config.run_dir / "checkpoint.pt", weights_only=False)
    assert len(pd.read_csv(config.run_dir / "history.csv")) == checkpoint["epoch"] + 1 == len(checkpoint["history"])


def test_a_finished_run_is_loaded_while_another_process_holds_its_folder(tiny_config):
    """Notebooks of one plan side by side (``concurrent_entries``) load the same finished runs at once."""
    first = run(tiny_config(run_name="shared"))
    before = record_bytes(first.run_dir)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from dmlstudy.run.guard import RunLock; lock = RunLock(sys.argv[1]); lock.acquire(); "
            "print('held', flush=True); time.sleep(120)",
            str(first.run_dir),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        again = run(tiny_config(run_name="shared"))
    finally:
        holder.kill()
        holder.wait()
    assert again.metrics == json.loads((first.run_dir / "metrics.json").read_text())
    assert {name: data for name, data in record_bytes(first.run_dir).items() if name in before} == before


def test_a_resumed_run_waits_for_the_live_writer_and_a_new_one_does_not(tiny_config, capfd):
    """A plan's 01_train notebook trains its run in its own kernel while another notebook's run task may already
    be writing it (or the other way round): resuming waits for the writer instead of failing the notebook."""
    config = tiny_config(run_name="waited", resume=True)
    config.run_dir.mkdir(parents=True)
    released = config.run_dir.parent / "released"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import pathlib, sys, time; from dmlstudy.run.guard import RunLock; lock = RunLock(sys.argv[1]); "
            "lock.acquire(); print('held', flush=True); time.sleep(3); pathlib.Path(sys.argv[2]).touch(); "
            "lock.release()",
            str(config.run_dir),
            str(released),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunLockedError, match=f"is being written by PID {holder.pid} on host"):
            run(TrainConfig(**{**config.to_dict(), "resume": False}))
        result = run(config)
        assert released.exists(), "the resumed run took the folder before its writer let go"
    finally:
        holder.kill()
        holder.wait()
    assert f"waiting: run folder {config.run_dir} is being written by PID {holder.pid}" in capfd.readouterr().err
    assert result.metrics == json.loads((config.run_dir / "metrics.json").read_text())


def test_a_stale_lock_of_a_dead_process_is_taken_over(tiny_config):
    config = tiny_config(run_name="stale")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    config.run_dir.mkdir(parents=True)
    (config.run_dir / HOLDER_FILE).write_text(json.dumps({"pid": dead.pid, "host": "elsewhere", "started": "earlier"}))
    with pytest.warns(RunWarning, match=f"took over the stale lock .*PID {dead.pid} on host elsewhere"):
        result = run(config)
    assert (result.run_dir / "metrics.json").is_file() and not (result.run_dir / HOLDER_FILE).exists()


def test_a_full_disk_names_the_file_and_the_bytes_needed(tiny_config, monkeypatch, capsys):
    real_write = records._write_all

    def full_disk(handle, data):
        if len(data) > 50_000:  # the checkpoint; the small records fit
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(handle, data)

    monkeypatch.setattr(records, "_write_all", full_disk)
    config = tiny_config(run_name="full")
    with pytest.raises(
        records.RecordWriteError,
        match=rf"cannot write {config.run_dir}/checkpoint.pt: no space left on device \([\d,]+ bytes needed",
    ):
        run(config)
    assert not list(config.run_dir.glob(".checkpoint.pt.*"))  # no temporary left behind
    assert main(["train", "--config", str(config.run_dir / "config.yaml")]) == 1
    assert f"error: cannot write {config.run_dir}/checkpoint.pt: no space left on device" in capsys.readouterr().err


def test_yaml_floats_in_plans_configs_and_method_kwargs(tmp_path, toy_plan_notebook):
    assert load_yaml("lr: 1e-3\nhead_lr: 5E-4\nepochs: 10\nname: '1e-3'") == {
        "lr": 0.001,
        "head_lr": 0.0005,
        "epochs": 10,
        "name": "1e-3",
    }
    from dmlstudy.study.plan import load_plan

    plan = tmp_path / "plan.yaml"
    plan.write_text(
        f"entries:\n  - name: a\n    notebook: {toy_plan_notebook}\n    parameters: {{lr: 1e-3}}\n    grid: {{head_lr: [5e-4, 1e-2]}}\n"
    )
    entries = load_plan(plan)
    assert [(e.parameters["lr"], e.parameters["head_lr"]) for e in entries] == [(0.001, 0.0005), (0.001, 0.01)]
    from dmlstudy.cli import _config_file_values

    config_file = tmp_path / "config.yaml"
    config_file.write_text("parameters:\n  lr: 1e-3\n  method_kwargs: {margin: 2e-1}\n")
    assert _config_file_values(str(config_file)) == {"lr": 0.001, "method_kwargs": {"margin": 0.2}}
    assert TrainConfig(**_config_file_values(str(config_file))).lr == 0.001
    args = build_parser().parse_args(["train", "--lr", "1e-3", "--method-kwargs", "{margin: 1e-1, K1: 16}"])
    assert args.lr == 0.001 and args.method_kwargs == {"margin": 0.1, "K1": 16}


@pytest.fixture
def toy_plan_notebook(tmp_path):
    import nbformat

    notebook = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("lr: float = 0.1\nhead_lr: float = 0.1\nresume: bool = False")
    cell.metadata["tags"] = ["parameters"]
    notebook.cells = [cell]
    path = tmp_path / "toy.ipynb"
    path.write_text(nbformat.writes(notebook))
    return path


def test_plans_resume_by_default_and_overwrite_only_when_asked(tmp_path, toy_plan_notebook):
    from dmlstudy.study.plan import PlanEntry, injected_parameters

    entry = PlanEntry("s", "a", toy_plan_notebook, {"lr": 0.5})
    assert injected_parameters(entry, ["lr", "resume", "overwrite"], tmp_path) == {"lr": 0.5, "resume": True}
    assert injected_parameters(entry, ["lr", "resume", "overwrite"], tmp_path, overwrite=True) == {
        "lr": 0.5,
        "resume": True,
        "overwrite": True,
    }
    assert injected_parameters(entry, ["lr"], tmp_path) == {"lr": 0.5}


def test_non_finite_images_stop_the_run_naming_them(tiny_config, tiny_data_root, monkeypatch):
    from dmlstudy.data.base import ImageListDataset

    # the file pipeline: images read per item (the tensor pipeline holds decoded uint8, which cannot be NaN)
    config = tiny_config(run_name="nan", train_classes=4, classes_per_batch=4, input_pipeline="files")
    original = ImageListDataset.__getitem__

    def poisoned(self, index):
        image, label = original(self, index)
        if "/train" in self.name and label == 0:
            image = torch.full_like(image, float("nan"))
        return image, label

    monkeypatch.setattr(ImageListDataset, "__getitem__", poisoned)
    with pytest.raises(
        FloatingPointError, match=r"epoch 1, step 1: non-finite values in the input images index \d+ \(.*\.png\)"
    ) as caught:
        run(config)
    from dmlstudy.data import build_dataset

    listing = build_dataset("cub200", tiny_data_root / "cub200", "train")
    label_of = {str(path): int(label) for path, label in zip(listing.paths, listing.labels)}
    named = [
        part.split(" (")[1].rstrip(")") for part in caught.value.args[0].split("input images ")[1].split(", index")
    ]
    assert named and {label_of[path] for path in named} == {0}
    assert not (config.run_dir / "checkpoint.pt").exists()


def test_checks_fail_before_any_data_loads(tiny_config, tmp_path, capsys):
    missing_data = str(tmp_path / "no-data-here")
    with pytest.raises(KeyError, match="unknown method 'msx'.*valid names: .*ms"):
        run(tiny_config(method="msx", data_root=missing_data))
    with pytest.raises(TypeError, match=r"method_kwargs.*takes no \['marginn'\]"):
        run(tiny_config(method="margin", method_kwargs={"marginn": 0.2}, data_root=missing_data))
    with pytest.raises(TypeError, match=r"method 'crt' takes no \['K3'\]"):
        run(tiny_config(method="crt", method_kwargs={"K3": 2}, data_root=missing_data))
    config = tiny_config(run_name="k", recall_ks=[1, 1000])
    with pytest.raises(
        ValueError, match="parameter 'recall_ks': K=1000 is larger than the 71 images a query can retrieve"
    ):
        run(config)
    assert not (config.run_dir / "checkpoint.pt").exists()
    with pytest.raises(
        ValueError, match="parameter 'classes_per_batch': P=40 but the cub200 training split has 12 classes"
    ):
        run(tiny_config(classes_per_batch=40))
    # the CLI refuses an unknown name while parsing (argparse choices from the registry), listing the valid ones
    with pytest.raises(SystemExit) as refused:
        main(["train", "--method", "msx", "--data-root", missing_data, "--runs-root", str(tmp_path / "r")])
    assert refused.value.code == 2
    assert "invalid choice: 'msx'" in capsys.readouterr().err.splitlines()[-1]
    # an error raised while running prints one line, or the traceback with --debug
    unknown_data = ["train", "--dataset", "cub200", "--data-root", missing_data, "--runs-root", str(tmp_path / "r")]
    assert main(unknown_data) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith("error: cub200: dataset folder does not exist")
        and "no-data-here" in err
        and "Traceback" not in err
    )
    with pytest.raises(Exception, match="no-data-here"):
        main([*unknown_data, "--debug"])


def test_small_classes_and_absurd_learning_rates_warn(tiny_config):
    with pytest.warns(RunWarning, match=r"12 training classes have fewer than M=8 images .*: \S+ \(6\)"):
        run(tiny_config(run_name="small", samples_per_class=8, classes_per_batch=2, epochs=1, steps_per_epoch=1))
    with pytest.warns(RunWarning, match="learning rate lr=1000"):
        run(tiny_config(run_name="absurd", lr=1000.0, epochs=1, steps_per_epoch=1))


def test_a_truncated_image_is_named_before_training(tiny_config, tiny_data_root, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(tiny_data_root / "cub200", data / "cub200")
    victim = sorted((data / "cub200" / "images").rglob("*.png"))[0]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    config = tiny_config(run_name="truncated", data_root=str(data))
    # the file check lists every bad file; the tensor cache, decoding first, stops at the first one
    with pytest.raises(OSError, match=rf"(1 of \d+ image files cannot be read: |cannot decode image file ){victim}"):
        run(config)
    assert not (config.run_dir / "checkpoint.pt").exists()


def test_sigterm_leaves_a_resumable_run_that_ends_as_an_uninterrupted_one(tiny_config):
    reference = run(tiny_config(run_name="whole", epochs=5, steps_per_epoch=3))
    config = tiny_config(run_name="stopped", epochs=5, steps_per_epoch=3)
    process = subprocess.Popen(cli_arguments(config), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert wait_for(config.run_dir / "checkpoint.pt", process)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    if process.returncode == 0:
        pytest.fail("the run finished before SIGTERM arrived")
    assert process.returncode == 143, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("interrupted by SIGTERM: the checkpoint of epoch ") and last.endswith(
        f"continue with: dmlstudy train --config {config.run_dir / 'config.yaml'} --resume (Python: resume=True)"
    )
    assert not (config.run_dir / "metrics.json").exists()
    torch.load(config.run_dir / "checkpoint.pt", weights_only=False)  # intact
    resumed = run(tiny_config(run_name="stopped", epochs=5, steps_per_epoch=3, resume=True))
    assert len(resumed.history) == 5
    assert resumed.metrics["R@1"] == reference.metrics["R@1"] and resumed.metrics["MAP@R"] == reference.metrics["MAP@R"]
    np.testing.assert_allclose(resumed.embeddings["embeddings"], reference.embeddings["embeddings"], atol=1e-6)


def test_a_run_asked_to_stop_keeps_its_epoch_and_resumes_to_the_uninterrupted_result(tiny_config):
    """How a cancelled engine task stops (guard.stop_when): at the first step after the request, no later."""
    reference = run(tiny_config(run_name="whole", epochs=4, steps_per_epoch=3))
    config = tiny_config(run_name="asked", epochs=4, steps_per_epoch=3)
    with stop_when(lambda: (config.run_dir / "history.csv").is_file()), pytest.raises(RunStopped) as stopped:
        run(config)
    assert str(stopped.value) == f"stopped on request: the checkpoint of epoch 1/4 is kept in {config.run_dir}"
    assert len(pd.read_csv(config.run_dir / "history.csv")) == 1 and not (config.run_dir / "metrics.json").exists()
    with stop_when(lambda: True), pytest.raises(RunStopped, match="epoch 1/4"):
        run(tiny_config(run_name="asked", epochs=4, steps_per_epoch=3, resume=True))  # before it takes the lock
    resumed = run(tiny_config(run_name="asked", epochs=4, steps_per_epoch=3, resume=True))
    assert len(resumed.history) == 4 and resumed.metrics["R@1"] == reference.metrics["R@1"]


def test_study_table_groups_by_configuration_not_by_folder_name(tmp_path):
    from dmlstudy.study.report import configuration_columns, gather_runs, summarize

    for lr, values in ((0.001, (0.5, 0.7)), (0.004, (0.1, 0.3))):
        for seed, value in enumerate(values):
            folder = tmp_path / "s" / f"synbirds-ms-seed{seed}-{identity_hash({'lr': lr, 'seed': seed})}"
            folder.mkdir(parents=True)
            (folder / "config.yaml").write_text(
                f"dataset: synbirds\nmethod: ms\nlr: {lr}\nseed: {seed}\nprogress: {seed == 0}\n"
            )
            (folder / "metrics.json").write_text(json.dumps({"R@1": value}))
    frame = gather_runs("s", root=tmp_path)
    assert configuration_columns(frame, ["dataset", "method"]) == ["lr"]  # not seed, not presentation fields
    table = summarize(
        frame, by=["dataset", "method", *configuration_columns(frame, ["dataset", "method"])], metrics=["R@1"]
    )
    assert table["runs"].tolist() == [2, 2]
    assert table.set_index("lr")["R@1_mean"].to_dict() == pytest.approx({0.001: 60.0, 0.004: 20.0})


def test_cli_table_keeps_configurations_apart(tmp_path, capsys):
    for lr in (0.001, 0.004):
        folder = tmp_path / "s" / f"synbirds-ms-seed0-{identity_hash({'lr': lr})}"
        folder.mkdir(parents=True)
        (folder / "config.yaml").write_text(f"dataset: synbirds\nmethod: ms\nlr: {lr}\nseed: 0\n")
        (folder / "metrics.json").write_text(json.dumps({"R@1": lr * 100}))
    assert (
        main(["study", "table", "s", "--runs-root", str(tmp_path), "--metrics", "R@1", "--out", str(tmp_path / "t")])
        == 0
    )
    assert pd.read_csv(tmp_path / "t.csv")["runs"].tolist() == [1, 1]
    assert os.path.exists(tmp_path / "t.md")


def test_a_trained_and_a_loaded_run_are_noted_in_the_ledger_the_study_runner_names(tiny_config, monkeypatch, tmp_path):
    """Every run a notebook reports passes through ``train.run``, trained or loaded: both are noted."""
    ledger = tmp_path / "runs.txt"
    monkeypatch.setenv(LEDGER_VARIABLE, str(ledger))
    trained = run(tiny_config(run_name="noted", epochs=1))
    loaded = run(tiny_config(run_name="noted", epochs=1))
    assert ledger.read_text().splitlines() == [trained.run_dir.name, loaded.run_dir.name]
    monkeypatch.delenv(LEDGER_VARIABLE)
    run(tiny_config(run_name="noted", epochs=1))  # outside a plan: no ledger, nothing written
    assert len(ledger.read_text().splitlines()) == 2


def test_the_table_leaves_out_runs_a_newer_configuration_replaced(tmp_path, capsys):
    """Two generations of one run in a study folder (the run under old and new tuned values): the table and the
    explorer take the one the plan's entries reported, keep runs no entry reports under any configuration, keep
    two configurations entries report under one name, and name what they left out."""
    from dmlstudy.experiments.explore import find_runs
    from dmlstudy.run.identity import LEDGER_NAME, superseded_runs
    from dmlstudy.study.report import gather_runs

    study = tmp_path / "s"

    def write(label, lr, value):
        folder = study / f"{label}-{identity_hash({'lr': lr, 'label': label})}"
        folder.mkdir(parents=True)
        (folder / "config.yaml").write_text(
            f"run_name: {label}\ndataset: synbirds\nmethod: ms\nlr: {lr}\nseed: 0\nembedding_dim: 8\n"
        )
        (folder / "metrics.json").write_text(json.dumps({"R@1": value}))
        for name in ("checkpoint.pt", "embeddings.npz"):
            (folder / name).write_text("")
        return folder.name

    old, new = write("synbirds-ms-seed0", 0.004, 0.1), write("synbirds-ms-seed0", 0.002, 0.5)
    adhoc = write("my-own-run", 0.001, 0.3)
    tutorial, compared = write("synbirds-ms-seed1", 0.004, 0.2), write("synbirds-ms-seed1", 0.002, 0.4)
    assert superseded_runs(study) == set()  # no ledger yet: runs trained by hand are all kept
    (study / "compare").mkdir()
    (study / "compare" / LEDGER_NAME).write_text(f"{new}\n{compared}\n{new}\n")
    (study / "train").mkdir()
    (study / "train" / LEDGER_NAME).write_text(f"{tutorial}\n")
    assert superseded_runs(study) == {old}
    (study / "dgcrl").mkdir()
    (study / "dgcrl" / "study_entry.json").write_text("{}")
    assert superseded_runs(study) == set()  # an entry executed before ledgers existed may report any run
    (study / "dgcrl" / LEDGER_NAME).write_text("")
    assert superseded_runs(study) == {old}
    frame = gather_runs("s", root=tmp_path)
    assert sorted(frame["run_dir"].map(lambda p: p.rsplit("/", 1)[1])) == sorted([new, adhoc, tutorial, compared])
    assert frame.attrs["superseded"] == [old]
    assert old not in find_runs("s", runs_root=tmp_path)["run"].tolist()
    assert (
        main(["study", "table", "s", "--runs-root", str(tmp_path), "--metrics", "R@1", "--out", str(tmp_path / "t")])
        == 0
    )
    assert "left out 1 run folder(s) that a newer configuration of the same run replaced" in capsys.readouterr().err


def test_the_table_names_each_rows_settings_in_one_readable_cell(tmp_path):
    """results/runs.md: one 'configuration' cell per row with only the fields its runs have (no column of
    another method's keyword arguments full of nan), floats to 3 significant digits, a weights path by name."""
    from dmlstudy.study.report import configuration_text

    table = pd.DataFrame(
        {
            "method": ["ms", "crt"],
            "lr": [0.0013512, 0.004],
            "method_kwargs.lambda_con": [np.nan, 0.2846],
            "checkpoint_path": ["", "weights/dml_convnet_shapes.safetensors"],
            "freeze_bn": [False, True],
        }
    )
    cells = configuration_text(table, ["lr", "method_kwargs.lambda_con", "checkpoint_path", "freeze_bn"])
    assert cells.tolist() == [
        "lr=0.00135, freeze_bn=False",
        "lr=0.004, lambda_con=0.285, checkpoint_path=dml_convnet_shapes.safetensors, freeze_bn=True",
    ]
    assert configuration_text(table, []).tolist() == ["", ""]
    for method, lr, kwargs in (("ms", 0.001, ""), ("crt", 0.004, "method_kwargs:\n  lambda_con: 0.9\n")):
        folder = tmp_path / "s" / f"synbirds-{method}-seed0-{identity_hash({'lr': lr})}"
        folder.mkdir(parents=True)
        (folder / "config.yaml").write_text(f"dataset: synbirds\nmethod: {method}\nlr: {lr}\nseed: 0\n{kwargs}")
        (folder / "metrics.json").write_text(json.dumps({"R@1": lr * 100}))
    out = tmp_path / "t"
    assert main(["study", "table", "s", "--runs-root", str(tmp_path), "--metrics", "R@1", "--out", str(out)]) == 0
    markdown = (tmp_path / "t.md").read_text()
    header = [cell.strip() for cell in markdown.splitlines()[0].split("|")[1:-1]]
    assert header == ["dataset", "method", "configuration", "runs", "R@1"]
    assert "lr=0.004, lambda_con=0.9" in markdown and "nan" not in markdown
    assert "method_kwargs.lambda_con" in pd.read_csv(tmp_path / "t.csv").columns  # the CSV keeps every field
