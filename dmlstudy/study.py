"""Study plans: parameterized notebooks executed by papermill, and the tables gathered from their runs.

A plan (``plans/*.yaml``)::

    study: default                  # runs go to runs/<study>/
    entries:
      - name: baseline              # entry name; grid values are appended to it
        notebook: notebooks/01_train.ipynb
        parameters: {method: ms, epochs: 8}
        grid: {dataset: [synbirds, glyphs], seed: [0, 1, 2]}   # every combination is one run

Each expanded entry is executed in ``runs/<study>/<run_name>/`` (the executed notebook is written beside
the run's records; ``study`` and ``run_name`` are injected when the notebook has those parameters). An
entry whose ``study_entry.json`` says ``complete`` with the same parameters, tuned-values files and
checkpoint-selection rule (:func:`entry_inputs`: after ``make tune`` the entries that train with them run again,
after a new rule every entry) is skipped, so re-running a plan resumes where it stopped; a failing notebook is
recorded and the plan continues; the failures are listed at the end with the cell that failed.

A plan may start from another study's runs: ``reuse_runs_of: default`` copies every finished run folder of
``runs/default/`` that ``runs/<study>/`` lacks before the first entry (:func:`dmlstudy.runs.copy_finished_runs`),
so a plan that adds seeds to the default study trains only the new ones. A run folder's name carries its
identity hash and ``study`` is not part of the identity, so a copied folder is loaded only by a run of the
same configuration; with ``--overwrite`` nothing is copied.

Plans resume by default: ``resume=True`` is injected into every notebook that declares ``resume`` (unless
the entry sets it), so an entry whose notebook was stopped continues its interrupted runs, and runs that
finished are loaded, never retrained. ``overwrite`` (``dmlstudy study run --overwrite``) executes every
entry again and injects ``overwrite=True`` where declared: the only way a plan replaces finished records.
SIGTERM/SIGINT stop the plan after recording the current entry as ``interrupted``, print how to resume,
and exit 143/130 (:class:`dmlstudy.runs.RunInterrupted`). Plans are read with
:func:`dmlstudy.config.load_yaml` (``lr: 1e-3`` is a float).

Entries at once: ``concurrent_entries: N`` (plan level, default 1) executes up to N entries side by side, in
plan order, and first starts one local cluster of the entries' largest ``workers`` that every notebook's
kernel attaches to (``DMLSTUDY_SCHEDULER``, unless that already names a cluster): one pool of runs for the
whole plan, so the workers that one notebook leaves idle while it waits for its last run, or while it draws
its figures, train another notebook's runs. A run two notebooks ask for is one task (runs are keyed by their
folder) and trains once; a task whose run a notebook trains in its own kernel (``01_train``) waits for it
(:func:`dmlstudy.engine.train_task`), but that kernel fails on a run a worker is already writing, so such an
entry goes first or after the others. Smaller grids go first (:func:`dmlstudy.engine.run_tasks`), so a
notebook's short ablation grids are not queued behind another's hundred runs. An entry with
``after_earlier: true`` starts only when every entry before it has ended (one that reads all of the study's
runs). Each entry's ``seconds`` then overlap: the plan's wall time is what ``make study`` prints.

``study table`` groups runs by configuration: the ``--by`` columns plus every configuration field that
varies among the gathered runs (:func:`configuration_columns`), so runs of different settings are never
averaged together as if they were seeds. Each entry's kernel notes the runs it reports in the entry's
``runs.txt``; a run folder that no entry reported, beside one of the same run name that one did (the run
under older tuned values), is left out and named (:func:`dmlstudy.runs.superseded_runs`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from dmlstudy.config import load_yaml
from dmlstudy.paths import project_root, runs_root
from dmlstudy.records import write_json
from dmlstudy.runs import LEDGER_NAME, LEDGER_VARIABLE, SELECTION_RULE, copy_finished_runs, superseded_runs


class PlanError(ValueError):
    """A plan file is malformed; the message names the file and the entry."""


@dataclass(frozen=True)
class PlanEntry:
    """One notebook execution: the notebook, its parameters and where its run lives."""

    study: str
    run_name: str
    notebook: Path
    parameters: dict[str, Any] = field(default_factory=dict)
    after_earlier: bool = False  # start only once every earlier entry of the plan has ended

    def run_dir(self, root: Path) -> Path:
        return root / self.study / self.run_name


def _slug(value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value)
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "_", text).strip("_")


def _read_plan(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise PlanError(f"plan file not found: {path}")
    try:
        plan = load_yaml(path.read_text()) or {}
    except Exception as error:  # yaml.YAMLError: the message holds the line and column
        raise PlanError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(plan, dict) or not isinstance(plan.get("entries"), list):
        raise PlanError(f"{path}: expected a mapping with 'study' and a list of 'entries'")
    return plan


def _reused_study(plan: dict[str, Any], path: Path) -> str:
    """The plan's ``reuse_runs_of``: another study whose finished run folders this one starts from ('' if none)."""
    value = plan.get("reuse_runs_of") or ""
    if not isinstance(value, str) or "/" in value or value == str(plan.get("study") or path.stem):
        raise PlanError(f"{path}: 'reuse_runs_of' must name another study (a folder of runs/), got {value!r}")
    return value


