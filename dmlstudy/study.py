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
entry whose ``study_entry.json`` says ``complete`` with the same parameters is skipped, so re-running a
plan resumes where it stopped; a failing notebook is recorded and the plan continues; the failures are
listed at the end with the cell that failed.

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

``study table`` groups runs by configuration: the ``--by`` columns plus every configuration field that
varies among the gathered runs (:func:`configuration_columns`), so runs of different settings are never
averaged together as if they were seeds.
"""

from __future__ import annotations

import itertools
import json
import re
import signal
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from dmlstudy.config import load_yaml
from dmlstudy.paths import project_root, runs_root
from dmlstudy.records import write_json
from dmlstudy.runs import copy_finished_runs


class PlanError(ValueError):
    """A plan file is malformed; the message names the file and the entry."""


@dataclass(frozen=True)
class PlanEntry:
    """One notebook execution: the notebook, its parameters and where its run lives."""

    study: str
    run_name: str
    notebook: Path
    parameters: dict[str, Any] = field(default_factory=dict)

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
        notebook = Path(entry["notebook"])
        notebook = notebook if notebook.is_absolute() else base / notebook
        if not notebook.is_file():
            raise PlanError(f"{path}: entry {entry['name']!r}: notebook not found: {notebook}")
        grid = entry.get("grid") or {}
        keys = list(grid)
        for values in itertools.product(*(grid[key] if isinstance(grid[key], list) else [grid[key]] for key in keys)):
            combination = dict(zip(keys, values))
            name = "-".join([entry["name"], *(f"{key}={_slug(value)}" for key, value in combination.items())])
            entries.append(PlanEntry(study, name, notebook, {**(entry.get("parameters") or {}), **combination}))
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
    status: str  # complete, skipped or failed
    seconds: float = 0.0
    error: str = ""


def _is_complete(record: Path, parameters: dict[str, Any]) -> bool:
    if not record.is_file():
        return False
    stored = json.loads(record.read_text())
    return stored.get("status") == "complete" and stored.get("parameters") == json.loads(
        json.dumps(parameters, default=str)
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
    """What :func:`run_plan` shows while it works: a tqdm bar over the plan's entries, named after the running
    entry, whose postfix counts that entry's time (a daemon thread refreshes it every ``heartbeat`` seconds, so
    a notebook whose one training cell runs for minutes is never silent), with papermill's bar over the
    notebook's cells beneath it (:meth:`cell_bar`). Messages go above the bars (:meth:`write`). The notebooks'
    own bars are not forwarded: plans run them with ``progress: false``, and widget bars have no text form.
    """

    def __init__(self, total: int, *, enabled: bool = True, heartbeat: float = 5.0) -> None:
        from tqdm.auto import tqdm

        self._tqdm = tqdm
        self.bar = tqdm(total=total, desc="plan", unit="entry", disable=not enabled, dynamic_ncols=True)
        self.enabled, self.heartbeat = enabled, heartbeat
        self.entry, self.started = "", time.perf_counter()
        self._stop, self._lock = threading.Event(), threading.Lock()
        self._thread = threading.Thread(target=self._tick, name="plan-progress", daemon=True)
        if enabled:
            self._thread.start()

    def _tick(self) -> None:
        while not self._stop.wait(self.heartbeat):
            with self._lock:
                if self.entry:
                    self.bar.set_postfix_str(
                        f"{self.entry} running {self._tqdm.format_interval(time.perf_counter() - self.started)}"
                    )

    def start(self, name: str) -> None:
        with self._lock:
            self.entry, self.started = name, time.perf_counter()
            self.bar.set_postfix_str(f"{name} starting")

    def done(self) -> None:
        with self._lock:
            self.entry = ""
            self.bar.set_postfix_str("", refresh=False)
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
    """Execute every entry of a plan with papermill (see the module docstring); returns one outcome per entry."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    root = Path(root) if root else runs_root()
    spec = _read_plan(Path(plan))
    entries = [e for e in _plan_entries(spec, Path(plan)) if re.search(only, e.run_name)]
    source = _reused_study(spec, Path(plan))
    if source and entries and not overwrite:
        copied = copy_finished_runs(root / source, root / entries[0].study)
        print(f"reuse_runs_of {source!r}: {len(copied)} finished run folders copied from {root / source}", flush=True)
    declared = {notebook: notebook_parameters(notebook) for notebook in {e.notebook for e in entries}}
    prepared = [
        (entry, injected_parameters(entry, declared[entry.notebook], root, overwrite=overwrite)) for entry in entries
    ]
    outcomes: list[EntryOutcome] = []
    with PlanProgress(len(prepared), enabled=progress) as shown:
        for number, (entry, parameters) in enumerate(prepared, start=1):
            run_dir = entry.run_dir(root)
            record = run_dir / "study_entry.json"
            if not overwrite and _is_complete(record, parameters):
                outcomes.append(EntryOutcome(entry, "skipped"))
                shown.write(f"[{number}/{len(prepared)}] {entry.run_name}: complete, skipped")
                shown.done()
                continue
            run_dir.mkdir(parents=True, exist_ok=True)
            shown.write(f"[{number}/{len(prepared)}] {entry.run_name}: {entry.notebook.name} {parameters}")
            shown.start(entry.run_name)
            started = time.perf_counter()
            try:
                with _plan_interruptible(plan, record, entry, parameters, started):
                    papermill.execute_notebook(
                        str(entry.notebook),
                        str(run_dir / entry.notebook.name),
                        parameters=parameters,
                        kernel_name=kernel_name,
                        cwd=str(project_root()),
                        progress_bar=shown.cell_bar(),
                        config=kernel_config(),
                    )
                outcome = EntryOutcome(entry, "complete", time.perf_counter() - started)
            except PapermillExecutionError as error:
                outcome = EntryOutcome(
                    entry,
                    "failed",
                    time.perf_counter() - started,
                    f"cell {error.exec_count}: {error.ename}: {error.evalue}",
                )
            except Exception as error:  # a kernel that died, a notebook that could not be read, …
                outcome = EntryOutcome(
                    entry, "failed", time.perf_counter() - started, f"{type(error).__name__}: {error}"
                )
            write_json(
                record,
                {
                    "status": outcome.status,
                    "notebook": str(entry.notebook),
                    "parameters": parameters,
                    "seconds": outcome.seconds,
                    "error": outcome.error,
                },
            )
            shown.write(f"    {outcome.status} in {outcome.seconds:.0f} s {outcome.error}")
            shown.done()
            outcomes.append(outcome)
    failures = [o for o in outcomes if o.status == "failed"]
    print(
        f"plan {Path(plan).name}: {sum(o.status == 'complete' for o in outcomes)} ran, "
        f"{sum(o.status == 'skipped' for o in outcomes)} skipped, {len(failures)} failed",
        flush=True,
    )
    for failure in failures:
        print(f"  FAILED {failure.entry.run_name} ({failure.entry.notebook.name}) — {failure.error}", flush=True)
    return outcomes


