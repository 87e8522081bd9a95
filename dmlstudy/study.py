"""Study plans: parameterized notebooks executed by papermill (the tables of their runs: :mod:`dmlstudy.report`).

A plan (``plans/*.yaml``)::

    study: default                  # runs go to runs/<study>/
    entries:
      - name: baseline              # entry name; grid values are appended to it
        notebook: notebooks/01_train.ipynb
        parameters: {method: ms, epochs: 8}
        grid: {dataset: [synbirds, glyphs], seed: [0, 1, 2]}   # every combination is one run

Each expanded entry is executed in ``runs/<study>/<run_name>/`` (the executed notebook is written beside
the run's records; ``study`` and ``run_name`` are injected when the notebook has those parameters, ``study`` and
``runs_root`` into the ``protocol`` mapping of a study notebook). A study notebook's shared protocol is one
parameter (:data:`PROTOCOL_PARAMETER`, a mapping of :class:`~dmlstudy.experiments.protocol.ProtocolConfig`
fields), which a plan gives every entry from one YAML anchor::

    protocol: &protocol {datasets: [synbirds, glyphs], seeds: [0, 1, 2, 3, 4], epochs: 6}
    entries:
      - name: crt
        notebook: notebooks/10_crt.ipynb
        parameters: {protocol: *protocol, ablation_seeds: [0, 1, 2]}

An
entry whose ``study_entry.json`` says ``complete`` with the same parameters, notebook, tuned-values files and
checkpoint-selection rule (:func:`entry_inputs`: after ``make tune`` the entries that train with them run again,
after a new rule every entry, after an edit of a notebook that notebook's entries, which load their finished runs)
is skipped, so re-running a plan resumes where it stopped; a failing notebook is
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
Plans are read with :func:`dmlstudy.config.load_yaml` (``lr: 1e-3`` is a float).

What a plan shows: one line per entry (:func:`entry_line`: ``[2/8] crt  notebooks/10_crt.ipynb  5 seeds × 2
datasets  started``, then ``done in 43 min``) above one bar over the plan's runs, ended / known so far, with the
time left, and after a stop the line that says what was kept (:mod:`dmlstudy.plan_progress`).

Ctrl-C (SIGINT) or SIGTERM stops a plan cleanly (:class:`_PlanInterrupts`): the kernels are interrupted as
Jupyter interrupts them, their grids' tasks stop at the next training step keeping the last epoch's
checkpoint, the running entries are recorded as ``interrupted``, the kernels and the plan's cluster shut down,
and one line says what was kept (finished runs and notebooks) and that the same command resumes; the exit
status is 130 (143 for SIGTERM, :class:`dmlstudy.runs.RunInterrupted`). A second signal kills the kernels.

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
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dmlstudy import engine
from dmlstudy.config import load_yaml
from dmlstudy.paths import project_root, runs_root
from dmlstudy.plan_progress import PlanProgress, duration_text, resume_command, run_records, shown_path, stop_line
from dmlstudy.records import write_json
from dmlstudy.runs import (
    LEDGER_NAME,
    LEDGER_VARIABLE,
    SELECTION_RULE,
    RunInterrupted,
    copy_finished_runs,
    is_complete,
)


class PlanError(ValueError):
    """A plan file is malformed; the message names the file and the entry."""


PROTOCOL_PARAMETER = "protocol"  # a study notebook's shared protocol: one parameter, a mapping of ProtocolConfig fields


def entry_setting(parameters: dict[str, Any], name: str, default: Any = None) -> Any:
    """The setting ``name`` of an entry's parameters: its shared protocol's (``protocol: {tuned: …}``), else the
    entry's own (a notebook without a shared protocol, such as ``01_train``), else ``default``."""
    protocol = parameters.get(PROTOCOL_PARAMETER)
    if isinstance(protocol, dict) and name in protocol:
        return protocol[name]
    return parameters.get(name, default)


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


def plan_study(path: str | Path) -> str:
    """The study a plan's runs go to: its ``study``, else the plan file's stem."""
    path = Path(path)
    return str(_read_plan(path).get("study") or path.stem)


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
    """The entry's parameters plus ``study``/``run_name``/``runs_root`` where the notebook declares them (``study``
    and ``runs_root`` inside the shared protocol of a notebook that declares :data:`PROTOCOL_PARAMETER`; the
    entry's own values win), ``resume=True`` (plans resume by default) and, when ``overwrite``, ``overwrite=True``."""
    declared = set(declared)
    unknown = sorted(set(entry.parameters) - declared)
    if unknown:
        raise PlanError(
            f"entry {entry.run_name!r}: {entry.notebook.name} has no parameters {unknown}; it declares {sorted(declared)}"
        )
    extra = {"study": entry.study, "run_name": entry.run_name, "runs_root": str(root), "resume": True}
    forced = {"overwrite": True} if overwrite and "overwrite" in declared else {}
    parameters = {**{k: v for k, v in extra.items() if k in declared}, **entry.parameters, **forced}
    if PROTOCOL_PARAMETER in declared:
        protocol = entry.parameters.get(PROTOCOL_PARAMETER) or {}
        if not isinstance(protocol, dict):
            raise PlanError(
                f"entry {entry.run_name!r}: '{PROTOCOL_PARAMETER}' must be a mapping of protocol fields, got {protocol!r}"
            )
        parameters[PROTOCOL_PARAMETER] = {"study": entry.study, "runs_root": str(root), **protocol}
    return parameters


