"""What a study plan shows while it runs (:func:`dmlstudy.study.executor.run_plan`): one tqdm bar over the plan's runs,
ended / known so far, with the time left (:class:`PlanProgress`, :class:`RunProgress`), and the line that says
what a stopped plan kept and how to resume it (:func:`stop_line`).

The runner learns of runs from a ledger that the notebooks' kernels append to (``DMLSTUDY_RUN_EVENTS``, a file
it names: the engine notes each run a kernel submits, with its epoch cap, before any worker starts it, and each
run that fails: :func:`dmlstudy.study.engine.note_run_event`) and from the run folders of the study, where a run has
finished once its records are complete. So the total grows as the notebooks submit their grids, runs already
finished when the plan starts are done at once, and a run a kernel trains itself counts when it finishes. A
ledger rather than the scheduler's task stream: it needs no client of the scheduler, knows the run behind each
task, and works for every scheduler, or none.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dmlstudy.paths import project_root, runs_root
from dmlstudy.progress_bars import disabled
from dmlstudy.run.identity import is_complete


def duration_text(seconds: float) -> str:
    """A duration as a person reads it: ``"12 s"``, ``"43 min"``, ``"1 h 05 min"``."""
    seconds = max(0.0, float(seconds))
    if seconds < 59.5:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


class RunProgress:
    """The runs of a plan as the runner learns of them: ``finished_before`` (finished on disk when the plan
    starts: done at once), runs the notebooks submit (with their epoch caps), runs that finish or fail. Pure
    bookkeeping: every event carries its time ``at`` (seconds on any one clock).

    The time left (:meth:`eta`) is the epochs the waiting and running runs may still train (each counts its
    cap, ``epochs``: early stopping is averaged in) over the rate at which this plan has trained epochs: the
    caps of the runs it finished over the seconds during which any run was waiting or training, counted down
    from the last finish. A run that finishes unannounced (one a notebook trained in its own kernel) counts
    as done, not in the rate."""

    def __init__(self, finished_before: Iterable[str] = ()) -> None:
        self.finished: set[str] = set(finished_before)
        self.failed: set[str] = set()
        self.epochs: dict[str, int] = {}  # run → epoch cap, for every run submitted in this plan
        self._trained_epochs = 0  # caps of the submitted runs that finished
        self._busy = 0.0  # seconds with a run waiting or training, before _busy_since
        self._busy_since: float | None = None  # start of the current stretch with a run waiting or training
        self._busy_at_last_finish = 0.0

    @property
    def pending(self) -> set[str]:
        """Submitted runs that have neither finished nor failed."""
        return set(self.epochs) - self.finished - self.failed

    @property
    def total(self) -> int:
        return len(self.finished | self.failed | set(self.epochs))

    @property
    def ended(self) -> int:
        return len(self.finished | self.failed)

    def _busy_until(self, at: float) -> float:
        return self._busy + (at - self._busy_since if self._busy_since is not None else 0.0)

    def _after_change(self, at: float) -> None:
        if self.pending and self._busy_since is None:
            self._busy_since = at
        elif not self.pending and self._busy_since is not None:
            self._busy, self._busy_since = self._busy_until(at), None

    def submitted(self, run: str, epochs: int, at: float) -> None:
        if run in self.finished:
            return
        self.failed.discard(run)  # submitted again after a failure: waiting again
        self.epochs[run] = epochs
        self._after_change(at)

    def finish(self, run: str, at: float) -> None:
        if run in self.finished:
            return
        if run in self.pending:
            self._trained_epochs += self.epochs[run]
            self._busy_at_last_finish = self._busy_until(at)
        self.finished.add(run)
        self.failed.discard(run)
        self._after_change(at)

    def fail(self, run: str, at: float) -> None:
        if run in self.pending:
            self.failed.add(run)
            self._after_change(at)

    def eta(self, now: float) -> float | None:
        """Seconds until the submitted runs have all ended; None while no submitted run has finished (no rate
        yet) or none is left."""
        left = sum(self.epochs[run] for run in self.pending)
        if not left or not self._trained_epochs or self._busy_at_last_finish <= 0:
            return None
        seconds_per_epoch = self._busy_at_last_finish / self._trained_epochs
        return max(0.0, left * seconds_per_epoch - (self._busy_until(now) - self._busy_at_last_finish))


def read_run_events(path: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """The JSON lines appended to ``path`` (:func:`dmlstudy.study.engine.note_run_event`) after byte ``offset``, and
    the offset after the last whole line (a line still being written is read the next time; one that is not
    JSON is passed over)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    events = []
    for line in data[:end].splitlines():
        with contextlib.suppress(ValueError):
            events.append(json.loads(line))
    return [event for event in events if isinstance(event, dict)], offset + end


def run_records(study_dir: Path) -> dict[str, int]:
    """``metrics.json`` modification times (ns) of a study's run folders, by folder name: a run finishes (or,
    overwritten, finishes again) when its time changes and the folder :func:`dmlstudy.run.identity.is_complete`."""
    records: dict[str, int] = {}
    for path in Path(study_dir).glob("*/metrics.json"):
        with contextlib.suppress(OSError):  # a folder being replaced
            records[path.parent.name] = path.stat().st_mtime_ns
    return records


