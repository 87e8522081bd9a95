"""The papermill study runner: plan expansion, resume, failures with their cell, tables over seeds."""

import json
import os

import nbformat
import numpy as np
import pandas as pd
import pytest

from dmlstudy.study.executor import run_plan
from dmlstudy.study.plan import PlanEntry, PlanError, entry_setting, injected_parameters, load_plan
from dmlstudy.study.progress import stop_line
from dmlstudy.study.report import gather_runs, summarize, write_table


def write_notebook(path, parameters: str, body: str):
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    cell = nbformat.v4.new_code_cell(parameters)
    cell.metadata["tags"] = ["parameters"]
    notebook.cells = [cell, nbformat.v4.new_code_cell(body)]
    path.write_text(nbformat.writes(notebook))
    return path


@pytest.fixture
def toy_notebooks(tmp_path):
    write_notebook(
        tmp_path / "echo.ipynb",
        "study: str = 'x'\nrun_name: str = ''\nruns_root: str = ''\nvalue: int = 1\nscale: float = 1.0",
        "import json, pathlib\nfolder = pathlib.Path(runs_root) / study / run_name\nfolder.mkdir(parents=True, exist_ok=True)\n"
        "(folder / 'metrics.json').write_text(json.dumps({'R@1': value * scale / 10}))\n"
        "(folder / 'config.yaml').write_text(f'value: {value}\\nscale: {scale}\\n')",
    )
    write_notebook(
        tmp_path / "broken.ipynb", "value: int = 1", "x = 1\nraise RuntimeError(f'broken on purpose {value}')"
    )
    return tmp_path


def write_plan(folder, text):
    path = folder / "plan.yaml"
    path.write_text(text)
    return path


def test_grid_expands_every_combination(toy_notebooks):
    plan = write_plan(
        toy_notebooks,
        f"study: s\nentries:\n  - name: e\n    notebook: {toy_notebooks}/echo.ipynb\n"
        "    parameters: {scale: 2.0}\n    grid: {value: [1, 2, 3], study_seed: [0, 1]}\n",
    )
    entries = load_plan(plan)
    assert len(entries) == 6
    assert entries[0].run_name == "e-value=1-study_seed=0" and entries[0].parameters == {
        "scale": 2.0,
        "value": 1,
        "study_seed": 0,
    }
    assert len({e.run_name for e in entries}) == 6


def test_plan_errors_are_specific(toy_notebooks):
    with pytest.raises(PlanError, match="notebook not found"):
        load_plan(write_plan(toy_notebooks, "entries:\n  - name: a\n    notebook: nowhere.ipynb\n"))
    with pytest.raises(PlanError, match="needs 'name' and 'notebook'"):
        load_plan(write_plan(toy_notebooks, "entries:\n  - notebook: x.ipynb\n"))
    plan = write_plan(
        toy_notebooks, f"entries:\n  - name: a\n    notebook: {toy_notebooks}/echo.ipynb\n    parameters: {{valu: 3}}\n"
    )
    with pytest.raises(PlanError, match=r"has no parameters \['valu'\]"):
        run_plan(plan, root=toy_notebooks / "runs")


def test_run_resumes_and_lists_failures(toy_notebooks, capsys):
    plan = write_plan(
        toy_notebooks,
        f"study: s\nentries:\n  - name: ok\n    notebook: {toy_notebooks}/echo.ipynb\n    grid: {{value: [1, 3]}}\n"
        f"  - name: bad\n    notebook: {toy_notebooks}/broken.ipynb\n",
    )
    root = toy_notebooks / "runs"
    outcomes = run_plan(plan, root=root)
    assert [o.status for o in outcomes] == ["complete", "complete", "failed"]
    assert "RuntimeError" in outcomes[2].error and "broken on purpose" in outcomes[2].error
    assert (root / "s" / "ok-value=3" / "echo.ipynb").is_file()
    assert json.loads((root / "s" / "ok-value=3" / "metrics.json").read_text()) == {"R@1": 0.3}
    assert "FAILED bad" in capsys.readouterr().out
    again = run_plan(plan, root=root)
    assert [o.status for o in again] == ["skipped", "skipped", "failed"]


