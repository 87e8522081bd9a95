"""The fault battery: bad inputs and faults tried as a new user would, from the CLI and the Python
API, each judged by what the user is left with.

Usage (the code under test is whatever ``dmlstudy`` the interpreter imports; point PYTHONPATH at a worktree)::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/fault_battery.py [--only REGEX] [--json out.json]

Prints a markdown table (case, interface, verdict, evidence). Verdicts: ``clear error`` (one line, names
the culprit, before training where it could be), ``clear error (traceback)``, ``late error`` (training
had started), ``wrong blame``, ``works`` / ``warns`` (the good outcome of a case that is not an error),
``no message``, and the two this battery exists to find: ``SILENT WRONG`` (exit 0 with a wrong result)
and ``DATA LOST`` (a finished record destroyed or mixed). Every case runs in fresh processes on a tiny
CUB-layout dataset (24 classes × 6 images at 32 px) in a temporary folder; the full-disk cases mount a
1 MiB tmpfs (root only; skipped otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import dmlstudy  # noqa: E402  (the code under test: its project holds the plan notebooks)
from dmlstudy.cli import config_options

PROJECT = Path(dmlstudy.__file__).resolve().parent.parent
WORK = Path(tempfile.mkdtemp(prefix="fault-battery-"))
DATA = WORK / "data"
TINY = {
    "dataset": "cub200",
    "image_size": 32,
    "classes_per_batch": 4,
    "samples_per_class": 3,
    "epochs": 1,
    "steps_per_epoch": 2,
    "eval_batch_size": 64,
    "device": "cpu",
    "progress": False,
}
ENV = {**os.environ, "KMP_DUPLICATE_LIB_OK": "TRUE"}
CASES: list[tuple[str, str, callable]] = []


@dataclass
class Outcome:
    rc: int
    out: str
    err: str
    seconds: float

    @property
    def message(self) -> str:
        lines = [line for line in self.err.strip().splitlines() if line.strip()]
        for line in reversed(lines):
            if line.startswith(("error:", "EXCEPTION")) or re.match(
                r"^[A-Za-z_.]*(Error|Exception|Interrupt|Exit)\b", line
            ):
                return line[:220]
        return (lines[-1] if lines else self.out.strip().splitlines()[-1] if self.out.strip() else "")[:220]


def case(name: str, *interfaces: str):
    def register(function):
        for interface in interfaces or ("cli",):
            CASES.append((name, interface, function))
        return function

    return register


def make_data() -> None:
    from dmlstudy.data.embedded import ensure_generated
    from dmlstudy.data.synbirds import SynBirdsGenerator

    ensure_generated(DATA / "cub200", SynBirdsGenerator(num_classes=24, images_per_class=6, workers=1), seed=5)


def copy_data(name: str) -> Path:
    root = WORK / name
    shutil.copytree(DATA, root)
    return root


def options(fields: dict) -> list[str]:
    return config_options(fields)


API_PRELUDE = """
import json, sys, traceback
from dmlstudy.run.train import TrainConfig, run
try:
{body}
except BaseException as error:
    print(f"EXCEPTION {{type(error).__name__}}: {{error}}".splitlines()[0], file=sys.stderr)
    sys.exit(error.code if isinstance(error, SystemExit) and isinstance(error.code, int) else 1)
