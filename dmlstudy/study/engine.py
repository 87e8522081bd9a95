"""The execution engine of every grid of runs, per-run evaluation sweep and tuning trial: Dask distributed.

One machine by default: a ``LocalCluster`` of ``workers`` processes (the study's ``workers`` setting), one
Dask thread each, so a worker trains one run at a time with ``cores // workers`` torch threads. On 2 cores
two 1-thread runs side by side beat one 2-thread run at a time (``benchmarks/README.md``). A cluster instead:
set ``DMLSTUDY_SCHEDULER=tcp://host:8786`` (``dmlstudy study run --scheduler``) and the same code submits to
that scheduler's workers; the runs root and data root must then be paths every worker sees (a shared
filesystem).

Decisions:

* Runs are tasks keyed by their run folder (:func:`run_task_key`). A task first checks whether the run is
  complete and returns at once if so; otherwise ``train.run(config)`` with ``resume=True`` continues from the
  run's last checkpoint. A worker that dies mid-run (killed, out of memory, node lost) is replaced by its
  nanny and the scheduler reschedules the task (up to ``distributed.scheduler.allowed-failures`` times), which
  then resumes from the checkpoint: at most the unfinished epoch is lost. ``retries`` re-runs tasks that
  *raised*; it is 0 by default because a run that raises (bad config, NaN loss) raises again.
* Stopping: a running task cannot be interrupted from outside its thread, so a cancelled training task
  stops itself at its next training step (:func:`stop_tasks`, :func:`dmlstudy.run.guard.stop_when`) with its
  last epoch checkpoint kept; restarting the worker (its nanny lets a busy worker finish for 4 s before
  killing it) is only the fallback for a task that does not stop within ``STOP_SECONDS``.
* Workers live across tasks, so every task starts from the same state (:func:`task_state`): torch and faiss
  thread counts set, the worker's device chosen, and ``train.run`` seeds everything itself.
* Progress: a plan that executes notebooks side by side learns about their runs from a small ledger: the study
  runner names a file in ``DMLSTUDY_RUN_EVENTS`` for every notebook kernel it starts, and :func:`run_tasks`
  appends one JSON line per training task the kernel submits (run folder, epochs) and per one that failed
  (:func:`note_run_event`); the runner reads the file and the run folders (:mod:`dmlstudy.study.progress`).
* Ctrl-C: the worker processes of a local cluster ignore SIGINT (:func:`start_local_cluster`), so a terminal's
  Ctrl-C, which reaches every process of the foreground group, stops the process that owns the cluster
  (which cancels its tasks and closes the cluster) instead of killing the workers mid-step.
* GPUs: worker ``i`` of a local cluster on a machine with ``g`` GPUs trains on ``cuda:(i mod g)``
  (:func:`device_for_worker`), so ``workers = k·g`` puts ``k`` runs on each GPU. The device reaches
  ``compute.resolve_device("auto")`` through the ``DMLSTUDY_DEVICE`` environment variable, which a worker
  started by hand may also set (``DMLSTUDY_DEVICE=cuda:1 dask worker ...``).
"""

from __future__ import annotations

import atexit
import json
import os
import re
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

SCHEDULER_VARIABLE = "DMLSTUDY_SCHEDULER"  # address of an existing scheduler: attach instead of starting one
DEVICE_VARIABLE = "DMLSTUDY_DEVICE"  # the device resolve_device("auto") picks on a worker
THREADS_VARIABLE = "DMLSTUDY_TASK_THREADS"  # torch/faiss threads of each task on a worker
RUN_EVENTS_VARIABLE = "DMLSTUDY_RUN_EVENTS"  # a file the study runner reads: the runs this process submits
CONNECT_SECONDS = 5  # how long to try an address before reporting it unreachable
STOP_SECONDS = 60  # how long a cancelled task may take to reach its next training step before its worker restarts
LOST_SECONDS = 60  # how long a grid waits on a local cluster with no worker left before it gives up
# Dask's statistical profiler samples every running task's stack every 10 ms: CPU taken from the training
# (benchmarks/README.md, "Execution engine"); the dashboard's profile tab stays empty without it.
QUIET_WORKER = {"DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False"}


