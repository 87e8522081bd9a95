"""The execution of a study plan (:mod:`dmlstudy.study.plan`): every entry not up to date through papermill, in its
run folder, up to ``concurrent_entries`` at once on one shared cluster, stopped cleanly by a signal.

What a plan shows: one line per entry (:func:`entry_line`: ``[2/8] crt  notebooks/10_crt.ipynb  5 seeds × 2
datasets  started``, then ``done in 43 min``) above one bar over the plan's runs, ended / known so far, with the
time left, and after a stop the line that says what was kept (:mod:`dmlstudy.study.progress`).

Ctrl-C (SIGINT) or SIGTERM stops a plan cleanly (:class:`_PlanInterrupts`): the kernels are interrupted as
Jupyter interrupts them, their grids' tasks stop at the next training step keeping the last epoch's
checkpoint, the running entries are recorded as ``interrupted``, the kernels and the plan's cluster shut down,
and one line says what was kept (finished runs and notebooks) and that the same command resumes; the exit
status is 130 (143 for SIGTERM, :class:`dmlstudy.run.guard.RunInterrupted`). A second signal kills the kernels.

Entries at once: ``concurrent_entries: N`` (plan level, default 1) executes up to N entries side by side, in
plan order, and first starts one local cluster of the entries' largest ``workers`` that every notebook's
kernel attaches to (``DMLSTUDY_SCHEDULER``, unless that already names a cluster): one pool of runs for the
whole plan, so the workers that one notebook leaves idle while it waits for its last run, or while it draws
its figures, train another notebook's runs. A run two notebooks ask for is one task (runs are keyed by their
folder) and trains once; a task whose run a notebook trains in its own kernel (``01_train``) waits for it
(:func:`dmlstudy.study.engine.train_task`), but that kernel fails on a run a worker is already writing, so such an
entry goes first or after the others. Smaller grids go first (:func:`dmlstudy.study.engine.run_tasks`), so a
notebook's short ablation grids are not queued behind another's hundred runs. An entry with
``after_earlier: true`` starts only when every entry before it has ended (one that reads all of the study's
runs). Each entry's ``seconds`` then overlap: the plan's wall time is what ``make study`` prints.

"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dmlstudy.paths import project_root, runs_root
from dmlstudy.records import write_json
from dmlstudy.run.guard import RunInterrupted
from dmlstudy.run.identity import LEDGER_NAME, LEDGER_VARIABLE, copy_finished_runs, is_complete
from dmlstudy.study import engine
from dmlstudy.study.plan import (
    PlanEntry,
    concurrent_entries,
    entry_inputs,
    entry_line,
    entry_setting,
    injected_parameters,
    is_up_to_date,
    notebook_parameters,
    plan_entries,
    read_plan,
    reused_study,
)
from dmlstudy.study.progress import PlanProgress, duration_text, resume_command, run_records, stop_line


@dataclass
class EntryOutcome:
    entry: PlanEntry
    status: str  # complete, skipped, failed or interrupted
    seconds: float = 0.0
    error: str = ""


def kernel_config():
    """Kernel-manager settings of every notebook the runner executes: CurveZMQ transport encryption.

    Each notebook's kernel (ipykernel's ``IPKernelApp.init_sockets``) warns "Kernel is running over TCP
    without encryption" when it listens on TCP without CurveZMQ keys. jupyter_client's ``KernelManager``
    provisions the keys with ``transport_encryption='auto'`` when the kernel spec lists ``curve`` in
    ``metadata.supported_encryption`` (ipykernel's ``python3`` spec does); the kernel then encrypts and has
    nothing to warn about. Chosen over ``transport='ipc'`` (Unix sockets: not on Windows, and socket paths
    have a length limit) and over a log filter (the warning is logged inside the kernel process, not ours).
    Without CurveZMQ support in pyzmq the setting is left at its default (and the warning stays).
    """
    import zmq
    from traitlets.config import Config

    return Config({"KernelManager": {"transport_encryption": "auto"}}) if zmq.has("curve") else Config()


def outcome_status(outcome: EntryOutcome) -> str:
    """How an entry ended, for :func:`entry_line`: ``done in 43 min``, ``failed after 2 min: cell 4: …``."""
    took = duration_text(outcome.seconds)
    return {
        "complete": f"done in {took}",
        "skipped": "skipped (up to date)",
        "interrupted": f"interrupted after {took}",
    }.get(outcome.status, f"{outcome.status} after {took}: {outcome.error}".rstrip(": "))


def run_plan(
    plan: str | Path,
    *,
    root: str | Path | None = None,
    only: str = "",
    kernel_name: str = "python3",
    progress: bool = True,
    overwrite: bool = False,
) -> list[EntryOutcome]:
    """Execute every entry of a plan with papermill (see the module docstring); returns one outcome per entry,
    in plan order. SIGINT/SIGTERM stop it with :class:`dmlstudy.run.guard.RunInterrupted` (:class:`_PlanInterrupts`)."""
    root = Path(root) if root else runs_root()
    outcomes: dict[int, EntryOutcome] = {}
    with _PlanInterrupts(plan, root) as interrupts:
        try:
            return _run_plan(
                Path(plan),
                root=root,
                only=only,
                kernel_name=kernel_name,
                progress=progress,
                overwrite=overwrite,
                interrupts=interrupts,
                outcomes=outcomes,
            )
        except RunInterrupted as interruption:
            raise interrupts.stopped(interruption.signum, outcomes.values()) from None


def _run_plan(
    plan: Path,
    *,
    root: Path,
    only: str,
    kernel_name: str,
    progress: bool,
    overwrite: bool,
    interrupts: _PlanInterrupts,
    outcomes: dict[int, EntryOutcome],
) -> list[EntryOutcome]:
    """:func:`run_plan`, filling ``outcomes`` (entry number → outcome) as entries end."""
    spec = read_plan(plan)
    entries = [e for e in plan_entries(spec, plan) if re.search(only, e.run_name)]
    concurrent = concurrent_entries(spec, plan)
    source = reused_study(spec, plan)
    if source and entries and not overwrite:
        copied = copy_finished_runs(root / source, root / entries[0].study)
        print(f"reuse_runs_of {source!r}: {len(copied)} finished run folders copied from {root / source}", flush=True)
    declared = {notebook: notebook_parameters(notebook) for notebook in {e.notebook for e in entries}}
    prepared = [
        (entry, injected_parameters(entry, declared[entry.notebook], root, overwrite=overwrite)) for entry in entries
    ]
    study_dir = interrupts.study_dir = root / (entries[0].study if entries else str(spec.get("study") or plan.stem))
    with (
        tempfile.TemporaryDirectory(prefix="dmlstudy-plan-") as scratch,
        PlanProgress(
            len(prepared), study_dir, events=Path(scratch) / "runs.jsonl", overwrite=overwrite, enabled=progress
        ) as shown,
    ):
        waiting = []
        for number, (entry, parameters) in enumerate(prepared, start=1):
            if not overwrite and is_up_to_date(entry.run_dir(root) / "study_entry.json", parameters, entry.notebook):
                outcomes[number] = EntryOutcome(entry, "skipped")
                shown.write(entry_line(number, len(prepared), entry, "skipped (up to date)", parameters=parameters))
                shown.done(started=False)
            else:
                waiting.append((number, entry, parameters))
        concurrent = min(concurrent, len(waiting))
        with _shared_cluster(waiting if concurrent > 1 else [], plan=plan, concurrent=concurrent) as environment:
            interrupts.entries_started()
            _execute_entries(
                waiting,
                root=root,
                concurrent=concurrent,
                kernel_name=kernel_name,
                environment={**environment, engine.RUN_EVENTS_VARIABLE: str(shown.events)},
                shown=shown,
                total=len(prepared),
                interrupts=interrupts,
                outcomes=outcomes,
            )
    ordered = [outcomes[number] for number in sorted(outcomes)]
    failures = [o for o in ordered if o.status == "failed"]
    print(
        f"plan {plan.name}: {sum(o.status == 'complete' for o in ordered)} ran, "
        f"{sum(o.status == 'skipped' for o in ordered)} skipped, {len(failures)} failed",
        flush=True,
    )
    for failure in failures:
        print(f"  FAILED {failure.entry.run_name} ({failure.entry.notebook.name}) — {failure.error}", flush=True)
    return ordered


def _execute_entries(
    waiting: list[tuple[int, PlanEntry, dict[str, Any]]],
    *,
    root: Path,
    concurrent: int,
    kernel_name: str,
    environment: dict[str, str],
    shown: PlanProgress,
    total: int,
    interrupts: _PlanInterrupts,
    outcomes: dict[int, EntryOutcome],
) -> None:
    """Execute ``waiting`` in order, up to ``concurrent`` at once (an ``after_earlier`` entry waits until none
    runs), each outcome into ``outcomes``; raises :class:`dmlstudy.run.guard.RunInterrupted` once the running ones
    have ended after a signal."""
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    running: dict[Any, tuple[int, PlanEntry]] = {}
    pending = list(waiting)
    cells = shown.cell_bar() if concurrent == 1 else False
    with ThreadPoolExecutor(max_workers=max(concurrent, 1), thread_name_prefix="plan-entry") as pool:
        while (pending and not interrupts.received) or running:
            while pending and len(running) < concurrent and not interrupts.received:
                number, entry, parameters = pending[0]
                if entry.after_earlier and running:
                    break
                pending.pop(0)
                shown.write(entry_line(number, total, entry, "started", parameters=parameters))
                shown.start()
                future = pool.submit(
                    _execute_entry,
                    entry,
                    parameters,
                    root,
                    kernel=(kernel_name, environment),
                    cells=cells,
                    interrupts=interrupts,
                )
                running[future] = (number, entry)
            finished, _ = wait(running, timeout=1.0, return_when=FIRST_COMPLETED)
            for future in finished:
                number, entry = running.pop(future)
                outcome = outcomes[number] = future.result()
                if outcome.status != "interrupted":  # the plan's one closing line speaks for those
                    shown.write(entry_line(number, total, entry, outcome_status(outcome)))
                shown.done()
    if interrupts.received:
        raise RunInterrupted(interrupts.received[0], "")


def _execute_entry(
    entry: PlanEntry,
    parameters: dict[str, Any],
    root: Path,
    *,
    kernel: tuple[str, dict[str, str]],
    cells: dict[str, Any] | bool,
    interrupts: _PlanInterrupts,
) -> EntryOutcome:
    """One notebook through papermill (``kernel``: the kernel's name and the environment it starts with), its
    outcome written to its ``study_entry.json``. The kernel also gets :data:`dmlstudy.run.identity.LEDGER_VARIABLE`:
    the entry's ledger of the runs it reports, emptied first (:func:`dmlstudy.run.identity.superseded_runs`). Once the
    plan is interrupted no further cell starts (``on_cell_start``)."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    run_dir = entry.run_dir(root)
    run_dir.mkdir(parents=True, exist_ok=True)
    ledger = run_dir / LEDGER_NAME
    ledger.write_text("", encoding="utf-8")
    manager = _kernel_manager({**kernel[1], LEDGER_VARIABLE: str(ledger)}, interrupts)
    inputs = entry_inputs(parameters, entry.notebook)
    started = time.perf_counter()
    try:
        papermill.execute_notebook(
            str(entry.notebook),
            str(run_dir / entry.notebook.name),
            parameters=parameters,
            kernel_name=kernel[0],
            kernel_manager_class=manager,
            cwd=str(project_root()),
            progress_bar=cells,
            config=kernel_config(),
            on_cell_start=interrupts.refuse_cells,
        )
        outcome = EntryOutcome(entry, "complete", time.perf_counter() - started)
    except PapermillExecutionError as error:
        outcome = EntryOutcome(
            entry, "failed", time.perf_counter() - started, f"cell {error.exec_count}: {error.ename}: {error.evalue}"
        )
    except Exception as error:  # a kernel that died, a notebook that could not be read, …
        outcome = EntryOutcome(entry, "failed", time.perf_counter() - started, f"{type(error).__name__}: {error}")
    if interrupts.received and outcome.status != "complete":  # one that ended before the signal stays complete
        signal_name = signal.Signals(interrupts.received[0]).name
        outcome = EntryOutcome(entry, "interrupted", outcome.seconds, f"interrupted by {signal_name}")
    write_json(
        run_dir / "study_entry.json",
        {
            "status": outcome.status,
            "notebook": str(entry.notebook),
            "parameters": parameters,
            "inputs": inputs,
            "seconds": outcome.seconds,
            "error": outcome.error,
        },
    )
    return outcome


@contextlib.contextmanager
def _shared_cluster(
    waiting: list[tuple[int, PlanEntry, dict[str, Any]]], *, plan: Path, concurrent: int
) -> Iterator[dict[str, str]]:
    """The environment the plan's kernels start with: this process's, as it was before the plan. For entries
    that execute side by side, plus ``DMLSTUDY_SCHEDULER`` naming one local cluster of their largest
    ``workers`` (the engine's :func:`~dmlstudy.study.engine.start_local_cluster`, whose workers ignore a terminal's
    Ctrl-C), closed at the end; no cluster when ``waiting`` is empty or ``DMLSTUDY_SCHEDULER`` already names one.

    The kernels get that environment explicitly (:func:`_kernel_manager`), not this process's ``os.environ``:
    each Dask nanny sets ``OMP_NUM_THREADS=1`` (and MKL's, OpenBLAS's) in the process that holds it whenever it
    (re)starts its worker, which would give kernels started after it one thread. ``os.environ`` is restored
    when the plan ends. Closing the cluster is quiet: after an interrupt its nannies kill workers whose
    cancelled task has not yet stopped, and say so."""
    environment = dict(os.environ)
    if not waiting or engine.scheduler_address():
        yield environment
        return
    workers = max(int(entry_setting(parameters, "workers", 1) or 1) for _, _, parameters in waiting)
    threads = int(os.environ.get(engine.THREADS_VARIABLE) or 0) or None
    cluster, client = engine.start_local_cluster(workers, threads=threads)
    print(
        f"plan {plan.name}: {len(waiting)} notebooks, up to {concurrent} at once, share one local cluster of "
        f"{workers} workers (dashboard {client.dashboard_link})",
        flush=True,
    )
    try:
        yield {**environment, engine.SCHEDULER_VARIABLE: cluster.scheduler_address}
    finally:
        dask_logs = logging.getLogger("distributed")
        level = dask_logs.level
        dask_logs.setLevel(logging.CRITICAL)
        with contextlib.suppress(Exception):  # closing must not hide what happened in the entries
            client.close()
            cluster.close()
        dask_logs.setLevel(level)
        for key in set(os.environ) - set(environment):
            del os.environ[key]
        os.environ.update(environment)


def _kernel_manager(environment: dict[str, str], interrupts: _PlanInterrupts) -> type:
    """A kernel manager class (nbclient's default, :class:`jupyter_client.AsyncKernelManager`) whose kernels
    start with ``environment`` and are known to ``interrupts`` while they live; none starts once the plan is
    interrupted."""
    from jupyter_client import AsyncKernelManager

    class PlanKernelManager(AsyncKernelManager):
        async def start_kernel(self, **kwargs: Any) -> None:
            if interrupts.received:
                raise RuntimeError("the plan was interrupted")
            kwargs.setdefault("env", dict(environment))
            await super().start_kernel(**kwargs)
            interrupts.kernels.add(self.provisioner.pid)

        async def shutdown_kernel(self, *args: Any, **kwargs: Any) -> None:
            if self.provisioner is not None:
                interrupts.kernels.discard(self.provisioner.pid)
            await super().shutdown_kernel(*args, **kwargs)

    return PlanKernelManager


class _PlanInterrupts:
    """SIGTERM/SIGINT while a plan runs (main thread only; handlers restored after).

    A terminal's Ctrl-C reaches every process of its foreground group: this one, and the workers of the plan's
    cluster, which ignore it (:func:`dmlstudy.study.engine.start_local_cluster`). Papermill starts each kernel in its
    own process group, out of reach. Before any entry starts, a signal stops the plan at once. Once entries run, the
    first signal interrupts each kernel as Jupyter does (SIGINT: the running cell raises KeyboardInterrupt,
    :func:`dmlstudy.study.engine.run_tasks` cancels its grid's tasks, which stop at their next training step with
    their last epoch's checkpoint kept, or :func:`dmlstudy.run.train.run` in the kernel keeps its own), no further
    cell or entry starts, each running entry is recorded as ``interrupted``, and the plan closes its cluster.
    A second signal kills the kernels (and their processes) and stops at once. Either way :meth:`stopped`
    prints one line, what was kept and how to resume, and the exit status is 128 + the signal (130, 143).
    Once a signal has come, the logs of papermill (a killed kernel's "Kernel died") and of this process's Dask
    nannies (a worker killed because its cancelled task did not stop in time) are silenced: the stop is the
    plan's own doing, and the one line says what came of it.
    """

    QUIET_LOGS = ("papermill", "distributed")

    def __init__(self, plan: str | Path, root: Path) -> None:
        self.plan, self.root = Path(plan), root
        self.received: list[int] = []
        self.study_dir: Path | None = None  # the plan's runs, once it is read
        self.kernels: set[int] = set()  # process ids of the plan's live kernels
        self._immediate = True  # no entry started yet: a signal stops the plan at once
        self._previous: dict[int, Any] = {}
        self._levels: dict[str, int] = {}

    def entries_started(self) -> None:
        """From now on the first signal interrupts the kernels and lets the entries end."""
        self._immediate = False
        if self.received:
            raise RunInterrupted(self.received[0], "")

    def refuse_cells(self, cell: Any = None, cell_index: int = 0) -> None:
        """nbclient's ``on_cell_start``: no cell starts once the plan is interrupted (a kernel that was just
        starting when the signal came, and so was not interrupted, executes nothing)."""
        if self.received:
            raise RuntimeError("the plan was interrupted")

    def stopped(self, signum: int, outcomes: Iterable[EntryOutcome]) -> RunInterrupted:
        """Print the one line that says what was kept and how to resume (:func:`stop_line`); the exception to
        exit with."""
        records = run_records(self.study_dir) if self.study_dir else {}
        message = stop_line(
            signal.Signals(signum).name,
            runs=sum(is_complete(self.study_dir / name) for name in records),
            notebooks=sum(outcome.status in ("complete", "skipped") for outcome in outcomes),
            command=resume_command(self.plan, self.root),
        )
        print(message, file=sys.stderr, flush=True)
        return RunInterrupted(signum, message)

    def _handler(self, signum, frame) -> None:
        import psutil

        self.received.append(signum)
        for name in self.QUIET_LOGS:
            logging.getLogger(name).setLevel(logging.CRITICAL)
        if self._immediate:
            raise RunInterrupted(signum, "")
        kernels = list(self.kernels)
        if len(self.received) == 1:
            for pid in kernels:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGINT)
            return
        for pid in kernels:
            with contextlib.suppress(psutil.Error):
                kernel = psutil.Process(pid)
                for process in [*kernel.children(recursive=True), kernel]:
                    with contextlib.suppress(psutil.Error):
                        process.kill()
        raise RunInterrupted(self.received[0], "")

    def __enter__(self) -> _PlanInterrupts:
        self._levels = {name: logging.getLogger(name).level for name in self.QUIET_LOGS}
        if threading.current_thread() is threading.main_thread():
            self._previous = {
                number: signal.signal(number, self._handler) for number in (signal.SIGTERM, signal.SIGINT)
            }
        return self

    def __exit__(self, *exc_info) -> None:
        for number, action in self._previous.items():
            signal.signal(number, action)
        for name, level in self._levels.items():
            logging.getLogger(name).setLevel(level)