"""


def command(
    interface: str, runs: Path, extra_cli: list[str] | None = None, data: Path | None = None, **fields
) -> list[str]:
    values = {**TINY, "study": "b", "runs_root": str(runs), "data_root": str(data or DATA), **fields}
    if interface == "cli":
        return [sys.executable, "-m", "dmlstudy", "train", *options(values), *(extra_cli or [])]
    body = textwrap.indent(f"result = run(TrainConfig(**{values!r}))\nprint('run folder:', result.run_dir)", "    ")
    return [sys.executable, "-c", API_PRELUDE.format(body=body)]


def execute(arguments: list[str], timeout: float = 300) -> Outcome:
    """Run a ``python -m dmlstudy …`` or ``python -c …`` command line in this process, as the interpreter
    would (stdout/stderr captured, an uncaught exception printed as a traceback with exit status 1,
    ``SystemExit`` codes kept): on a busy 2-core machine a fresh process per case costs most of the time.
    Cases that need a second process or a signal use :func:`start`."""
    import contextlib
    import io
    import traceback
    import warnings

    out, err = io.StringIO(), io.StringIO()
    started = time.perf_counter()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("always")
        showwarning = warnings.showwarning
        try:
            if arguments[1:3] == ["-m", "dmlstudy"]:
                from dmlstudy.cli import main as cli_main

                code = cli_main(arguments[3:]) or 0
            else:
                exec(compile(arguments[2], "<api>", "exec"), {"__name__": "__main__"})
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
            if exit_.code is not None and not isinstance(exit_.code, int):
                print(exit_.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            warnings.showwarning = showwarning
    return Outcome(code, out.getvalue(), err.getvalue(), time.perf_counter() - started)


def train(interface: str, runs: Path, **fields) -> Outcome:
    return execute(command(interface, runs, **fields))


def start(arguments: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        arguments, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=str(WORK)
    )


def wait_for(pattern: str, root: Path, process: subprocess.Popen, seconds: float = 240) -> Path | None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        found = sorted(root.glob(pattern))
        if found:
            return found[0]
        if process.poll() is not None:
            return None
        time.sleep(0.05)
    return None


def finish(process: subprocess.Popen, timeout: float = 300) -> Outcome:
    out, err = process.communicate(timeout=timeout)
    return Outcome(process.returncode, out, err, 0.0)


def finished_runs(runs: Path) -> list[Path]:
    return sorted(path.parent for path in runs.glob("b/*/metrics.json"))


def any_checkpoint(runs: Path) -> bool:
    """Whether training had started: ``environment.json`` is written when a run starts training (with and
    without run guards), a checkpoint only after the first epoch's evaluation."""
    return bool(list(runs.glob("b/*/checkpoint.pt")) or list(runs.glob("b/*/environment.json")))


def judge_error(outcome: Outcome, *keywords: str, runs: Path | None = None) -> tuple[str, str]:
    """A failure that should name ``keywords`` (case-insensitive), ideally before training."""
    message = outcome.message
    if outcome.rc == 0:
        return "SILENT WRONG", f"exit 0; {message}"
    named = all(k.lower() in outcome.err.lower() for k in keywords)
    if not named:
        return "wrong blame", message
    if runs is not None and any_checkpoint(runs):
        return "late error", message
    if "Traceback (most recent call last)" in outcome.err:
        return "clear error (traceback)", message
    return "clear error", message


# ------------------------------------------------------------------------------------------- runs & records


@case("sweep: lr 0.001 then lr 0.004", "cli", "api")
def sweep(interface, runs):
    first, second = train(interface, runs, lr=0.001), train(interface, runs, lr=0.004)
    folders = finished_runs(runs)
    if first.rc or second.rc:
        return "wrong blame", second.message
    lrs = sorted(float(re.search(r"^lr: (.*)$", (f / "config.yaml").read_text(), re.M).group(1)) for f in folders)
    if len(folders) == 2 and lrs == [0.001, 0.004]:
        return "works", f"two folders: {', '.join(f.name for f in folders)}"
    return (
        "DATA LOST",
        f"{len(folders)} folder(s) for 2 configurations: the second overwrote the first ({folders[0].name})",
    )


@case("re-run a finished run without --resume (killed as soon as its record changes)", "cli", "api")
def rerun_finished(interface, runs):
    train(interface, runs)
    folder = finished_runs(runs)[0]
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")}
    stamp = (folder / "metrics.json").stat().st_mtime_ns
    process = start(command(interface, runs))
    while process.poll() is None:
        if not (folder / "metrics.json").exists() or (folder / "metrics.json").stat().st_mtime_ns != stamp:
            process.kill()
            process.wait()
            return (
                "DATA LOST",
                "metrics.json deleted/rewritten at start; killed there, the finished run's metrics are gone",
            )
        time.sleep(0.05)
    after = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")}
    kept = after == before and (folder / "metrics.json").stat().st_mtime_ns == stamp
    return (
        ("works", "finished record kept byte for byte (loaded, not retrained)")
        if kept
        else ("DATA LOST", "record rewritten")
    )