class EngineError(RuntimeError):
    """The engine could not start or reach its scheduler."""


class GridRunError(RuntimeError):
    """One or more tasks of a grid failed; the others finished and were kept."""


def available_cores() -> int:
    """Cores this process may use (its CPU affinity; a Slurm or container limit counts)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_for_worker(index: int, gpus: int) -> str:
    """The device of local worker ``index`` when the machine has ``gpus`` GPUs: round-robin over the GPUs
    (``k·gpus`` workers put ``k`` runs on each GPU), ``cpu`` without GPUs."""
    if index < 0:
        raise ValueError(f"worker index must be ≥ 0, got {index}")
    return f"cuda:{index % gpus}" if gpus > 0 else "cpu"


def threads_per_task(workers: int, cores: int) -> int:
    """torch threads of each of ``workers`` runs sharing ``cores`` cores (at least one)."""
    return max(1, cores // max(1, workers))


@dataclass(frozen=True)
class WorkerPlan:
    """What one worker process of a local cluster gets."""

    name: int
    device: str
    threads: int


def local_worker_plans(workers: int, *, cores: int, gpus: int) -> list[WorkerPlan]:
    """Devices and thread counts of the ``workers`` processes of a local cluster."""
    if workers < 1:
        raise ValueError(f"workers must be ≥ 1, got {workers}")
    threads = threads_per_task(workers, cores)
    return [WorkerPlan(name=index, device=device_for_worker(index, gpus), threads=threads) for index in range(workers)]


# ----------------------------------------------------------------------------------------------
# the client: a local cluster, or an existing scheduler


_engine: dict[str, Any] = {}  # the one client of this process: {"client", "cluster", "key"}


def scheduler_address() -> str:
    """The address in ``DMLSTUDY_SCHEDULER`` ('' when unset: start a local cluster)."""
    return os.environ.get(SCHEDULER_VARIABLE, "").strip()


def connect(address: str, *, timeout: float = CONNECT_SECONDS):
    """A client of the scheduler at ``address``; an unreachable address fails within ``timeout`` seconds."""
    from distributed import Client

    try:
        return Client(address, timeout=f"{timeout}s", set_as_default=False)
    except (OSError, TimeoutError, ValueError) as error:
        raise EngineError(
            f"cannot reach the Dask scheduler at {address!r} (from {SCHEDULER_VARIABLE} or --scheduler) within "
            f"{timeout:g} s: {type(error).__name__}: {error}. Start one with `dask scheduler` (see docs/scaling.md) "
            f"or unset {SCHEDULER_VARIABLE} to train on a local cluster."
        ) from None


def start_local_cluster(
    workers: int, *, threads: int | None = None, gpus: int | None = None, dashboard_address: str = ":0"
):
    """A ``LocalCluster`` of ``workers`` processes with one Dask thread each, and its client. Each worker's
    device and torch thread count (:func:`local_worker_plans`) are set through its environment.

    The workers start without Dask's default ``MALLOC_TRIM_THRESHOLD_=65536``: an explicit trim threshold
    turns off glibc's dynamic mmap threshold, so every tensor over 128 KiB is mmap-ed and unmapped again;
    a training run in such a worker took 1.7× the wall time of the same run in a plain process
    (``benchmarks/bench_engine.py``). Runs hold no Dask data, so trimming buys nothing here.

    The worker processes start with SIGINT ignored (:func:`sigint_ignored`), so a Ctrl-C reaches only the
    process that owns the cluster. A worker its nanny restarts later (after a crash) starts without that."""
    import dask
    from distributed import Client, LocalCluster

    plans = local_worker_plans(workers, cores=available_cores(), gpus=gpu_count() if gpus is None else gpus)
    if threads:
        plans = [WorkerPlan(plan.name, plan.device, threads) for plan in plans]
    settings = {"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}
    with dask.config.set(settings), sigint_ignored():
        cluster = LocalCluster(
            n_workers=0, threads_per_worker=1, processes=True, dashboard_address=dashboard_address, memory_limit=0
        )  # runs hold no Dask data: no memory-based pausing; the OS decides
        template = cluster.new_spec
        for plan in plans:  # one spec per worker: the template with this worker's environment
            environment = {DEVICE_VARIABLE: plan.device, THREADS_VARIABLE: str(plan.threads), **QUIET_WORKER}
            options = {**template["options"], "env": environment, "name": plan.name}
            cluster.worker_spec[plan.name] = {"cls": template["cls"], "options": options}
        cluster.scale(len(plans))
        client = Client(cluster, set_as_default=False)
        client.wait_for_workers(len(plans), timeout=120)
    return cluster, client


@contextmanager
def sigint_ignored() -> Iterator[None]:
    """SIGINT ignored in this process within the block (main thread only; elsewhere nothing changes). A
    process started meanwhile inherits the ignored disposition across ``exec``, and Python (and asyncio) then
    install no KeyboardInterrupt handler in it: that is how the local cluster's workers come to ignore a
    terminal's Ctrl-C. A Ctrl-C within the block itself is lost (the seconds a cluster takes to start)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def get_client(workers: int = 1):
    """The engine's client: attached to ``DMLSTUDY_SCHEDULER`` when set, else a local cluster of ``workers``
    processes, started once per process (again when ``workers`` changes). ``DMLSTUDY_TASK_THREADS`` overrides
    the local workers' ``cores // workers`` torch threads. Prints the dashboard address when it starts or
    attaches."""
    address = scheduler_address()
    threads = int(os.environ.get(THREADS_VARIABLE) or 0)
    key = ("remote", address) if address else ("local", workers, threads)
    if _engine.get("key") == key and _engine["client"].status == "running":
        alive = workers if address or _engine["cluster"] is None else _worker_count(_engine["client"])
        if alive == workers:
            return _engine["client"]
        print(f"dmlstudy engine: the local cluster has lost workers ({alive} of {workers}); starting a new one")
    if address:
        client = connect(address)  # before closing the current cluster: an unreachable address changes nothing
        shutdown()
        cluster = None
        print(
            f"dmlstudy engine: scheduler {address}, {_worker_count(client)} workers, dashboard {client.dashboard_link}"
        )
    else:
        shutdown()
        cluster, client = start_local_cluster(workers, threads=threads)
        print(f"dmlstudy engine: local cluster of {workers} worker processes, dashboard {client.dashboard_link}")
    _engine.update(client=client, cluster=cluster, key=key)
    return client