def test_a_plan_starts_from_the_finished_runs_of_the_study_it_reuses(toy_notebooks, capsys):
    root = toy_notebooks / "runs"
    for name, files in {
        "synbirds-ms-seed0-aaaaaaaa": ("config.yaml", "metrics.json", "checkpoint.pt"),
        "synbirds-ms-seed1-bbbbbbbb": ("config.yaml", "checkpoint.pt"),  # interrupted: no final metrics
        "synbirds-ms-seed2-cccccccc": ("config.yaml", "metrics.json", "checkpoint.pt"),
        "compare": ("study_entry.json",),  # a notebook entry, not a run
    }.items():
        (root / "default" / name).mkdir(parents=True)
        for file in files:
            (root / "default" / name / file).write_text("source")
    (root / "s" / "synbirds-ms-seed2-cccccccc").mkdir(parents=True)
    (root / "s" / "synbirds-ms-seed2-cccccccc" / "metrics.json").write_text("own")
    plan = write_plan(
        toy_notebooks,
        f"study: s\nreuse_runs_of: default\nentries:\n  - name: ok\n    notebook: {toy_notebooks}/echo.ipynb\n",
    )
    assert [o.status for o in run_plan(plan, root=root, progress=False)] == ["complete"]
    assert sorted(p.name for p in (root / "s").iterdir()) == [
        "ok",
        "synbirds-ms-seed0-aaaaaaaa",
        "synbirds-ms-seed2-cccccccc",
    ]
    assert (root / "s" / "synbirds-ms-seed0-aaaaaaaa" / "checkpoint.pt").read_text() == "source"
    assert (root / "s" / "synbirds-ms-seed2-cccccccc" / "metrics.json").read_text() == "own"  # never replaced
    assert "1 finished run folders copied" in capsys.readouterr().out
    assert not list(root.glob(".*copying"))
    run_plan(plan, root=root, progress=False, overwrite=True)
    assert "copied" not in capsys.readouterr().out
    for value in ("s", "a/b", "[default]"):
        text = f"study: s\nreuse_runs_of: {value}\nentries:\n  - name: ok\n    notebook: {toy_notebooks}/echo.ipynb\n"
        with pytest.raises(PlanError, match="'reuse_runs_of' must name another study"):
            run_plan(write_plan(toy_notebooks, text), root=root)


def test_an_entry_runs_again_when_the_tuned_values_it_reads_change(toy_notebooks):
    """After `make tune` rewrites plans/tuned/, `make study` must not skip the entries that train with them."""
    tuned = toy_notebooks / "tuned"
    (tuned / "pretrained").mkdir(parents=True)
    (tuned / "synbirds.yaml").write_text("rows: {}\n")
    (tuned / "pretrained" / "synbirds.yaml").write_text("rows: {}\n")
    write_notebook(toy_notebooks / "tuned.ipynb", "protocol: dict = {}", "print(protocol['tuned'])")
    plan = write_plan(
        toy_notebooks,
        f"study: s\nentries:\n  - name: reads\n    notebook: {toy_notebooks / 'tuned.ipynb'}\n"
        f"    parameters: {{protocol: {{tuned: {tuned}}}}}\n  - name: plain\n    notebook: {toy_notebooks / 'echo.ipynb'}\n",
    )
    root = toy_notebooks / "runs"
    assert [o.status for o in run_plan(plan, root=root, progress=False)] == ["complete", "complete"]
    assert [o.status for o in run_plan(plan, root=root, progress=False)] == ["skipped", "skipped"]
    (tuned / "pretrained" / "synbirds.yaml").write_text("rows: {ms: {overrides: {lr: 0.001}}}\n")
    assert [o.status for o in run_plan(plan, root=root, progress=False)] == ["complete", "skipped"]
    record = json.loads((root / "s" / "reads" / "study_entry.json").read_text())
    assert set(record["inputs"]) == {"selection rule", "notebook", "synbirds.yaml", "pretrained/synbirds.yaml"}