class PlanProgress:
    """What :func:`dmlstudy.study.executor.run_plan` shows while it works: one tqdm bar over the plan's runs, ``ended/known
    so far`` (the total grows as notebooks submit their grids), its postfix the time left (:class:`RunProgress`), the
    failed runs and the notebooks done and running; papermill's bar over a notebook's cells beneath it when one
    entry runs at a time (:meth:`cell_bar`). Lines about the entries go above it (:meth:`write`).

    The runner learns of runs in two ways, both read by a daemon thread every ``heartbeat`` seconds (and so
    never silent while a notebook's one training cell runs for minutes): the ledger ``events`` that the
    notebooks' kernels append to when they submit a run to the engine or one fails
    (:func:`dmlstudy.study.engine.note_run_event`; the kernel knows the run before any worker starts it, so the total
    counts runs still queued), and the run folders of ``study_dir``, where a run has finished once its records
    are complete (:func:`run_records`): runs a kernel trained itself count too, and runs already finished when
    the plan starts count as done at once (none with ``overwrite``, which trains them again). The notebooks' own
    bars are not forwarded: plans run them with ``progress: false``, and widget bars have no text form.
    """

    def __init__(
        self,
        entries: int,
        study_dir: Path,
        *,
        events: Path | None = None,
        overwrite: bool = False,
        enabled: bool = True,
        heartbeat: float = 5.0,
    ) -> None:
        from tqdm.auto import tqdm

        self._tqdm = tqdm
        self.study_dir, self.events, self.heartbeat, self.enabled = Path(study_dir), events, heartbeat, enabled
        self._records = run_records(self.study_dir)
        finished = set() if overwrite else {name for name in self._records if is_complete(self.study_dir / name)}
        self.runs = RunProgress(finished)
        self.entries, self.entries_ended, self.entries_running = entries, 0, 0
        self._offset = 0
        self.bar = tqdm(
            total=self.runs.total,
            initial=self.runs.ended,
            desc="runs, ended/known (more as notebooks submit)",
            unit="run",
            bar_format="{desc}: {n_fmt}/{total_fmt} |{bar:16}| {elapsed}{postfix}",
            disable=disabled(not enabled),
            dynamic_ncols=True,
        )
        self._stop, self._lock = threading.Event(), threading.Lock()
        self._thread = threading.Thread(target=self._tick, name="plan-progress", daemon=True)
        if enabled:
            self._thread.start()

    def poll(self, now: float) -> None:
        """Read the ledger's new events and the run folders that changed, as of ``now``."""
        events, self._offset = read_run_events(self.events, self._offset) if self.events else ([], 0)
        for event in events:
            if event.get("event") == "submitted":
                self.runs.submitted(event["run"], int(event.get("epochs", 1)), now)
            elif event.get("event") == "failed":
                self.runs.fail(event["run"], now)
        for name, modified in run_records(self.study_dir).items():
            if self._records.get(name) != modified and is_complete(self.study_dir / name):
                self._records[name] = modified
                self.runs.finish(name, now)

    def _postfix(self, now: float) -> str:
        eta = self.runs.eta(now)
        parts = [
            f"ETA {duration_text(eta)}"
            if eta is not None
            else ("ETA after the first run" if self.runs.pending else ""),
            f"{len(self.runs.failed)} failed" if self.runs.failed else "",
            f"notebooks {self.entries_ended}/{self.entries} ended"
            + (f", {self.entries_running} running" if self.entries_running else ""),
        ]
        return ", ".join(part for part in parts if part)

    def _show(self, now: float) -> None:
        self.bar.total, self.bar.n = self.runs.total, self.runs.ended
        self.bar.set_postfix_str(self._postfix(now), refresh=True)

    def _tick(self) -> None:
        while not self._stop.wait(self.heartbeat):
            with self._lock:
                now = time.monotonic()
                self.poll(now)
                self._show(now)

    def start(self) -> None:
        """An entry started."""
        with self._lock:
            self.entries_running += 1
            self._show(time.monotonic())

    def done(self, *, started: bool = True) -> None:
        """An entry ended (``started=False``: a skipped one, which never started)."""
        with self._lock:
            self.entries_running -= started
            self.entries_ended += 1
            self._show(time.monotonic())

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
        with self._lock:
            if self.enabled:
                self.poll(time.monotonic())
                self._show(time.monotonic())
            self.bar.close()


def shown_path(path: Path) -> str:
    """``path`` relative to the project when it lies inside it (``notebooks/10_crt.ipynb``), else as given."""
    try:
        return str(Path(path).resolve().relative_to(project_root()))
    except ValueError:
        return str(path)


def resume_command(plan: Path, root: Path) -> str:
    """The command that executes ``plan`` again, and so resumes it: ``make study`` for the default plan."""
    shown = shown_path(plan)
    if Path(root).resolve() != runs_root().resolve():
        return f"dmlstudy study run {shown} --runs-root {root}"
    return "make study" if shown == "plans/default.yaml" else f"make study PLAN={shown}"


def stop_line(signal_name: str, *, runs: int, notebooks: int, command: str) -> str:
    """The one line a stopped plan ends with: what was kept (finished runs and notebooks) and how to resume."""
    return (
        f"stopped by {signal_name}: kept {runs} finished run{'s' * (runs != 1)} and {notebooks} finished "
        f"notebook{'s' * (notebooks != 1)} (runs in flight resume from their last epoch checkpoint); "
        f"run `{command}` again to resume"
    )
