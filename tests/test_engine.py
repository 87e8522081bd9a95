"""The Dask engine: worker placement, clean task state, records equal to a serial run, recovery from a killed
worker, and a clear error for an unreachable scheduler."""

import json
import os
import signal
import socket
import threading
import time
import warnings

import numpy as np
import pandas as pd
import pytest
import torch

from dmlstudy.run import guard
from dmlstudy.run.compute import resolve_device
from dmlstudy.study import engine
from dmlstudy.study.grids import run_grid

TIMING = ("train_seconds", "seconds_per_epoch", "eval_seconds", "train_cpu_seconds", "eval_cpu_seconds")


@pytest.fixture
def one_thread_tasks(monkeypatch):
    """Every task (on the workers and in this process) with one torch thread, whatever the machine's cores,
    so a run's float sums are the same wherever it trains."""
    monkeypatch.setenv(engine.THREADS_VARIABLE, "1")
    monkeypatch.delenv(engine.SCHEDULER_VARIABLE, raising=False)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def records(run_dir):
    """A run's records without wall-clock timings: metrics, history and embeddings."""
    metrics = {k: v for k, v in json.loads((run_dir / "metrics.json").read_text()).items() if k not in TIMING}
    history = pd.read_csv(run_dir / "history.csv").drop(columns=list(TIMING), errors="ignore")
    with np.load(run_dir / "embeddings.npz") as stored:
        arrays = dict(stored)
    return metrics, history, arrays


def assert_same_records(left, right):
    (metrics_a, history_a, arrays_a), (metrics_b, history_b, arrays_b) = records(left), records(right)
    assert metrics_a == metrics_b
    pd.testing.assert_frame_equal(history_a, history_b, check_exact=True)
    assert arrays_a.keys() == arrays_b.keys()
    for name in arrays_a:
        np.testing.assert_array_equal(arrays_a[name], arrays_b[name])


def test_workers_get_round_robin_gpus_and_a_share_of_the_cores():
    plans = engine.local_worker_plans(6, cores=12, gpus=4)  # a fake 4-GPU machine: 6 workers
    assert [plan.device for plan in plans] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3", "cuda:0", "cuda:1"]
    assert {plan.threads for plan in plans} == {2}
    assert [plan.device for plan in engine.local_worker_plans(4, cores=8, gpus=2)] == [
        "cuda:0",
        "cuda:1",
    ] * 2  # 2 runs per GPU
    assert [plan.device for plan in engine.local_worker_plans(2, cores=2, gpus=0)] == ["cpu", "cpu"]
    assert engine.local_worker_plans(3, cores=2, gpus=0)[0].threads == 1  # never 0 threads
    with pytest.raises(ValueError, match="workers must be ≥ 1"):
        engine.local_worker_plans(0, cores=2, gpus=0)