@case("same --run-name, another lr, no --resume", "cli")
def same_name_other_config(interface, runs):
    first = train(interface, runs, run_name="mine", lr=0.001)
    if first.rc:
        return "battery error", f"the first run failed: {first.message}"
    second = train(interface, runs, run_name="mine", lr=0.004)
    folders = finished_runs(runs)
    if second.rc:
        return judge_error(second, "mine")
    if len(folders) == 2:
        return "works", f"two folders: {', '.join(f.name for f in folders)}"
    return "DATA LOST", "the lr=0.001 run was overwritten by the lr=0.004 run"


@case("two writers of the same run at once", "cli")
def concurrent_same(interface, runs):
    first = start(command(interface, runs, epochs=60, steps_per_epoch=1, eval_every=60))
    if not wait_for("b/*/checkpoint.pt", runs, first):
        return "wrong blame", finish(first).message
    second = train(interface, runs, epochs=60, steps_per_epoch=1, eval_every=60)
    first.send_signal(signal.SIGTERM)
    finish(first)
    if second.rc and str(first.pid) in second.err:
        return judge_error(second, str(first.pid), "host")
    if second.rc == 0:
        return "SILENT WRONG", "both writers exit 0 in one folder"
    return judge_error(second, "writ")


@case("two writers, same --run-name, different configs, at once", "cli")
def concurrent_different(interface, runs):
    first = start(command(interface, runs, run_name="shared", epochs=24, steps_per_epoch=1, eval_every=24, lr=0.001))
    if not wait_for("b/*/checkpoint.pt", runs, first):
        return "wrong blame", finish(first).message
    second = train(interface, runs, run_name="shared", epochs=2, lr=0.004)
    first_outcome = finish(first)
    folders = finished_runs(runs)
    problems = []
    for folder in folders:
        epochs = int(re.search(r"^epochs: (\d+)$", (folder / "config.yaml").read_text(), re.M).group(1))
        metrics = json.loads((folder / "metrics.json").read_text())
        if metrics.get("epochs") != epochs:
            problems.append(f"{folder.name}: config.yaml says {epochs} epochs, metrics.json {metrics.get('epochs')}")
    if problems or (first_outcome.rc == 0 and second.rc == 0 and len(folders) < 2):
        return "SILENT WRONG", "; ".join(problems) or "both exit 0, one folder: the records mix two configurations"
    return "works", f"{len(folders)} consistent folders"


def tmpfs(size: str, name: str) -> Path | None:
    mount = WORK / f"tmpfs-{size}-{name}"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True)
    return mount if done.returncode == 0 else None


@case("full disk (runs root on a 1 MiB tmpfs)", "cli", "api")
def full_disk(interface, runs):
    mount = tmpfs("1m", runs.name)
    if mount is None:
        return "skipped", "cannot mount a tmpfs here (not root)"
    try:
        outcome = train(interface, mount)
        return judge_error(outcome, "no space left", "checkpoint.pt")
    finally:
        subprocess.run(["umount", str(mount)])


@case("unwritable runs root (/sys)", "cli")
def unwritable(interface, runs):
    return judge_error(train(interface, Path("/sys/dmlstudy-runs")), "/sys/dmlstudy-runs")


@case("runs root is a file", "cli")
def runs_root_file(interface, runs):
    target = WORK / "a-file"
    target.write_text("x")
    return judge_error(train(interface, target), str(target))


# ------------------------------------------------------------------------------------------- signals and plans