def test_the_runner_puts_study_and_runs_root_into_a_study_notebooks_protocol(tmp_path):
    """A study notebook's shared protocol is one mapping: the runner's ``study`` and ``runs_root`` go inside it (the
    entry's own keys win); a notebook without one gets them as parameters of their own, where it declares them."""
    notebook = tmp_path / "10_crt.ipynb"
    entry = PlanEntry("s", "crt", notebook, {"protocol": {"seeds": [0, 1], "tuned": "plans/tuned"}, "components": True})
    injected = injected_parameters(entry, ["protocol", "components", "resume"], tmp_path / "runs")
    assert injected == {
        "resume": True,
        "protocol": {"study": "s", "runs_root": str(tmp_path / "runs"), "seeds": [0, 1], "tuned": "plans/tuned"},
        "components": True,
    }
    assert entry.parameters["protocol"] == {"seeds": [0, 1], "tuned": "plans/tuned"}, "the plan's entry is unchanged"
    own = PlanEntry("s", "crt", notebook, {"protocol": {"study": "other"}})
    assert injected_parameters(own, ["protocol"], tmp_path)["protocol"] == {
        "study": "other",
        "runs_root": str(tmp_path),
    }
    bare = injected_parameters(PlanEntry("s", "crt", notebook), ["protocol"], tmp_path)
    assert bare == {"protocol": {"study": "s", "runs_root": str(tmp_path)}}, "no protocol given: the defaults, here"
    flat = injected_parameters(
        PlanEntry("s", "train", notebook), ["study", "runs_root", "run_name", "epochs"], tmp_path
    )
    assert flat == {"study": "s", "runs_root": str(tmp_path), "run_name": "train"}
    with pytest.raises(PlanError, match="'protocol' must be a mapping of protocol fields"):
        injected_parameters(PlanEntry("s", "crt", notebook, {"protocol": [0]}), ["protocol"], tmp_path)
    assert entry_setting(injected, "tuned") == "plans/tuned" and entry_setting({"tuned": "t"}, "tuned") == "t"
    assert entry_setting(injected, "workers", 1) == 1


def test_every_entry_runs_again_when_the_checkpoint_selection_rule_changes(toy_notebooks, monkeypatch):
    """A new selection rule changes what a notebook reports from the same runs (and retrains a run whose recorded
    choice the rule no longer makes), so no entry may be skipped on a record of the old rule."""
    from dmlstudy.study import plan as plan_module

    plan = write_plan(
        toy_notebooks, f"study: s\nentries:\n  - name: plain\n    notebook: {toy_notebooks / 'echo.ipynb'}\n"
    )
    root = toy_notebooks / "runs"
    assert [o.status for o in run_plan(plan, root=root, progress=False)] == ["complete"]
    assert [o.status for o in run_plan(plan, root=root, progress=False)] == ["skipped"]
    monkeypatch.setattr(plan_module, "SELECTION_RULE", "a later revision")
    assert [o.status for o in run_plan(plan, root=root, progress=False)] == ["complete"]


def test_each_entry_ledgers_the_runs_its_last_execution_reported(toy_notebooks):
    """The study runner names a ledger for each entry's kernel and empties it when the entry starts again, so
    after a plan each entry lists the runs of its last execution only (dmlstudy.run.identity.superseded_runs)."""
    write_notebook(
        toy_notebooks / "notes.ipynb",
        "study: str = 'x'\nrun_name: str = ''\nruns_root: str = ''\nvalue: int = 1",
        "import pathlib\nfrom dmlstudy.run.identity import note_used\n"
        "note_used(pathlib.Path(runs_root) / study / f'r-{value}')\nnote_used(pathlib.Path(runs_root) / study / 'q-0')",
    )
    root = toy_notebooks / "runs"
    for value in (1, 2):
        plan = write_plan(
            toy_notebooks,
            f"study: s\nentries:\n  - name: a\n    notebook: {toy_notebooks / 'notes.ipynb'}\n"
            f"    parameters: {{value: {value}}}\n  - name: b\n    notebook: {toy_notebooks / 'echo.ipynb'}\n",
        )
        assert [o.status for o in run_plan(plan, root=root, progress=False)][0] == "complete"
    assert (root / "s" / "a" / "runs.txt").read_text().splitlines() == ["r-2", "q-0"]
    assert (root / "s" / "b" / "runs.txt").read_text() == ""  # an entry that reports no run has an empty ledger
    assert "DMLSTUDY_RUN_LEDGER" not in os.environ


@pytest.fixture
def marks(toy_notebooks, monkeypatch):
    """A folder where the toy notebooks of a plan run side by side leave their marks; no outside scheduler."""
    monkeypatch.delenv("DMLSTUDY_SCHEDULER", raising=False)
    folder = toy_notebooks / "marks"
    folder.mkdir()
    return folder