@dataclass
class EntryOutcome:
    entry: PlanEntry
    status: str  # complete, skipped, failed or interrupted
    seconds: float = 0.0
    error: str = ""


def entry_inputs(parameters: dict[str, Any], notebook: Path | None = None) -> dict[str, str]:
    """What an entry reads besides its parameters and its runs: the revision of the checkpoint-selection rule
    (:data:`dmlstudy.runs.SELECTION_RULE`, so that the entries run again, and retrain the runs the new rule
    would choose differently, after it changes), the tuned-values files under its ``tuned`` folder
    (``plans/tuned/**/*.yaml``, relative path → SHA-256), so that a plan re-executes an entry after ``make tune``
    has changed the values it trains with, and the SHA-256 of its ``notebook``, so that an edited notebook is
    executed again (its finished runs are loaded, not retrained) and its executed copy, the one
    ``dmlstudy study publish`` publishes, says what its source now says."""
    from dmlstudy.models.cards import sha256_file

    inputs = {"selection rule": SELECTION_RULE}
    if notebook is not None and Path(notebook).is_file():
        inputs["notebook"] = sha256_file(Path(notebook))
    tuned = str(entry_setting(parameters, "tuned") or "")
    folder = Path(tuned) if Path(tuned).is_absolute() else project_root() / tuned
    if not tuned or not folder.is_dir():
        return inputs  # a missing folder: the notebook itself stops with the error that names it
    return inputs | {str(file.relative_to(folder)): sha256_file(file) for file in sorted(folder.rglob("*.yaml"))}


def _is_complete(record: Path, parameters: dict[str, Any], notebook: Path | None = None) -> bool:
    """Whether ``record`` (an entry's ``study_entry.json``) says complete with these parameters and inputs."""
    if not record.is_file():
        return False
    stored = json.loads(record.read_text())
    return (
        stored.get("status") == "complete"
        and stored.get("parameters") == json.loads(json.dumps(parameters, default=str))
        and stored.get("inputs", {}) == entry_inputs(parameters, notebook)
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


def entry_summary(parameters: dict[str, Any]) -> str:
    """What an entry covers, in a few words: ``"5 seeds × 2 datasets, 2 regimes"`` for a notebook over grids
    (its protocol's ``seeds`` and ``datasets`` and its ``methods`` lists; ``regime`` with ``compared_regimes``: read
    by :func:`entry_setting`), ``"ms, synbirds,
    seed 0"`` for one run (``method``, ``dataset``, ``seed``); '' when it names none of these."""
    counted = [
        f"{len(values)} {noun}{'' if len(values) == 1 else 's'}"
        for key, noun in (("seeds", "seed"), ("datasets", "dataset"), ("methods", "method"))
        if isinstance(values := entry_setting(parameters, key), list) and values
    ]
    regime = entry_setting(parameters, "regime")
    regimes = {regime} if isinstance(regime, str) else set()
    regimes |= set(parameters.get("compared_regimes") or [])
    named = [str(parameters[key]) for key in ("method", "dataset") if isinstance(parameters.get(key), str)]
    if isinstance(parameters.get("seed"), int):
        named.append(f"seed {parameters['seed']}")
    return ", ".join([" × ".join(counted)] * bool(counted) + [f"{len(regimes)} regimes"] * (len(regimes) > 1) + named)


def entry_line(number: int, total: int, entry: PlanEntry, status: str, *, parameters: dict | None = None) -> str:
    """The one line the runner prints about an entry: with ``parameters`` (when it starts, or is skipped) its
    notebook and :func:`entry_summary` too: ``[2/8] crt  notebooks/10_crt.ipynb  5 seeds × 2 datasets  started``;
    without, ``[2/8] crt  done in 43 min``."""
    parts = [f"[{number}/{total}] {entry.run_name}"]
    if parameters is not None:
        parts += [shown_path(entry.notebook), entry_summary(parameters)]
    return "  ".join(part for part in [*parts, status] if part)


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
    in plan order. SIGINT/SIGTERM stop it with :class:`dmlstudy.runs.RunInterrupted` (:class:`_PlanInterrupts`)."""
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
    spec = _read_plan(plan)
    entries = [e for e in _plan_entries(spec, plan) if re.search(only, e.run_name)]
    concurrent = _concurrent_entries(spec, plan)
    source = _reused_study(spec, plan)
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
            if not overwrite and _is_complete(entry.run_dir(root) / "study_entry.json", parameters, entry.notebook):
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
    runs), each outcome into ``outcomes``; raises :class:`dmlstudy.runs.RunInterrupted` once the running ones
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
    outcome written to its ``study_entry.json``. The kernel also gets :data:`dmlstudy.runs.LEDGER_VARIABLE`:
    the entry's ledger of the runs it reports, emptied first (:func:`dmlstudy.runs.superseded_runs`). Once the
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
    ``workers`` (the engine's :func:`~dmlstudy.engine.start_local_cluster`, whose workers ignore a terminal's
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
    cluster, which ignore it (:func:`dmlstudy.engine.start_local_cluster`). Papermill starts each kernel in its
    own process group, out of reach. Before any entry starts, a signal stops the plan at once. Once entries run, the
    first signal interrupts each kernel as Jupyter does (SIGINT: the running cell raises KeyboardInterrupt,
    :func:`dmlstudy.engine.run_tasks` cancels its grid's tasks, which stop at their next training step with
    their last epoch's checkpoint kept, or :func:`dmlstudy.train.run` in the kernel keeps its own), no further
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