def _concurrent_entries(plan: dict[str, Any], path: Path) -> int:
    """The plan's ``concurrent_entries``: how many entries execute side by side (default 1)."""
    value = plan.get("concurrent_entries", 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"{path}: 'concurrent_entries' must be an integer ≥ 1, got {value!r}")
    return value


def load_plan(path: str | Path) -> list[PlanEntry]:
    """Read a plan file and expand every entry's grid into :class:`PlanEntry` objects."""
    path = Path(path)
    return _plan_entries(_read_plan(path), path)


def _plan_entries(plan: dict[str, Any], path: Path) -> list[PlanEntry]:
    study = str(plan.get("study") or path.stem)
    base = project_root()
    entries: list[PlanEntry] = []
    for number, entry in enumerate(plan["entries"], start=1):
        if not isinstance(entry, dict) or "notebook" not in entry or "name" not in entry:
            raise PlanError(f"{path}: entry {number} needs 'name' and 'notebook', got {entry!r}")
        for key in ("parameters", "grid"):
            if not isinstance(entry.get(key) or {}, dict):
                raise PlanError(f"{path}: entry {entry['name']!r}: '{key}' must be a mapping, got {entry[key]!r}")
        after_earlier = entry.get("after_earlier", False)
        if not isinstance(after_earlier, bool):
            raise PlanError(
                f"{path}: entry {entry['name']!r}: 'after_earlier' must be true or false, got {after_earlier!r}"
            )
        notebook = Path(entry["notebook"])
        notebook = notebook if notebook.is_absolute() else base / notebook
        if not notebook.is_file():
            raise PlanError(f"{path}: entry {entry['name']!r}: notebook not found: {notebook}")
        grid = entry.get("grid") or {}
        keys = list(grid)
        for values in itertools.product(*(grid[key] if isinstance(grid[key], list) else [grid[key]] for key in keys)):
            combination = dict(zip(keys, values))
            name = "-".join([entry["name"], *(f"{key}={_slug(value)}" for key, value in combination.items())])
            parameters = {**(entry.get("parameters") or {}), **combination}
            entries.append(PlanEntry(study, name, notebook, parameters, after_earlier))
    names = [e.run_name for e in entries]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise PlanError(f"{path}: run names repeat: {duplicates}; give the entries distinct names")
    return entries


def notebook_parameters(notebook: Path) -> dict[str, dict]:
    """The parameters a notebook declares in its ``parameters`` cell (papermill's inspection)."""
    import papermill

    return papermill.inspect_notebook(str(notebook))