def _worker_count(client) -> int:
    try:
        return len(client.scheduler_info().get("workers", {}))
    except Exception:  # a scheduler that no longer answers has no workers for us
        return 0


def shutdown() -> None:
    """Close the engine's client (and its local cluster)."""
    client, cluster = _engine.pop("client", None), _engine.pop("cluster", None)
    _engine.clear()
    for thing in (client, cluster):
        if thing is not None:
            with suppress(Exception):  # closing at exit must not raise
                thing.close()


atexit.register(shutdown)


# ----------------------------------------------------------------------------------------------
# tasks


@contextmanager
def task_state() -> Iterator[None]:
    """The state every task starts from on a long-lived worker: thread counts of torch and faiss from
    ``DMLSTUDY_TASK_THREADS`` (else all of the worker's cores; under the pinned numerics always one,
    :mod:`dmlstudy.numerics`) and the worker's device for ``resolve_device("auto")``. (Seeds are set by ``train.run`` itself, per run and per epoch.)"""
    import faiss
    import torch

    from dmlstudy import numerics

    threads = int(os.environ.get(THREADS_VARIABLE) or available_cores())
    torch.set_num_threads(threads)
    faiss.omp_set_num_threads(threads)
    numerics.pin_process()  # under the pinned numerics, one thread whatever the worker has
    yield


def run_task_key(config) -> str:
    """The Dask key of a run's training task (a TrainConfig): the same run folder gives the same key."""
    from dask.base import tokenize

    run_dir = config.run_dir.resolve()
    return f"train-{run_dir.name}-{tokenize(str(run_dir))}"