def interrupt(interface, runs, number):
    process = start(command(interface, runs, epochs=6, steps_per_epoch=3))
    if not wait_for("b/*/checkpoint.pt", runs, process):
        return None, finish(process)
    process.send_signal(number)
    return process, finish(process)


@case("SIGTERM during training, then --resume", "cli")
def sigterm(interface, runs):
    process, outcome = interrupt(interface, runs, signal.SIGTERM)
    if process is None:
        return "wrong blame", outcome.message
    resumed = train(interface, runs, epochs=6, steps_per_epoch=3, resume=True)
    tail = f"; --resume then exits {resumed.rc}"
    if outcome.rc == 143 and "resume" in outcome.err:
        return "works", outcome.message + tail
    return "no message", f"exit {outcome.rc}, stderr: {outcome.message!r}{tail}"


@case("SIGINT (Ctrl-C) during training", "cli")
def sigint(interface, runs):
    process, outcome = interrupt(interface, runs, signal.SIGINT)
    if process is None:
        return "wrong blame", outcome.message
    if outcome.rc == 130 and "resume" in outcome.err and "Traceback" not in outcome.err:
        return "works", outcome.message
    return (
        "clear error (traceback)" if "Traceback" in outcome.err else "no message"
    ), f"exit {outcome.rc}: {outcome.message}"


def write_plan(runs: Path, **parameters) -> Path:
    values = {**TINY, "data_root": str(DATA), **parameters}
    plan = WORK / f"plan-{runs.name}.yaml"
    plan.write_text(
        "study: b\nentries:\n  - name: train\n    notebook: notebooks/01_train.ipynb\n"
        f"    parameters: {json.dumps(values)}\n"
    )
    return plan


def study_run(plan: Path, runs: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "dmlstudy", "study", "run", str(plan), "--runs-root", str(runs), *extra]


def plan_cwd_execute(arguments):
    started = time.perf_counter()
    done = subprocess.run(arguments, capture_output=True, text=True, timeout=600, env=ENV, cwd=str(PROJECT))
    return Outcome(done.returncode, done.stdout, done.stderr, time.perf_counter() - started)


@case("SIGTERM to `dmlstudy study run`", "cli")
def sigterm_plan(interface, runs):
    plan = write_plan(runs, epochs=8, steps_per_epoch=3)
    process = subprocess.Popen(
        study_run(plan, runs), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=str(PROJECT)
    )
    if not wait_for("b/*/checkpoint.pt", runs, process, seconds=400):
        return "wrong blame", finish(process).message
    process.send_signal(signal.SIGTERM)
    outcome = finish(process)
    if outcome.rc == 143 and "study run" in outcome.err:
        return "works", outcome.message
    return "no message", f"exit {outcome.rc}: {outcome.message!r}"


@case("re-run a plan whose entry failed after its run finished", "cli")
def plan_rerun(interface, runs):
    plan = write_plan(runs)
    first = plan_cwd_execute(study_run(plan, runs))
    folders = finished_runs(runs)
    if first.rc or not folders:
        return "wrong blame", first.message or first.out.strip().splitlines()[-1]
    record = runs / "b" / "train" / "study_entry.json"
    stored = json.loads(record.read_text())
    record.write_text(json.dumps({**stored, "status": "failed"}))  # e.g. a plotting cell failed after training
    stamp = (folders[0] / "metrics.json").stat().st_mtime_ns
    plan_cwd_execute(study_run(plan, runs))
    if (folders[0] / "metrics.json").stat().st_mtime_ns != stamp:
        return "DATA LOST", "the finished run was retrained (its record rewritten): the entry's resume was off"
    return "works", "finished run loaded, not retrained"