def injected_parameters(
    entry: PlanEntry, declared: Iterable[str], root: Path, *, overwrite: bool = False
) -> dict[str, Any]:
    """The entry's parameters plus ``study``/``run_name``/``runs_root`` where the notebook declares them,
    ``resume=True`` (plans resume by default) and, when ``overwrite``, ``overwrite=True``."""
    declared = set(declared)
    unknown = sorted(set(entry.parameters) - declared)
    if unknown:
        raise PlanError(
            f"entry {entry.run_name!r}: {entry.notebook.name} has no parameters {unknown}; it declares {sorted(declared)}"
        )
    extra = {"study": entry.study, "run_name": entry.run_name, "runs_root": str(root), "resume": True}
    forced = {"overwrite": True} if overwrite and "overwrite" in declared else {}
    return {**{k: v for k, v in extra.items() if k in declared}, **entry.parameters, **forced}


@dataclass
class EntryOutcome:
    entry: PlanEntry
    status: str  # complete, skipped, failed or interrupted
    seconds: float = 0.0
    error: str = ""


def entry_inputs(parameters: dict[str, Any]) -> dict[str, str]:
    """What an entry reads besides its parameters and its runs: the revision of the checkpoint-selection rule
    (:data:`dmlstudy.runs.SELECTION_RULE`, so that the entries run again, and retrain the runs the new rule
    would choose differently, after it changes) and the tuned-values files under its ``tuned`` folder
    (``plans/tuned/**/*.yaml``, relative path → SHA-256), so that a plan re-executes an entry after ``make tune``
    has changed the values it trains with."""
    from dmlstudy.models.cards import sha256_file

    inputs = {"selection rule": SELECTION_RULE}
    tuned = str(parameters.get("tuned") or "")
    folder = Path(tuned) if Path(tuned).is_absolute() else project_root() / tuned
    if not tuned or not folder.is_dir():
        return inputs  # a missing folder: the notebook itself stops with the error that names it
    return inputs | {str(file.relative_to(folder)): sha256_file(file) for file in sorted(folder.rglob("*.yaml"))}


def _is_complete(record: Path, parameters: dict[str, Any]) -> bool:
    """Whether ``record`` (an entry's ``study_entry.json``) says complete with these parameters and inputs."""
    if not record.is_file():
        return False
    stored = json.loads(record.read_text())
    return (
        stored.get("status") == "complete"
        and stored.get("parameters") == json.loads(json.dumps(parameters, default=str))
        and stored.get("inputs", {}) == entry_inputs(parameters)
    )


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