def test_concurrent_entries_run_side_by_side_on_one_cluster_and_after_earlier_waits(toy_notebooks, marks):
    """Entries a and b each wait for the other to have started (they fail if run one after the other); c, with
    ``after_earlier``, must find both ended; all three kernels see the one cluster the plan started."""
    write_notebook(
        toy_notebooks / "meet.ipynb",
        "me: str = 'a'\nother: str = 'b'\nworkers: int = 1",
        "import os, pathlib, time\n"
        f"marks = pathlib.Path({str(marks)!r})\n"
        "(marks / f'{me}.started').write_text(os.environ.get('DMLSTUDY_SCHEDULER', ''))\n"
        "(marks / f'{me}.omp').write_text(os.environ.get('OMP_NUM_THREADS', 'unset'))\n"
        "deadline = time.monotonic() + 60\n"
        "while not (marks / f'{other}.started').exists():\n"
        "    assert time.monotonic() < deadline, f'{other} never started while {me} ran'\n"
        "    time.sleep(0.05)\n"
        "(marks / f'{me}.ended').write_text('')",
    )
    write_notebook(
        toy_notebooks / "last.ipynb",
        "workers: int = 1",
        "import os, pathlib\n"
        f"marks = pathlib.Path({str(marks)!r})\n"
        "assert (marks / 'a.ended').exists() and (marks / 'b.ended').exists(), 'started before a and b ended'\n"
        "(marks / 'c.started').write_text(os.environ.get('DMLSTUDY_SCHEDULER', ''))",
    )
    meet = toy_notebooks / "meet.ipynb"
    plan = write_plan(
        toy_notebooks,
        f"study: s\nconcurrent_entries: 3\nentries:\n"
        f"  - name: a\n    notebook: {meet}\n    parameters: {{me: a, other: b, workers: 2}}\n"
        f"  - name: b\n    notebook: {meet}\n    parameters: {{me: b, other: a}}\n"
        f"  - name: c\n    notebook: {toy_notebooks / 'last.ipynb'}\n    after_earlier: true\n",
    )
    environment = dict(os.environ)
    outcomes = run_plan(plan, root=toy_notebooks / "runs", progress=False)
    assert [(o.entry.run_name, o.status, o.error) for o in outcomes] == [
        ("a", "complete", ""),
        ("b", "complete", ""),
        ("c", "complete", ""),
    ]
    addresses = {(marks / f"{name}.started").read_text() for name in "abc"}
    assert len(addresses) == 1 and addresses.pop().startswith("tcp://")
    assert "DMLSTUDY_SCHEDULER" not in os.environ
    # the kernels get this process's environment, not the OMP_NUM_THREADS=1 Dask sets for its workers
    assert {(marks / f"{name}.omp").read_text() for name in "ab"} == {os.environ.get("OMP_NUM_THREADS", "unset")}
    assert os.environ == environment
    assert [o.status for o in run_plan(plan, root=toy_notebooks / "runs", progress=False)] == ["skipped"] * 3