def task_values(config) -> dict[str, Any]:
    """A TrainConfig's fields for :func:`train_task`, with the runs and data roots as absolute paths (the
    worker may run elsewhere: on a cluster both must be on a filesystem every worker sees)."""
    from pathlib import Path

    from dmlstudy.paths import data_root

    return {
        **config.to_dict(),
        "runs_root": str(config.run_dir.parent.parent.resolve()),
        "data_root": str(Path(config.data_root or data_root()).resolve()),
        "progress": False,
    }


def train_task(values: dict[str, Any], origins: dict[str, str] | None = None) -> dict[str, float]:
    """Train (or resume, or just load the metrics of) the run of TrainConfig ``values``: idempotent. ``origins``
    (where each value came from, :func:`dmlstudy.run.identity.with_origins`) go to the run's ``config.yaml``.

    The run resumes, so a run folder that a live process outside the engine is writing (a notebook of the same
    plan training that run itself) is waited for and then loaded or continued (:mod:`dmlstudy.run.identity`, "One
    writer"); a cancelled task stops waiting. (A dead writer's lock is free at once: the OS drops it with the
    process.)"""
    import json

    from dmlstudy.run import guard, identity
    from dmlstudy.run.train import TrainConfig, is_complete, run

    config = identity.with_origins(TrainConfig(**{**values, "resume": True, "progress": False}), origins or {})
    if is_complete(config):
        return json.loads((config.run_dir / "metrics.json").read_text())
    with task_state(), guard.stop_when(_cancelled_test()):
        return run(config).metrics


def _cancelled_test() -> Callable[[], bool]:
    """In a Dask task: whether the worker has since been told to drop it (its future cancelled). The same key
    submitted again while the task still runs puts it back to executing: the run then goes on, as wanted.
    Outside a worker (a direct call): never."""
    from distributed import get_worker
    from distributed.worker import thread_state

    try:
        worker, key = get_worker(), thread_state.key
    except (ValueError, AttributeError):
        return lambda: False

    def cancelled() -> bool:
        task = worker.state.tasks.get(key)
        return task is None or task.state not in ("executing", "long-running")

    return cancelled


def call_task(function: Callable[..., Any], *args: Any) -> Any:
    with task_state():
        return function(*args)


def note_run_event(event: str, run: str, **fields: Any) -> None:
    """Append ``{"event", "run", **fields}`` as one JSON line to the file :data:`RUN_EVENTS_VARIABLE` names, if
    any (the study runner's ledger of the runs its notebooks submit). One short line per write, appended, so
    the kernels of a plan can share one file."""
    path = os.environ.get(RUN_EVENTS_VARIABLE)
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"event": event, "run": run, **fields}) + "\n")


def _run_folder(function: Callable[..., Any], args: tuple) -> str:
    """The run folder's name of a :func:`train_task` submission ('' for any other task)."""
    if function is not train_task:
        return ""
    from dmlstudy.run.train import TrainConfig

    return TrainConfig(**args[0]).run_dir.name


def failure_line(future) -> str:
    """The last line of a failed future's traceback: ``Type: message``."""
    error = future.exception()
    return traceback.format_exception_only(type(error), error)[-1].strip()