@case("plan with lr: 1e-3", "api")
def plan_float(interface, runs):
    plan = WORK / "float-plan.yaml"
    plan.write_text(
        "study: b\nentries:\n  - name: t\n    notebook: notebooks/01_train.ipynb\n    parameters: {lr: 1e-3}\n"
    )
    code = (
        f"from dmlstudy.study.plan import load_plan\nfrom dmlstudy.run.train import TrainConfig\n"
        f"entry = load_plan({str(plan)!r})[0]\nprint(type(entry.parameters['lr']).__name__)\nTrainConfig(lr=entry.parameters['lr'])"
    )
    outcome = execute([sys.executable, "-c", API_PRELUDE.format(body=textwrap.indent(code, "    "))])
    if outcome.rc == 0 and "float" in outcome.out:
        return "works", "lr read as float 0.001"
    return judge_error(outcome, "lr")


@case("plan: entry without 'notebook'", "cli")
def plan_bad_entry(interface, runs):
    plan = WORK / "bad-plan.yaml"
    plan.write_text("study: b\nentries:\n  - name: t\n    parameters: {lr: 0.1}\n")
    return judge_error(plan_cwd_execute(study_run(plan, runs)), "notebook")


@case("plan: invalid YAML", "cli")
def plan_bad_yaml(interface, runs):
    plan = WORK / "broken-plan.yaml"
    plan.write_text("study: b\nentries:\n  - name: t\n    parameters: {lr: [0.1\n")
    return judge_error(plan_cwd_execute(study_run(plan, runs)), str(plan.name))


@case("plan: unknown notebook parameter", "cli")
def plan_unknown_parameter(interface, runs):
    plan = WORK / "unknown-plan.yaml"
    plan.write_text(
        "study: b\nentries:\n  - name: t\n    notebook: notebooks/01_train.ipynb\n    parameters: {learning_rate: 0.1}\n"
    )
    return judge_error(plan_cwd_execute(study_run(plan, runs)), "learning_rate")


@case("study table over runs of two lrs", "cli")
def table_groups(interface, runs):
    train(interface, runs, lr=0.001)
    train(interface, runs, lr=0.004, run_name="cub200-ms-seed0-lr4")  # a second folder even where names collide
    outcome = execute(
        [
            sys.executable,
            "-m",
            "dmlstudy",
            "study",
            "table",
            "b",
            "--runs-root",
            str(runs),
            "--metrics",
            "R@1",
            "--out",
            str(WORK / f"table-{runs.name}"),
        ]
    )
    table = WORK / f"table-{runs.name}.csv"
    if outcome.rc or not table.is_file():
        return judge_error(outcome, "table")
    rows = table.read_text().strip().splitlines()[1:]
    if len(rows) == 1 and ",2," in rows[0]:
        return "SILENT WRONG", "one row 'cub200 / ms, runs 2': two learning rates averaged as if they were seeds"
    return "works", f"{len(rows)} rows (one per configuration)"


# ------------------------------------------------------------------------------------------- names, sizes, types


@case("unknown method (data folder absent)", "cli", "api")
def unknown_method(interface, runs):
    return judge_error(train(interface, runs, method="msx", data_root=str(WORK / "nowhere")), "msx")


@case("unknown dataset", "cli")
def unknown_dataset(interface, runs):
    return judge_error(train(interface, runs, dataset="cub"), "cub")


@case("unknown backbone (data folder absent)", "cli")
def unknown_backbone(interface, runs):
    return judge_error(train(interface, runs, backbone="resnet_50", data_root=str(WORK / "nowhere")), "resnet_50")


@case("unknown method keyword (crt K3)", "cli")
def unknown_kwarg(interface, runs):
    return judge_error(
        train(interface, runs, method="crt", method_kwargs={"K3": 4}, epochs=1, steps_per_epoch=1), "K3", runs=runs
    )


@case("--recall-ks [1, 1000] (K larger than the gallery)", "cli", "api")
def large_k(interface, runs):
    return judge_error(train(interface, runs, recall_ks=[1, 1000]), "1000", runs=runs)


@case("--recall-ks [0]", "cli")
def zero_k(interface, runs):
    return judge_error(train(interface, runs, recall_ks=[0]), "recall", runs=runs)


@case("--classes-per-batch 40 (more than the 12 classes)", "cli")
def large_p(interface, runs):
    return judge_error(train(interface, runs, classes_per_batch=40), "40", runs=runs)