def test_auto_device_is_the_one_the_engine_gave_the_worker(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv(engine.DEVICE_VARIABLE, "cuda:3")
    assert resolve_device("auto") == torch.device("cuda", 3)
    assert resolve_device("cpu") == torch.device("cpu")  # an explicit device wins
    monkeypatch.delenv(engine.DEVICE_VARIABLE)
    assert resolve_device("auto") == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_unreachable_scheduler_is_named_within_seconds(monkeypatch):
    from dmlstudy.cli import main

    address = f"tcp://127.0.0.1:{_closed_port()}"
    started = time.perf_counter()
    with pytest.raises(engine.EngineError, match=rf"cannot reach the Dask scheduler at '{address}'"):
        engine.connect(address, timeout=2)
    assert time.perf_counter() - started < 30  # not the default 30 s+ of retries; generous for a loaded machine
    monkeypatch.setenv(engine.SCHEDULER_VARIABLE, address)
    with pytest.raises(engine.EngineError, match=address):
        engine.get_client(2)
    with pytest.raises(SystemExit, match=address):
        main(["study", "run", "plans/smoke.yaml", "--scheduler", address])


def test_a_grid_on_two_workers_gives_the_records_of_a_serial_run(tiny_config, tmp_path, one_thread_tasks):
    specs = [{"seed": 0}, {"seed": 1, "method": "proxyanchor"}]
    parallel = [(f"v{i}", tiny_config(run_name=f"v{i}", resume=True, **spec)) for i, spec in enumerate(specs)]
    serial = [
        (f"v{i}", tiny_config(run_name=f"v{i}", resume=True, runs_root=str(tmp_path / "serial"), **spec))
        for i, spec in enumerate(specs)
    ]
    run_grid(parallel, workers=2)
    with engine.task_state():  # one thread here too
        run_grid(serial, workers=1)
    for (_, a), (_, b) in zip(parallel, serial):
        assert_same_records(a.run_dir, b.run_dir)


def test_a_long_lived_worker_gives_the_same_run_first_and_third(tiny_config, one_thread_tasks):
    client = engine.get_client(2)
    worker = sorted(client.scheduler_info()["workers"])[:1]  # every task on the same worker process
    first, other, third = (
        tiny_config(run_name="first"),
        tiny_config(run_name="other", method="proxyanchor", seed=3, epochs=1),
        tiny_config(run_name="third"),
    )
    for config in (first, other, third):
        engine.run_tasks(
            client,
            [(config.run_name, engine.train_task, (config.to_dict(),), f"same-worker-{config.run_name}")],
            what="runs",
            progress=False,
            workers=worker,
        )
    assert_same_records(first.run_dir, third.run_dir)


def test_a_killed_worker_resumes_its_run_and_retrains_nothing_else(tiny_config, tmp_path, one_thread_tasks):
    short = tiny_config(run_name="short", resume=True, epochs=1, steps_per_epoch=1)
    long = tiny_config(run_name="long", resume=True, epochs=30, steps_per_epoch=8)  # far longer than short
    client = engine.get_client(2)
    outcome = {}
    grid = threading.Thread(
        target=lambda: outcome.update(results=run_grid([("short", short), ("long", long)], workers=2))
    )
    grid.start()
    checkpoint, key = long.run_dir / "checkpoint.pt", engine.run_task_key(long)
    deadline = time.monotonic() + 600

    def long_worker():
        return next((worker for worker, keys in client.processing().items() if key in keys), None)

    while not ((short.run_dir / "metrics.json").is_file() and checkpoint.is_file() and long_worker()):
        assert time.monotonic() < deadline and grid.is_alive(), (
            "the grid ended before the long run saved its first epoch"
        )
        time.sleep(0.02)
    address = long_worker()
    pid = client.run(os.getpid, workers=[address])[address]
    kept = pd.DataFrame(torch.load(checkpoint, weights_only=False)["history"])  # checkpoints are replaced atomically
    assert not (long.run_dir / "metrics.json").is_file(), "the long run finished before it could be killed"
    short_stamp = (short.run_dir / "metrics.json").stat().st_mtime_ns
    os.kill(pid, signal.SIGKILL)
    grid.join(timeout=600)
    assert "results" in outcome, "the grid did not finish after the worker was killed"

    after = pd.read_csv(long.run_dir / "history.csv")
    assert 1 <= len(kept) < len(after) == long.epochs
    pd.testing.assert_frame_equal(
        after.iloc[: len(kept)], kept, check_dtype=False
    )  # finished epochs kept, not retrained
    assert (short.run_dir / "metrics.json").stat().st_mtime_ns == short_stamp  # the other run was not retrained
    reference = tiny_config(
        run_name="long", resume=True, epochs=30, steps_per_epoch=8, runs_root=str(tmp_path / "reference")
    )
    with engine.task_state():
        run_grid([("long", reference)], workers=1)
    assert_same_records(long.run_dir, reference.run_dir)


def test_stopping_a_running_task_frees_its_run_folder_at_once(tiny_config, one_thread_tasks):
    """What an interrupted grid or search does to its tasks: a cancelled run would otherwise train on in its
    worker thread, and submitting it again from the same client would fail with RunLockedError. The task stops
    itself at its next step, keeps its epoch checkpoint and releases its lock; its worker is not restarted."""
    from dmlstudy.run.guard import RunLock

    long = tiny_config(run_name="long", resume=True, epochs=200, steps_per_epoch=8)
    client = engine.get_client(1)
    workers = client.run(os.getpid)
    key = engine.run_task_key(long)
    future = client.submit(engine.train_task, engine.task_values(long), key=key, pure=False)
    deadline = time.monotonic() + 600
    while not (
        (long.run_dir / "checkpoint.pt").is_file() and any(key in keys for keys in client.processing().values())
    ):
        assert time.monotonic() < deadline and not future.done(), "the run ended before it saved its first epoch"
        time.sleep(0.02)
    engine.stop_tasks(client, [future])
    lock = RunLock(long.run_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a stale lock taken over would mean the worker had been killed
        lock.acquire()  # raises RunLockedError while the cancelled task still trains
    lock.release()
    assert not (long.run_dir / "metrics.json").is_file()
    assert (long.run_dir / "checkpoint.pt").is_file()
    assert client.run(os.getpid) == workers


def test_local_workers_ignore_a_terminals_ctrl_c(one_thread_tasks):
    """Ctrl-C in a terminal signals every process of its foreground group, the local cluster's workers too; they
    must live on (the process that owns them cancels its tasks and closes the cluster), while this process
    still gets its KeyboardInterrupt."""
    handler = signal.getsignal(signal.SIGINT)
    client = engine.get_client(1)
    workers = client.run(os.getpid)
    for pid in workers.values():
        os.kill(pid, signal.SIGINT)
    time.sleep(1.0)
    assert client.submit(int, "7", pure=False).result(timeout=60) == 7
    assert client.run(os.getpid) == workers  # the same processes: none died and was restarted
    assert signal.getsignal(signal.SIGINT) is handler


def test_a_grid_notes_its_runs_in_the_study_runners_ledger(tiny_config, tmp_path, one_thread_tasks, monkeypatch):
    """How a plan's runner learns of the runs its notebooks submit to the shared cluster: the engine appends each
    training task to the ledger the runner names (run folder and epoch cap, before any worker starts it) and
    each that failed; other tasks are not runs."""
    ledger = tmp_path / "identity.jsonl"
    monkeypatch.setenv(engine.RUN_EVENTS_VARIABLE, str(ledger))
    good = tiny_config(run_name="good", epochs=1)
    bad = tiny_config(run_name="bad", epochs=3, data_root=str(tmp_path / "no data here"))
    tasks = [
        (config.run_name, engine.train_task, (engine.task_values(config),), engine.run_task_key(config))
        for config in (good, bad)
    ]
    with pytest.raises(engine.GridRunError, match="1 of 3 tasks failed"):
        engine.run_tasks(
            engine.get_client(1),
            [*tasks, ("nap", time.sleep, (0,), f"nap-{time.time_ns()}")],
            what="tasks",
            progress=False,
        )
    events = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert sorted(events, key=json.dumps) == sorted(
        [
            {"event": "submitted", "run": good.run_dir.name, "epochs": 1},
            {"event": "submitted", "run": bad.run_dir.name, "epochs": 3},
            {"event": "failed", "run": bad.run_dir.name},
        ],
        key=json.dumps,
    )
    assert (good.run_dir / "metrics.json").is_file()
    monkeypatch.delenv(engine.RUN_EVENTS_VARIABLE)
    engine.note_run_event("submitted", "elsewhere", epochs=1)  # no ledger named: nothing written
    assert len(ledger.read_text().splitlines()) == 3


def test_local_workers_keep_glibcs_dynamic_malloc_thresholds():
    """Dask sets MALLOC_TRIM_THRESHOLD_=65536 in its workers by default, which made a training run there 1.7×
    slower than in a plain process (every tensor over 128 KiB mmap-ed and unmapped again)."""
    client = engine.get_client(1)
    assert set(client.run(lambda: os.environ.get("MALLOC_TRIM_THRESHOLD_")).values()) == {None}
    assert set(client.run(lambda: os.environ.get(engine.THREADS_VARIABLE)).values()) == {str(engine.available_cores())}


def test_a_local_cluster_that_lost_its_workers_is_started_again(one_thread_tasks, capsys):
    """A study once waited for ever on a local cluster whose two workers had both exited between two grids
    (the scheduler had 'Lost all workers' and nothing restarted them): the next grid must get live workers."""
    client = engine.get_client(1)
    engine._engine["cluster"].scale(0)
    deadline = time.monotonic() + 30
    while client.scheduler_info()["workers"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not client.scheduler_info()["workers"]
    again = engine.get_client(1)
    assert again is not client and len(again.scheduler_info()["workers"]) == 1
    assert "lost workers (0 of 1)" in capsys.readouterr().out
    assert again.submit(int, "7", pure=False).result(timeout=60) == 7


def test_a_grid_whose_local_workers_all_exited_stops_with_a_clear_error(one_thread_tasks, monkeypatch):
    """Without the watch, a grid waits for ever on a cluster with no worker left (the headline10 study did)."""
    monkeypatch.setattr(engine, "LOST_SECONDS", 2)
    client = engine.get_client(1)
    threading.Timer(1.0, engine._engine["cluster"].scale, args=(0,)).start()
    started = time.monotonic()
    with pytest.raises(engine.EngineError, match=r"no worker for 2 s with 1 naps unfinished.*run the same command"):
        engine.run_tasks(client, [("nap", time.sleep, (60,), f"nap-{time.time_ns()}")], what="naps", progress=False)
    assert time.monotonic() - started < 30
    assert len(engine.get_client(1).scheduler_info()["workers"]) == 1  # the next grid gets a new cluster


def test_a_run_task_waits_for_a_run_folder_another_process_is_writing(tiny_config, one_thread_tasks):
    """A plan's 01_train notebook trains its run in its own kernel; a run task of another notebook asking for
    the same run must wait for it and then load it, not fail with RunLockedError."""
    from dmlstudy.run.guard import RunLock

    config = tiny_config(run_name="held")
    config.run_dir.mkdir(parents=True)
    lock = RunLock(config.run_dir)
    lock.acquire()
    client, outcome = engine.get_client(1), {}

    def grid():
        try:
            outcome["metrics"] = engine.run_tasks(
                client,
                [("held", engine.train_task, (config.to_dict(),), f"held-{time.time_ns()}")],
                what="runs",
                progress=False,
            )["held"]
        except Exception as error:
            outcome["error"] = error

    thread = threading.Thread(target=grid)
    try:
        thread.start()
        thread.join(timeout=3 * guard.LOCK_POLL_SECONDS)
        assert thread.is_alive() and not outcome, f"the task did not wait for the held run folder: {outcome}"
    finally:
        lock.release()
    thread.join(timeout=300)
    assert (
        "error" not in outcome
        and outcome["metrics"]["R@1"] == json.loads((config.run_dir / "metrics.json").read_text())["R@1"]
    )


def test_grids_sharing_a_cluster_run_a_shared_task_once_and_the_smaller_grid_first(tmp_path, one_thread_tasks):
    """Two notebooks of a plan side by side submit to one cluster (dmlstudy.study.plan, ``concurrent_entries``): a run
    both ask for trains once, and the short grid's waiting tasks go before the long one's, whichever came first
    (Dask's own order favours neither: it depends on submission times)."""
    from distributed import Client

    cluster, first = engine.start_local_cluster(1, threads=1)
    second = Client(cluster.scheduler_address, set_as_default=False)

    def grids_side_by_side(folder, earlier, later):
        """``earlier`` from one client, its first task held until ``later`` (from the other) reached the
        scheduler; the order in which the tasks started, and each grid's results."""
        folder.mkdir()
        log, gate = folder / "log", folder / "gate"

        def task(name: str) -> str:
            with open(log, "a") as handle:
                handle.write(name + "\n")
            while name == earlier[0] and not gate.exists():
                time.sleep(0.02)
            return name

        token, results = time.time_ns(), {}

        def submit(client, names, label):
            grid = [(name, task, (name,), f"{name}-{token}") for name in names]
            results[label] = engine.run_tasks(client, grid, what=label, progress=False)

        threads = [
            threading.Thread(target=submit, args=(first, earlier, "earlier")),
            threading.Thread(target=submit, args=(second, later, "later")),
        ]
        threads[0].start()
        deadline = time.monotonic() + 60
        while not (log.exists() and earlier[0] in log.read_text()):
            assert time.monotonic() < deadline, "the first grid's first task never started"
            time.sleep(0.02)
        threads[1].start()
        while not first.run_on_scheduler(lambda dask_scheduler: f"{later[0]}-{token}" in dask_scheduler.tasks):
            assert time.monotonic() < deadline, "the second grid never reached the scheduler"
            time.sleep(0.02)
        gate.write_text("")
        for thread in threads:
            thread.join(timeout=120)
        return log.read_text().split(), results

    long_grid = [f"long{i}" for i in range(5)]
    try:
        order, results = grids_side_by_side(tmp_path / "long-first", [*long_grid, "shared"], ["short0", "shared"])
        assert results["earlier"]["shared"] == results["later"]["shared"] == "shared"
        assert order.count("shared") == 1 and sorted(order) == sorted([*long_grid, "short0", "shared"])
        assert order[:2] == ["long0", "short0"], order
        order, _ = grids_side_by_side(tmp_path / "short-first", ["short0", "short1"], long_grid)
        assert order[:2] == ["short0", "short1"], order
    finally:
        second.close()
        first.close()
        cluster.close()


def test_the_slurm_example_books_one_run_per_worker_and_a_gpu_per_job():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "slurm_cluster.py"
    spec = importlib.util.spec_from_file_location("slurm_cluster", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cluster = module.slurm_cluster(scheduler_options={"dashboard_address": ":0"})
    try:
        script = cluster.job_script()
    finally:
        cluster.close()
    assert "#SBATCH --gres=gpu:1" in script and "#SBATCH --cpus-per-task=8" in script
    assert "--nthreads 1 " in script  # one Dask thread: one run at a time per worker
    assert "export DMLSTUDY_TASK_THREADS=8" in script