def run_tasks(
    client,
    submissions: Sequence[tuple[str, Callable[..., Any], tuple, str]],
    *,
    what: str,
    progress: bool = True,
    retries: int = 0,
    workers: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Submit ``(label, function, args, key)`` tasks (on the given worker addresses only, if any), follow them
    with one tqdm bar (done / running / failed in its postfix), and return ``{label: result}``. Every task runs
    to its end; failures are raised together afterwards as a :class:`GridRunError` naming each failed label
    with its traceback's last line. A grid's tasks have priority ``−len(submissions)``: when several grids
    share a cluster (notebooks of one plan side by side, :mod:`dmlstudy.study.plan`), the smaller grid's tasks go
    first, so a notebook's next short grid is not queued behind another's hundred runs. Each training task
    (:func:`train_task`) is noted in the study runner's ledger when submitted and when failed
    (:func:`note_run_event`)."""
    from distributed import as_completed

    from dmlstudy.progress_bars import transient_bar

    futures, runs = {}, {}
    noted = bool(os.environ.get(RUN_EVENTS_VARIABLE))
    for label, function, args, key in submissions:
        future = client.submit(
            function, *args, key=key, retries=retries, pure=False, workers=workers, priority=-len(submissions)
        )
        futures[future], runs[future] = label, _run_folder(function, args) if noted else ""
        if runs[future]:
            note_run_event("submitted", runs[future], epochs=int(args[0]["epochs"]))
    results, failures = {}, []
    bar = transient_bar(total=len(futures), desc=what, disable=not progress)
    completed = as_completed(list(futures), loop=client.loop)
    watched = _engine.get("client") is client and _engine.get("cluster") is not None  # a local cluster of ours
    watch: dict[str, float] = {}
    try:
        while not completed.is_empty():
            if not completed.has_ready():
                if watched:
                    _check_workers_left(client, watch, what=what, left=len(futures))
                time.sleep(0.1)
                continue
            for future in completed.next_batch(block=False):
                label = futures.pop(future)
                if future.status == "finished":
                    results[label] = future.result()
                else:
                    failures.append(f"{label} failed: {failure_line(future)}")
                    if runs[future]:
                        note_run_event("failed", runs[future])
                future.release()  # nothing on a worker holds results: a lost worker never forces recomputation
                bar.set_postfix(
                    done=len(results), running=_running(client, futures), failed=len(failures), refresh=False
                )
                bar.update()
    finally:
        bar.close()
        stop_tasks(client, futures)  # interrupted: nothing of this grid goes on training behind the caller's back
    if failures:
        raise GridRunError(
            f"{len(failures)} of {len(submissions)} {what} failed (finished ones are kept):\n" + "\n".join(failures)
        )
    return results


def _check_workers_left(client, watch: dict[str, float], *, what: str, left: int) -> None:
    """Raise :class:`EngineError` once the engine's local cluster has had no worker for :data:`LOST_SECONDS`
    (a nanny restarts a dead worker within seconds; both gone is a cluster that will not come back). ``watch``
    holds when this grid last saw a worker and last looked; the scheduler is asked at most once a second."""
    now = time.monotonic()
    if now - watch.get("looked", float("-inf")) < 1.0:
        return
    watch["looked"] = now
    if "seen" not in watch or _worker_count(client):
        watch["seen"] = now
    elif now - watch["seen"] > LOST_SECONDS:
        raise EngineError(
            f"the local cluster has had no worker for {LOST_SECONDS} s with {left} {what} unfinished (its worker "
            "processes exited); finished ones are kept: run the same command again to resume on a new cluster"
        )


def stop_tasks(client, futures, *, timeout: float = STOP_SECONDS, poll_seconds: float = 0.05) -> None:
    """Cancel ``futures`` and return once no worker executes one of them any more. A training task that was
    running sees its cancellation at its next training step (:func:`train_task` runs under
    :func:`dmlstudy.run.guard.stop_when`), keeps its last epoch checkpoint and releases its run folder, so the
    same Dask client can submit the run again (it resumes). A task still executing after ``timeout`` seconds
    (one that does not check, a step that hangs) has its worker restarted by its nanny."""
    keys = {future.key for future in futures}
    if not keys:
        return
    for future in futures:
        future.cancel()
    deadline, quiet = time.monotonic() + timeout, 0
    while quiet < 2:  # twice: a task sent to a worker just before its cancellation shows up on the second look
        time.sleep(poll_seconds)
        busy = [address for address, found in client.run(_executing, keys, on_error="ignore").items() if found]
        quiet = 0 if busy else quiet + 1
        if busy and time.monotonic() > deadline:
            client.restart_workers(busy, raise_for_error=False)  # a slow restart must not hide the interruption
            return


def _executing(keys: set[str], dask_worker=None) -> list[str]:
    """On a worker: which of ``keys`` its threads are executing (cancelled ones included until they return)."""
    return [task.key for task in dask_worker.state.executing if task.key in keys]


def _running(client, futures) -> int:
    keys = {future.key for future in futures}
    return sum(len(keys.intersection(processing)) for processing in client.processing().values())


_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def call_key(function: Callable[..., Any], args: tuple, index: int) -> str:
    from dask.base import tokenize

    return f"{_SAFE.sub('-', getattr(function, '__name__', 'call'))}-{index}-{tokenize(function, *args)}"