@case("--samples-per-class 1", "cli")
def m_one(interface, runs):
    return judge_error(train(interface, runs, samples_per_class=1), "samples_per_class", runs=runs)


@case("--epochs 0", "cli")
def zero_epochs(interface, runs):
    return judge_error(train(interface, runs, epochs=0), "epochs", runs=runs)


@case("--lr -1", "cli")
def negative_lr(interface, runs):
    return judge_error(train(interface, runs, lr=-1.0), "lr", runs=runs)


@case("--lr nan", "cli")
def nan_lr(interface, runs):
    return judge_error(train(interface, runs, lr=float("nan")), "lr", runs=runs)


@case("--lr 1000", "cli", "api")
def absurd_lr(interface, runs):
    outcome = train(interface, runs, lr=1000.0, epochs=3, steps_per_epoch=4)
    if "warning" in outcome.err.lower() and "lr" in outcome.err:
        line = next(line for line in outcome.err.splitlines() if "warning" in line.lower())
        return "warns", line[:200]
    return (
        ("SILENT WRONG", f"trains with no word: {outcome.out.strip().splitlines()[-1][:150]}")
        if outcome.rc == 0
        else judge_error(outcome, "lr")
    )


@case("--run-name ../../escaped", "cli")
def escaping_name(interface, runs):
    outcome = train(interface, runs, run_name="../../escaped")
    if outcome.rc == 0:
        return "SILENT WRONG", f"run written outside the study folder: {outcome.message}"
    return judge_error(outcome, "run_name")


@case("--device cuda on a machine without CUDA", "cli")
def no_cuda(interface, runs):
    import torch

    if torch.cuda.is_available():
        return "skipped", "this machine has CUDA"
    return judge_error(train(interface, runs, device="cuda"), "cuda")


@case("unknown option --epochz", "cli")
def unknown_option(interface, runs):
    return judge_error(execute(command(interface, runs, extra_cli=["--epochz", "3"])), "epochz")


@case("--epochs three", "cli")
def wrong_type_option(interface, runs):
    return judge_error(execute(command(interface, runs, extra_cli=["--epochs", "three"])), "three")


@case("--config file: epochs: '3' (a string)", "cli")
def config_wrong_type(interface, runs):
    config = WORK / "string-epochs.yaml"
    config.write_text("epochs: '3'\n")
    values = {key: value for key, value in TINY.items() if key != "epochs"}  # no --epochs option to override the file
    return judge_error(
        execute(
            [
                sys.executable,
                "-m",
                "dmlstudy",
                "train",
                "--config",
                str(config),
                *options({**values, "study": "b", "runs_root": str(runs), "data_root": str(DATA)}),
            ]
        ),
        "epochs",
    )


@case("--config file: unknown field", "cli")
def config_unknown(interface, runs):
    config = WORK / "unknown-field.yaml"
    config.write_text("epochz: 3\n")
    return judge_error(execute(command(interface, runs, extra_cli=["--config", str(config)])), "epochz")


@case("--config file missing", "cli")
def config_missing(interface, runs):
    return judge_error(execute(command(interface, runs, extra_cli=["--config", str(WORK / "nope.yaml")])), "nope.yaml")


@case("--config file with lr: 1e-3", "cli")
def config_float(interface, runs):
    config = WORK / "float.yaml"
    config.write_text("lr: 1e-3\n")
    outcome = execute(
        [
            sys.executable,
            "-m",
            "dmlstudy",
            "train",
            "--config",
            str(config),
            *options({**TINY, "study": "b", "runs_root": str(runs), "data_root": str(DATA)}),
        ]
    )
    folders = finished_runs(runs)
    if outcome.rc == 0 and folders and "lr: 0.001" in (folders[0] / "config.yaml").read_text():
        return "works", "lr read as 0.001"
    return judge_error(outcome, "lr")