def test_sigterm_stops_entries_side_by_side_and_records_each_as_interrupted(toy_notebooks, marks):
    """``dmlstudy study run`` with two entries running at once and a third waiting: SIGTERM reaches both
    kernels, both are recorded ``interrupted``, the third never starts, and the exit says how to resume."""
    import signal
    import subprocess
    import sys
    import time

    write_notebook(
        toy_notebooks / "sleep.ipynb",
        "me: str = 'a'",
        f"import pathlib, time\n(pathlib.Path({str(marks)!r}) / me).write_text('')\ntime.sleep(300)",
    )
    sleep = toy_notebooks / "sleep.ipynb"
    plan = write_plan(
        toy_notebooks,
        f"study: s\nconcurrent_entries: 2\nentries:\n"
        f"  - name: a\n    notebook: {sleep}\n    parameters: {{me: a}}\n"
        f"  - name: b\n    notebook: {sleep}\n    parameters: {{me: b}}\n"
        f"  - name: c\n    notebook: {sleep}\n    parameters: {{me: c}}\n",
    )
    root = toy_notebooks / "runs"
    command = [sys.executable, "-m", "dmlstudy", "study", "run", str(plan), "--runs-root", str(root)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 400  # a loaded machine starts kernels slowly
    while not ((marks / "a").exists() and (marks / "b").exists()):
        assert process.poll() is None and time.monotonic() < deadline, "the two entries never both started"
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr
    assert stderr.strip().splitlines()[-1] == stop_line(
        "SIGTERM", runs=0, notebooks=0, command=f"dmlstudy study run {plan} --runs-root {root}"
    )
    for name in "ab":
        record = json.loads((root / "s" / name / "study_entry.json").read_text())
        assert record["status"] == "interrupted" and record["error"] == "interrupted by SIGTERM"
    assert not (marks / "c").exists() and not (root / "s" / "c").exists()


def test_a_second_sigterm_kills_kernels_that_ignore_the_first(toy_notebooks, marks):
    """A user who signals twice wants the plan gone: its kernels are killed, not waited for (the first signal
    reaches them as an interrupt, which this one ignores)."""
    import signal
    import subprocess
    import sys
    import time

    import psutil

    write_notebook(
        toy_notebooks / "stubborn.ipynb",
        "me: str = 'a'",
        "import os, pathlib, signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        f"(pathlib.Path({str(marks)!r}) / me).write_text(str(os.getpid()))\ntime.sleep(300)",
    )
    plan = write_plan(
        toy_notebooks, f"study: s\nentries:\n  - name: a\n    notebook: {toy_notebooks / 'stubborn.ipynb'}\n"
    )
    command = [sys.executable, "-m", "dmlstudy", "study", "run", str(plan), "--runs-root", str(toy_notebooks / "runs")]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 400  # a loaded machine starts kernels slowly
        while not (marks / "a").exists() or not (marks / "a").read_text():
            assert process.poll() is None and time.monotonic() < deadline, "the entry never started"
            time.sleep(0.05)
        kernel = int((marks / "a").read_text())
        process.send_signal(signal.SIGTERM)
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(timeout=3)  # the kernel ignores the interrupt: the plan waits for it
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 143, stderr
    assert stderr.strip().splitlines()[-1].startswith("stopped by SIGTERM: kept 0 finished runs")
    assert "Kernel died" not in stderr and "Traceback" not in stderr
    assert not psutil.pid_exists(kernel) or psutil.Process(kernel).status() == psutil.STATUS_ZOMBIE


def test_ctrl_c_stops_a_plan_cleanly_and_keeps_what_finished(toy_notebooks, marks, tiny_data_root):
    """A terminal's Ctrl-C (SIGINT to the whole process group) while a notebook trains a tiny run on the plan's
    cluster, beside a run finished earlier and a notebook that has ended: exit status 130, one closing line that
    counts what was kept, no traceback or "Kernel died", the run in flight stopped with its epoch checkpoint kept
    (it resumes), and no kernel or worker left behind. The plan's bar counted the run finished before as done
    at once and the one the notebook submitted."""
    import signal
    import subprocess
    import sys
    import time

    import psutil

    write_notebook(
        toy_notebooks / "train.ipynb",
        "study: str = 'x'\nruns_root: str = ''\nworkers: int = 2",
        "import json, os, pathlib\nfrom dmlstudy.study import engine\nfrom dmlstudy.run.train import TrainConfig\n"
        f"config = TrainConfig(study=study, runs_root=runs_root, data_root={str(tiny_data_root)!r}, dataset='cub200', "
        "run_name='long', epochs=1000, image_size=32, classes_per_batch=4, samples_per_class=3, steps_per_epoch=2, "
        "train_classes=0, test_classes=0, eval_batch_size=64, progress=False, device='cpu')\n"
        "client = engine.get_client(workers)\n"
        f"pathlib.Path({str(marks)!r}, 'long').write_text(json.dumps([os.getpid(), *client.run(os.getpid).values()]))\n"
        "task = ('long', engine.train_task, (engine.task_values(config),), engine.run_task_key(config))\n"
        "engine.run_tasks(client, [task], what='runs', progress=False)",
    )
    plan = write_plan(
        toy_notebooks,
        f"study: s\nconcurrent_entries: 2\nentries:\n"
        f"  - name: quick\n    notebook: {toy_notebooks / 'echo.ipynb'}\n"
        f"  - name: long\n    notebook: {toy_notebooks / 'train.ipynb'}\n",
    )
    root = toy_notebooks / "runs"
    earlier = root / "s" / "earlier-0123abcd"  # a run finished before the plan started
    earlier.mkdir(parents=True)
    for name, text in {"config.yaml": "epochs: 2\n", "metrics.json": '{"R@1": 0.5}', "checkpoint.pt": ""}.items():
        (earlier / name).write_text(text)
    command = [sys.executable, "-m", "dmlstudy", "study", "run", str(plan), "--runs-root", str(root)]
    environment = {**os.environ, "DMLSTUDY_TASK_THREADS": "1"}
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, env=environment
    )
    try:
        deadline = time.monotonic() + 400
        while not (list(root.glob("s/long-*/history.csv")) and (root / "s" / "quick" / "study_entry.json").exists()):
            assert process.poll() is None and time.monotonic() < deadline, "the run never got going"
            time.sleep(0.2)
        os.killpg(process.pid, signal.SIGINT)
        stdout, stderr = process.communicate(timeout=240)
    finally:
        process.kill()
    assert process.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == stop_line(
        "SIGINT", runs=1, notebooks=1, command=f"dmlstudy study run {plan} --runs-root {root}"
    )
    assert "Traceback" not in stdout + stderr and "Kernel died" not in stdout + stderr
    assert "[1/2] quick  done in" in stdout and "1/2 |" in stderr  # its entry line; the bar: 1 of 2 runs ended
    (long_run,) = root.glob("s/long-*")
    assert (long_run / "checkpoint.pt").is_file() and not (long_run / "metrics.json").exists()
    assert json.loads((root / "s" / "long" / "study_entry.json").read_text())["status"] == "interrupted"

    def alive(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in json.loads((marks / "long").read_text())):  # its kernel and the workers
        assert time.monotonic() < deadline, "a kernel or worker outlived the plan"
        time.sleep(0.2)