class PlanProgress:
    """What :func:`run_plan` shows while it works: a tqdm bar over the plan's entries whose postfix names each
    running entry with its time so far (a daemon thread refreshes it every ``heartbeat`` seconds, so a notebook
    whose one training cell runs for minutes is never silent), with papermill's bar over the notebook's cells
    beneath it when one entry runs at a time (:meth:`cell_bar`). Messages go above the bars (:meth:`write`).
    The notebooks' own bars are not forwarded: plans run them with ``progress: false``, and widget bars have
    no text form.
    """

    def __init__(self, total: int, *, enabled: bool = True, heartbeat: float = 5.0) -> None:
        from tqdm.auto import tqdm

        self._tqdm = tqdm
        self.bar = tqdm(total=total, desc="plan", unit="entry", disable=not enabled, dynamic_ncols=True)
        self.enabled, self.heartbeat = enabled, heartbeat
        self.running: dict[str, float] = {}  # entry name → when it started
        self._stop, self._lock = threading.Event(), threading.Lock()
        self._thread = threading.Thread(target=self._tick, name="plan-progress", daemon=True)
        if enabled:
            self._thread.start()

    def _postfix(self) -> str:
        now = time.perf_counter()
        return ", ".join(
            f"{name} running {self._tqdm.format_interval(now - started)}" for name, started in self.running.items()
        )

    def _tick(self) -> None:
        while not self._stop.wait(self.heartbeat):
            with self._lock:
                if self.running:
                    self.bar.set_postfix_str(self._postfix())

    def start(self, name: str) -> None:
        with self._lock:
            self.running[name] = time.perf_counter()
            self.bar.set_postfix_str(self._postfix())

    def done(self, name: str = "") -> None:
        """One entry ended (``name``; a skipped entry never started and passes none)."""
        with self._lock:
            self.running.pop(name, None)
            self.bar.set_postfix_str(self._postfix(), refresh=False)
            self.bar.update(1)

    def write(self, text: str) -> None:
        self._tqdm.write(text)
        sys.stdout.flush()

    def cell_bar(self) -> dict[str, Any] | bool:
        """papermill's ``progress_bar`` argument: a bar over the cells one line below, cleared when done."""
        return (
            {"unit": "cell", "desc": "  cells", "position": 1, "leave": False, "dynamic_ncols": True}
            if self.enabled
            else False
        )

    def __enter__(self) -> PlanProgress:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.bar.close()


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
    in plan order."""
    root = Path(root) if root else runs_root()
    spec = _read_plan(Path(plan))
    entries = [e for e in _plan_entries(spec, Path(plan)) if re.search(only, e.run_name)]
    concurrent = _concurrent_entries(spec, Path(plan))
    source = _reused_study(spec, Path(plan))
    if source and entries and not overwrite:
        copied = copy_finished_runs(root / source, root / entries[0].study)
        print(f"reuse_runs_of {source!r}: {len(copied)} finished run folders copied from {root / source}", flush=True)
    declared = {notebook: notebook_parameters(notebook) for notebook in {e.notebook for e in entries}}
    prepared = [
        (entry, injected_parameters(entry, declared[entry.notebook], root, overwrite=overwrite)) for entry in entries
    ]
    outcomes: dict[int, EntryOutcome] = {}
    with PlanProgress(len(prepared), enabled=progress) as shown:
        waiting = []
        for number, (entry, parameters) in enumerate(prepared, start=1):
            if not overwrite and _is_complete(entry.run_dir(root) / "study_entry.json", parameters):
                outcomes[number] = EntryOutcome(entry, "skipped")
                shown.write(f"[{number}/{len(prepared)}] {entry.run_name}: complete, skipped")
                shown.done()
            else:
                waiting.append((number, entry, parameters))
        concurrent = min(concurrent, len(waiting))
        with _shared_cluster(waiting if concurrent > 1 else []) as environment, _PlanInterrupts(plan) as interrupts:
            outcomes.update(
                _execute_entries(
                    waiting,
                    root=root,
                    concurrent=concurrent,
                    kernel_name=kernel_name,
                    environment=environment,
                    shown=shown,
                    total=len(prepared),
                    interrupts=interrupts,
                )
            )
    ordered = [outcomes[number] for number in sorted(outcomes)]
    failures = [o for o in ordered if o.status == "failed"]
    print(
        f"plan {Path(plan).name}: {sum(o.status == 'complete' for o in ordered)} ran, "
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
) -> dict[int, EntryOutcome]:
    """Execute ``waiting`` in order, up to ``concurrent`` at once (an ``after_earlier`` entry waits until none
    runs); raises :class:`dmlstudy.runs.RunInterrupted` once the running ones have ended after a signal."""
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    outcomes: dict[int, EntryOutcome] = {}
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
                shown.write(f"[{number}/{total}] {entry.run_name}: {entry.notebook.name} {parameters}")
                shown.start(entry.run_name)
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
                shown.write(
                    f"    {entry.run_name} {outcome.status} in {outcome.seconds:.0f} s {outcome.error}".rstrip()
                )
                shown.done(entry.run_name)
    interrupted = [outcome.entry.run_name for outcome in outcomes.values() if outcome.status == "interrupted"]
    if interrupts.received:
        raise interrupts.stopped(interrupted)
    return outcomes


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
    outcome written to its ``study_entry.json``. The kernel also gets :data:`dmlstudy.runs.LEDGER_VARIABLE`:
    the entry's ledger of the runs it reports, emptied first (:func:`dmlstudy.runs.superseded_runs`)."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    run_dir = entry.run_dir(root)
    run_dir.mkdir(parents=True, exist_ok=True)
    ledger = run_dir / LEDGER_NAME
    ledger.write_text("", encoding="utf-8")
    manager = _kernel_manager({**kernel[1], LEDGER_VARIABLE: str(ledger)})
    inputs = entry_inputs(parameters)
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
        )
        outcome = EntryOutcome(entry, "complete", time.perf_counter() - started)
    except PapermillExecutionError as error:
        outcome = EntryOutcome(
            entry, "failed", time.perf_counter() - started, f"cell {error.exec_count}: {error.ename}: {error.evalue}"
        )
    except Exception as error:  # a kernel that died, a notebook that could not be read, …
        outcome = EntryOutcome(entry, "failed", time.perf_counter() - started, f"{type(error).__name__}: {error}")
    if interrupts.received and outcome.status != "complete":  # one that ended before the signal stays complete
        outcome = EntryOutcome(entry, "interrupted", outcome.seconds, interrupts.message([entry.run_name]))
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
def _shared_cluster(waiting: list[tuple[int, PlanEntry, dict[str, Any]]]) -> Iterator[dict[str, str]]:
    """The environment the plan's kernels start with: this process's, as it was before the plan. For entries
    that execute side by side, plus ``DMLSTUDY_SCHEDULER`` naming one local cluster of their largest
    ``workers`` (the engine's :func:`~dmlstudy.engine.start_local_cluster`), closed at the end; no cluster when
    ``waiting`` is empty or ``DMLSTUDY_SCHEDULER`` already names one.

    The kernels get that environment explicitly (:func:`_kernel_manager`), not this process's ``os.environ``:
    each Dask nanny sets ``OMP_NUM_THREADS=1`` (and MKL's, OpenBLAS's) in the process that holds it whenever it
    (re)starts its worker, which would give kernels started after it one thread. ``os.environ`` is restored
    when the plan ends."""
    from dmlstudy import engine

    environment = dict(os.environ)
    if not waiting or engine.scheduler_address():
        yield environment
        return
    workers = max(int(parameters.get("workers", 1) or 1) for _, _, parameters in waiting)
    threads = int(os.environ.get(engine.THREADS_VARIABLE) or 0) or None
    cluster, client = engine.start_local_cluster(workers, threads=threads)
    print(
        f"plan: {len(waiting)} entries, up to several at once, share one local cluster of {workers} workers "
        f"({cluster.scheduler_address}, dashboard {client.dashboard_link})",
        flush=True,
    )
    try:
        yield {**environment, engine.SCHEDULER_VARIABLE: cluster.scheduler_address}
    finally:
        with contextlib.suppress(Exception):  # closing must not hide what happened in the entries
            client.close()
            cluster.close()
        for key in set(os.environ) - set(environment):
            del os.environ[key]
        os.environ.update(environment)


def _kernel_manager(environment: dict[str, str]) -> type:
    """A kernel manager class (nbclient's default, :class:`jupyter_client.AsyncKernelManager`) whose kernels
    start with ``environment``."""
    from jupyter_client import AsyncKernelManager

    class PlanKernelManager(AsyncKernelManager):
        async def start_kernel(self, **kwargs: Any) -> None:
            kwargs.setdefault("env", dict(environment))
            await super().start_kernel(**kwargs)

    return PlanKernelManager


class _PlanInterrupts:
    """SIGTERM/SIGINT while a plan executes entries (main thread only; handlers restored after).

    Papermill starts each kernel in its own session, so a signal sent to ``dmlstudy study run`` does not
    reach it: the first signal is forwarded to this process's children (the kernels, whose
    :func:`dmlstudy.train.run` then keeps its checkpoint and stops, and the plan's cluster); no further entry
    starts, each running one is recorded as ``interrupted`` when its notebook ends, and the plan prints how to
    resume and raises :class:`dmlstudy.runs.RunInterrupted` (exit 143/130). A second signal kills this process's
    children (kernels and cluster; each run keeps its last finished epoch's checkpoint, whose writes are atomic)
    and raises it at once in the main thread.
    """

    def __init__(self, plan: str | Path) -> None:
        self.plan = Path(plan)
        self.received: list[int] = []
        self._previous: dict[int, Any] = {}

    def message(self, running: Iterable[str]) -> str:
        names = ", ".join(running) or "none running"
        forced = "; a second signal killed the kernels and workers" if len(self.received) > 1 else ""
        return (
            f"plan {self.plan.name} interrupted by {signal.Signals(self.received[0]).name} (entries: {names}){forced}; "
            f"finished entries are kept and interrupted runs resume: dmlstudy study run {self.plan}"
        )

    def stopped(self, running: Iterable[str]):
        from dmlstudy.runs import RunInterrupted

        message = self.message(running)
        print(message, file=sys.stderr, flush=True)
        return RunInterrupted(self.received[0], message)

    def _handler(self, signum, frame) -> None:
        import psutil

        self.received.append(signum)
        first = len(self.received) == 1
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if first:
                    child.send_signal(signum)
                else:
                    child.kill()
        if not first:
            raise self.stopped([])

    def __enter__(self) -> _PlanInterrupts:
        if threading.current_thread() is threading.main_thread():
            self._previous = {
                number: signal.signal(number, self._handler) for number in (signal.SIGTERM, signal.SIGINT)
            }
        return self

    def __exit__(self, *exc_info) -> None:
        for number, action in self._previous.items():
            signal.signal(number, action)


def configuration_columns(frame: pd.DataFrame, by: Iterable[str]) -> list[str]:
    """Configuration fields (from ``config.yaml``) that vary among the gathered runs, other than ``by``,
    ``seed`` and the fields that do not change results: grouping by ``by`` plus these keeps runs of
    different settings apart. Metric columns, ``run_dir`` and ``config_hash`` are not configuration."""
    from dmlstudy.runs import NON_IDENTITY_FIELDS

    fields = [c for c in frame.columns if c in getattr(frame, "attrs", {}).get("config_columns", [])]
    skip = {*by, "seed", *NON_IDENTITY_FIELDS}
    return [c for c in fields if c.split(".")[0] not in skip and frame[c].astype(str).nunique(dropna=False) > 1]


def configuration_text(table: pd.DataFrame, columns: Iterable[str]) -> pd.Series:
    """One readable cell per row naming its settings among ``columns`` (:func:`configuration_columns`):
    ``"lr=0.00125, num_blocks=5"``. A field the row's runs do not have (another method's keyword argument) or
    leave empty is not named; ``method_kwargs.`` is dropped from names, floats keep 3 significant digits and a
    file path its name. The tables' Markdown shows this instead of one mostly empty column per field."""

    def shown(value: Any) -> str | None:
        if value is None or (isinstance(value, float) and math.isnan(value)) or value == "":
            return None
        if isinstance(value, float):
            return f"{value:.3g}"
        if isinstance(value, str) and "/" in value:
            return Path(value).name
        return str(value)

    columns = list(columns)
    return pd.Series(
        [
            ", ".join(
                f"{column.removeprefix('method_kwargs.')}={text}"
                for column in columns
                if (text := shown(row[column])) is not None
            )
            for _, row in table[columns].iterrows()
        ]
        if columns
        else [""] * len(table),
        index=table.index,
        dtype=object,
    )


def _flatten(prefix: str, value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return {
            k: v for key, item in value.items() for k, v in _flatten(f"{prefix}.{key}" if prefix else key, item).items()
        }
    return {prefix: json.dumps(value) if isinstance(value, list) else value}


def gather_runs(study: str, *, root: str | Path | None = None) -> pd.DataFrame:
    """One row per finished run of a study: its config fields (``method_kwargs.K1``, …) and metrics.

    Runs a newer configuration of the same run has replaced (:func:`dmlstudy.runs.superseded_runs`: older
    tuned values, an older protocol) are left out and listed, by folder name, in ``attrs["superseded"]``."""
    root = Path(root) if root else runs_root()
    superseded = superseded_runs(root / study)
    rows, config_columns = [], set()
    for metrics_file in sorted((root / study).glob("**/metrics.json")):
        if metrics_file.parent.name in superseded and metrics_file.parent.parent == root / study:
            continue
        config_file = metrics_file.parent / "config.yaml"
        config = (load_yaml(config_file.read_text()) or {}) if config_file.is_file() else {}
        flat = _flatten("", config)
        config_columns.update(flat)
        rows.append({**flat, **json.loads(metrics_file.read_text()), "run_dir": str(metrics_file.parent)})
    frame = pd.DataFrame(rows)
    frame.attrs["config_columns"] = sorted(config_columns)
    frame.attrs["superseded"] = sorted(superseded)
    return frame


def mean_std_text(mean: float, std: float, runs: int, *, decimals: int = 1) -> str:
    """``"mean ± std"`` over ``runs`` seeds; one run has no spread to show, so just ``"mean"``."""
    return f"{mean:.{decimals}f} ± {std:.{decimals}f}" if runs > 1 else f"{mean:.{decimals}f}"


def summarize(
    frame: pd.DataFrame, *, by: list[str], metrics: list[str], percent: bool = True, decimals: int = 1
) -> pd.DataFrame:
    """Mean ± std over the runs of each group (seeds): a tidy table with a ``runs`` column.

    Retrieval metrics (fractions) are shown in percent when ``percent``; other columns as they are. A
    group of one run shows its value alone (its ``_std`` column is 0).
    """
    missing = [c for c in [*by, *metrics] if c not in frame.columns]
    if missing:
        raise KeyError(f"columns {missing} not in the gathered runs; available: {sorted(frame.columns)}")
    grouped = frame.groupby(by, dropna=False, sort=False)
    table = grouped.size().rename("runs").to_frame()
    for metric in metrics:
        scale = 100.0 if percent and metric in PERCENT_METRICS else 1.0
        mean, std = grouped[metric].mean() * scale, grouped[metric].std(ddof=1).fillna(0.0) * scale
        table[metric] = [mean_std_text(m, s, n, decimals=decimals) for m, s, n in zip(mean, std, table["runs"])]
        table[f"{metric}_mean"], table[f"{metric}_std"] = mean, std
    return table.reset_index()


PERCENT_METRICS = {
    "R@1",
    "R@2",
    "R@4",
    "R@8",
    "R@10",
    "R@16",
    "R@20",
    "R@30",
    "R@32",
    "R@100",
    "R@1000",
    "P@1",
    "RP",
    "MAP@R",
    "NMI",
}


def write_table(
    table: pd.DataFrame, path_stem: str | Path, *, display_columns: list[str] | None = None
) -> tuple[Path, Path]:
    """Write ``<stem>.csv`` (all columns) and ``<stem>.md`` (the display columns) and return both paths."""
    stem = Path(path_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = stem.with_suffix(".csv"), stem.with_suffix(".md")
    table.to_csv(csv_path, index=False)
    shown = (
        table[display_columns]
        if display_columns
        else table[[c for c in table.columns if not c.endswith(("_mean", "_std"))]]
    )
    md_path.write_text(shown.to_markdown(index=False) + "\n")
    return csv_path, md_path