@case("--method-kwargs with 2e-1 (ms loss margin)", "cli")
def kwargs_float(interface, runs):
    outcome = execute(command(interface, runs, extra_cli=["--method-kwargs", "{loss_kwargs: {margin: 2e-1}}"]))
    folders = finished_runs(runs)
    stored = (folders[0] / "config.yaml").read_text() if folders else ""
    if outcome.rc == 0 and "margin: 0.2" in stored:
        return "works", "margin read as 0.2"
    if outcome.rc == 0:
        return "SILENT WRONG", "margin stored as the string '2e-1'"
    return judge_error(outcome, "margin")


@case("--resume with another config under the same --run-name", "cli")
def resume_other(interface, runs):
    train(interface, runs, run_name="r", epochs=1)
    outcome = train(interface, runs, run_name="r", epochs=2, resume=True)
    folders = finished_runs(runs)
    if outcome.rc == 0 and len(folders) == 2:
        return "works", "trained in its own folder; the epochs=1 run kept" + (
            " (warned)" if "warning" in outcome.err else ""
        )
    if outcome.rc == 0:
        return "DATA LOST", "the epochs=1 run was replaced"
    return judge_error(outcome, "epochs")


@case("--resume with a corrupt checkpoint", "cli")
def corrupt_checkpoint(interface, runs):
    train(interface, runs)
    folder = finished_runs(runs)[0]
    (folder / "metrics.json").unlink()
    (folder / "checkpoint.pt").write_bytes(b"not a checkpoint" * 10)
    return judge_error(train(interface, runs, resume=True), "checkpoint.pt")


@case("re-run after kill -9 (stale lock), --resume", "cli")
def stale_lock(interface, runs):
    process = start(command(interface, runs, epochs=6, steps_per_epoch=3))
    if not wait_for("b/*/checkpoint.pt", runs, process):
        return "wrong blame", finish(process).message
    process.kill()
    process.wait()
    outcome = train(interface, runs, epochs=6, steps_per_epoch=3, resume=True)
    if outcome.rc == 0:
        warned = next((line for line in outcome.err.splitlines() if "stale" in line), "")
        return "works", (warned[:180] or "resumed (no lock to take over)")
    return judge_error(outcome, "lock")


# ------------------------------------------------------------------------------------------- data


@case("missing data folder", "cli")
def missing_data(interface, runs):
    return judge_error(train(interface, runs, data_root=str(WORK / "nowhere")), "nowhere")


@case("truncated PNG", "cli")
def truncated_png(interface, runs):
    data = copy_data(f"truncated-{runs.name}")
    victim = sorted((data / "cub200" / "images").rglob("*.png"))[3]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    return judge_error(train(interface, runs, data=data), victim.name, runs=runs)