def test_concurrent_entries_and_after_earlier_are_checked(toy_notebooks):
    echo = toy_notebooks / "echo.ipynb"
    for text, message in [
        (
            f"concurrent_entries: 0\nentries:\n  - name: a\n    notebook: {echo}\n",
            "'concurrent_entries' must be an integer ≥ 1, got 0",
        ),
        (f"concurrent_entries: two\nentries:\n  - name: a\n    notebook: {echo}\n", "got 'two'"),
        (
            f"entries:\n  - name: a\n    notebook: {echo}\n    after_earlier: yes please\n",
            "entry 'a': 'after_earlier' must be true or false",
        ),
    ]:
        with pytest.raises(PlanError, match=message):
            run_plan(write_plan(toy_notebooks, text), root=toy_notebooks / "runs", progress=False)


def test_tables_are_mean_and_std_over_seeds(tmp_path):
    rows = {"a": [0.5, 0.7, 0.6], "b": [0.2, 0.4, 0.3]}
    for method, values in rows.items():
        for seed, value in enumerate(values):
            folder = tmp_path / "study" / f"{method}-{seed}"
            folder.mkdir(parents=True)
            (folder / "metrics.json").write_text(json.dumps({"R@1": value}))
            (folder / "config.yaml").write_text(f"method: {method}\nseed: {seed}\nmethod_kwargs: {{K: 2}}\n")
    frame = gather_runs("study", root=tmp_path)
    assert len(frame) == 6 and "method_kwargs.K" in frame
    table = summarize(frame, by=["method"], metrics=["R@1"])
    for method, values in rows.items():
        row = table[table["method"] == method].iloc[0]
        assert row["runs"] == 3
        assert row["R@1_mean"] == pytest.approx(100 * np.mean(values))
        assert row["R@1_std"] == pytest.approx(100 * np.std(values, ddof=1))
    assert table.loc[table["method"] == "a", "R@1"].item() == "60.0 ± 10.0"
    csv_path, md_path = write_table(table, tmp_path / "out" / "table")
    assert pd.read_csv(csv_path)["R@1_mean"].tolist() == pytest.approx([60.0, 30.0])
    assert "60.0 ± 10.0" in md_path.read_text()