def _plan_interruptible(plan: str | Path, record: Path, entry: PlanEntry, parameters: dict[str, Any], started: float):
    """SIGTERM/SIGINT while an entry executes (main thread only; handlers restored after).

    Papermill starts each kernel in its own session, so a signal sent to ``dmlstudy study run`` does not
    reach it: the handler forwards the signal to this process's children (the kernel, whose
    :func:`dmlstudy.train.run` then keeps its checkpoint and stops), waits for the notebook to end, records
    the entry as ``interrupted``, prints how to resume the plan and raises
    :class:`dmlstudy.runs.RunInterrupted` (exit 143/130). A second signal stops at once.
    """
    import contextlib

    import psutil

    from dmlstudy.runs import RunInterrupted

    received: list[int] = []

    def stop() -> None:
        signum = received[0]
        message = (
            f"plan {Path(plan).name} interrupted by {signal.Signals(signum).name} during entry {entry.run_name}; "
            f"finished entries are kept and interrupted runs resume: dmlstudy study run {plan}"
        )
        write_json(
            record,
            {
                "status": "interrupted",
                "notebook": str(entry.notebook),
                "parameters": parameters,
                "seconds": time.perf_counter() - started,
                "error": message,
            },
        )
        print(message, file=sys.stderr, flush=True)
        raise RunInterrupted(signum, message)

    def handler(signum, frame) -> None:
        first = not received
        received.append(signum)
        if not first:
            stop()
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.send_signal(signum)

    @contextlib.contextmanager
    def guard():
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {number: signal.signal(number, handler) for number in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        except RunInterrupted:
            raise
        except BaseException:
            if not received:
                raise
            stop()
        else:
            if received:
                stop()
        finally:
            for number, action in previous.items():
                signal.signal(number, action)

    return guard()


def configuration_columns(frame: pd.DataFrame, by: Iterable[str]) -> list[str]:
    """Configuration fields (from ``config.yaml``) that vary among the gathered runs, other than ``by``,
    ``seed`` and the fields that do not change results: grouping by ``by`` plus these keeps runs of
    different settings apart. Metric columns, ``run_dir`` and ``config_hash`` are not configuration."""
    from dmlstudy.runs import NON_IDENTITY_FIELDS

    fields = [c for c in frame.columns if c in getattr(frame, "attrs", {}).get("config_columns", [])]
    skip = {*by, "seed", *NON_IDENTITY_FIELDS}
    return [c for c in fields if c.split(".")[0] not in skip and frame[c].astype(str).nunique(dropna=False) > 1]


def _flatten(prefix: str, value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return {
            k: v for key, item in value.items() for k, v in _flatten(f"{prefix}.{key}" if prefix else key, item).items()
        }
    return {prefix: json.dumps(value) if isinstance(value, list) else value}


def gather_runs(study: str, *, root: str | Path | None = None) -> pd.DataFrame:
    """One row per finished run of a study: its config fields (``method_kwargs.K1``, …) and metrics."""
    root = Path(root) if root else runs_root()
    rows, config_columns = [], set()
    for metrics_file in sorted((root / study).glob("**/metrics.json")):
        config_file = metrics_file.parent / "config.yaml"
        config = (load_yaml(config_file.read_text()) or {}) if config_file.is_file() else {}
        flat = _flatten("", config)
        config_columns.update(flat)
        rows.append({**flat, **json.loads(metrics_file.read_text()), "run_dir": str(metrics_file.parent)})
    frame = pd.DataFrame(rows)
    frame.attrs["config_columns"] = sorted(config_columns)
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