@case("truncated JPEG", "cli")
def truncated_jpeg(interface, runs):
    from PIL import Image

    data = copy_data(f"jpeg-{runs.name}")
    victim = sorted((data / "cub200" / "images").rglob("*.png"))[3]
    jpeg = victim.with_suffix(".jpg")
    Image.open(victim).convert("RGB").save(jpeg, quality=95)
    jpeg.write_bytes(jpeg.read_bytes()[: jpeg.stat().st_size // 2])
    listing = data / "cub200" / "images.txt"
    listing.write_text(listing.read_text().replace(victim.name, jpeg.name))
    victim.unlink()
    return judge_error(train(interface, runs, data=data), jpeg.name, runs=runs)


@case("a text file saved as .png", "cli")
def not_an_image(interface, runs):
    data = copy_data(f"text-{runs.name}")
    victim = sorted((data / "cub200" / "images").rglob("*.png"))[5]
    victim.write_text("this is not an image\n" * 20)
    return judge_error(train(interface, runs, data=data), victim.name, runs=runs)


@case("NaN input images (a dataset transform gone wrong)", "api")
def nan_images(interface, runs):
    values = {**TINY, "study": "b", "runs_root": str(runs), "data_root": str(DATA), "train_classes": 4}
    body = textwrap.dedent(f"""
        import torch
        from dmlstudy.data.base import ImageListDataset
        original = ImageListDataset.__getitem__
        def poisoned(self, index):
            image, label = original(self, index)
            return (torch.full_like(image, float("nan")) if label == 0 else image), label
        ImageListDataset.__getitem__ = poisoned
        run(TrainConfig(**{values!r}))
    """)
    outcome = finish(
        start([sys.executable, "-c", API_PRELUDE.format(body=textwrap.indent(body, "    "))])
    )  # patches a class: own process
    if outcome.rc and ".png" in outcome.err and "epoch 1, step 1" in outcome.err:
        return "clear error", outcome.message
    if outcome.rc:
        return "late error" if any_checkpoint(runs) else "wrong blame", outcome.message
    return "SILENT WRONG", "trained on NaN images"


@case("a training class with one image", "cli")
def single_image_class(interface, runs):
    data = copy_data(f"single-{runs.name}")
    root = data / "cub200"
    labels = dict(line.split() for line in (root / "image_class_labels.txt").read_text().splitlines())
    split = dict(line.split() for line in (root / "train_test_split.txt").read_text().splitlines())
    images = [line.split() for line in (root / "images.txt").read_text().splitlines()]
    dropped = {i for i, _ in images if labels[i] == "2"}
    dropped -= {min(dropped, key=int)}
    for name, rows in (
        ("images.txt", images),
        ("image_class_labels.txt", labels.items()),
        ("train_test_split.txt", split.items()),
    ):
        (root / name).write_text("".join(f"{k} {v}\n" for k, v in rows if k not in dropped))
    outcome = train(interface, runs, data=data, epochs=1)
    if "warning" in outcome.err.lower() and "fewer than" in outcome.err:
        return "warns", next(line for line in outcome.err.splitlines() if "fewer than" in line)[:200]
    return (
        ("SILENT WRONG", "one image copied M times per batch, no warning")
        if outcome.rc == 0
        else judge_error(outcome, "class")
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="regular expression over case names")
    parser.add_argument("--interface", default="", choices=["", "cli", "api"])
    parser.add_argument("--json", default="", help="also write the rows as JSON here")
    parser.add_argument(
        "--cases", default="", help="a range of case numbers, e.g. 30-60 (to split the battery over processes)"
    )
    args = parser.parse_args()
    make_data()
    rows = []
    for number, (name, interface, function) in enumerate(CASES, start=1):
        if (args.only and not re.search(args.only, name)) or (args.interface and interface != args.interface):
            continue
        if args.cases and not int(args.cases.split("-")[0]) <= number <= int(args.cases.split("-")[1]):
            continue
        runs = WORK / f"runs-{number}-{interface}"
        started = time.perf_counter()
        try:
            verdict, evidence = function(interface, runs)
        except Exception as error:  # a broken case must not stop the battery
            verdict, evidence = "battery error", f"{type(error).__name__}: {error}"
        rows.append(
            {
                "case": name,
                "interface": interface,
                "verdict": verdict,
                "evidence": evidence.replace("|", "/").replace("\n", " "),
                "seconds": round(time.perf_counter() - started, 1),
            }
        )
        print(f"[{len(rows)}] {name} ({interface}): {verdict} — {evidence[:160]}", file=sys.stderr, flush=True)
        if args.json:  # after every case, so a battery cut short still leaves its rows
            Path(args.json).write_text(json.dumps(rows, indent=1))
    print("| # | case | interface | verdict | evidence |\n|---|---|---|---|---|")
    for number, row in enumerate(rows, start=1):
        print(f"| {number} | {row['case']} | {row['interface']} | {row['verdict']} | {row['evidence'][:200]} |")
    counts = {
        verdict: sum(row["verdict"] == verdict for row in rows) for verdict in sorted({row["verdict"] for row in rows})
    }
    print("\n" + ", ".join(f"{verdict}: {count}" for verdict, count in counts.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    shutil.rmtree(WORK, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