def test_only_the_published_studies_write_the_repository_figures_and_results(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from dmlstudy import plots
    from dmlstudy.paths import study_outputs

    monkeypatch.setenv("DMLSTUDY_HOME", str(tmp_path))
    assert study_outputs("default", "figures") == tmp_path / "figures"
    assert study_outputs("default", "results") == tmp_path / "results"
    assert study_outputs("headline10", "results") == tmp_path / "results" / "headline10"
    assert study_outputs("smoke", "figures") == tmp_path / "runs" / "smoke" / "figures"
    assert (
        study_outputs("smoke", "results", runs_root_override=tmp_path / "elsewhere")
        == tmp_path / "elsewhere" / "smoke" / "results"
    )
    with pytest.raises(ValueError, match="kind must be"):
        study_outputs("default", "tables")
    figure = plt.figure()
    assert plots.save_figure(figure, "x", study="notebook-10_crt").is_file()
    assert not (tmp_path / "figures").exists()
    assert plots.save_figure(figure, "x", study="default") == tmp_path / "figures" / "x.png"
    plt.close(figure)


def test_a_single_run_shows_its_value_without_a_spread():
    frame = pd.DataFrame(
        [
            {"method": "a", "seed": 0, "R@1": 0.5},
            {"method": "b", "seed": 0, "R@1": 0.2},
            {"method": "b", "seed": 1, "R@1": 0.4},
        ]
    )
    table = summarize(frame, by=["method"], metrics=["R@1"]).set_index("method")
    assert table.loc["a", "R@1"] == "50.0" and table.loc["a", "R@1_std"] == 0.0
    assert table.loc["b", "R@1"] == "30.0 ± 14.1"


def test_the_study_timeline_counts_the_runs_training_at_once(tmp_path):
    """benchmarks/study_timeline.py, the measurement behind "Notebooks side by side": runs a (0–10 s) and b
    (5–20 s) overlap for 5 s; nothing trains for 10 s; c (from 30 s, unfinished) counts until the newest record,
    d's end (32–40 s)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "study_timeline.py"
    spec = importlib.util.spec_from_file_location("study_timeline", path)
    timeline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(timeline)
    for name, start, end in [("a", 1000, 1010), ("b", 1005, 1020), ("c", 1030, None), ("d", 1032, 1040)]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.yaml").write_text("x")
        os.utime(tmp_path / name / "config.yaml", (start, start))
        if end is not None:
            (tmp_path / name / "metrics.json").write_text("{}")
            os.utime(tmp_path / name / "metrics.json", (end, end))
    intervals = timeline.run_intervals(tmp_path)
    assert [name for *_, name in intervals] == ["a", "b", "c", "d"]
    span, seconds = timeline.occupancy(intervals)
    assert span == 40 and seconds == {0: 10, 1: 17, 2: 13}


def test_compare_studies_pairs_the_same_run_across_numerics(tmp_path):
    """benchmarks/compare_studies.py, the measurement behind "The default study in bf16": a run of study A and
    one of study B are the same run when their configurations differ only in ``autocast`` (and the study's
    own name and folders); runs that differ in anything else are not paired, and two configurations that share
    a row label (the tutorial's MS run beside the comparison's) stay two rows."""
    import importlib.util
    import json
    from pathlib import Path

    import yaml

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "compare_studies.py"
    spec = importlib.util.spec_from_file_location("compare_studies", path)
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)

    def write(study, folder, seed, r1, *, lr=0.004, autocast="auto", seconds=10.0):
        run = tmp_path / study / folder
        run.mkdir(parents=True)
        config = {"study": study, "run_name": f"synbirds-ms-seed{seed}", "seed": seed, "lr": lr, "autocast": autocast}
        (run / "config.yaml").write_text(yaml.safe_dump(config))
        (run / "metrics.json").write_text(json.dumps({"R@1": r1, "epochs_trained": 2}))
        (run / "history.csv").write_text(f"epoch,train_seconds,eval_seconds\n1,{seconds},1\n2,{seconds},1\n")

    for seed, (a, b) in enumerate([(0.40, 0.402), (0.50, 0.501), (0.45, 0.453)]):
        write("a", f"s{seed}", seed, a, seconds=10.0)
        write("b", f"s{seed}", seed, b, autocast="bf16", seconds=5.0)
    write("a", "tutorial", 0, 0.30, lr=0.01)
    write("b", "tutorial", 0, 0.20, lr=0.01, autocast="bf16")
    write("b", "other", 1, 0.90, lr=0.02, autocast="bf16")  # no twin in study a
    rows = compare.paired_rows(compare.run_records(tmp_path / "a"), compare.run_records(tmp_path / "b"))
    by_row = rows.set_index("row")
    assert sorted(by_row.index) == ["synbirds-ms #1", "synbirds-ms #2"]
    three = by_row[by_row["seeds"] == 3].iloc[0]
    assert three["Δ (B − A)"] == pytest.approx(0.2)
    assert three["verdict"] == "equivalent"
    one = by_row[by_row["seeds"] == 1].iloc[0]
    assert one["Δ (B − A)"] == pytest.approx(-10.0) and one["verdict"] == "one seed"
