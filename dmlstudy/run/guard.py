"""What a run checks and holds while it writes its folder: names and data checked before any image is
decoded, reuse or refusal of the folder, one writer at a time, and clean interruption.
:func:`dmlstudy.run.train.run` enters :class:`RunGuard` at its start. The folder's identity and records are
:mod:`dmlstudy.run.identity`.

Decisions (docs/run_safety.md):

* **Reuse, refusal, overwrite.** A folder with a complete record (``config.yaml``, ``metrics.json``,
  ``checkpoint.pt``) of the same identity is loaded, never retrained, whatever ``resume`` says; a folder
  whose ``config.yaml`` holds another identity (a hash collision, a hand-edited record) is refused.
  ``overwrite=True`` (``--overwrite``) is the only way to replace either: the old records are deleted
  before training starts. One record is trained again without it, with a warning: one whose reported
  checkpoint is a warm-up epoch (:func:`~dmlstudy.run.identity.chosen_in_warmup`), which only the selection
  rule before 2026-11-26 could choose. ``resume=True`` continues an interrupted run from its last epoch
  checkpoint; an interrupted run started again without it begins at epoch 1 (with a warning).
* **One writer.** :class:`RunLock` holds a ``filelock`` lock on ``<run>/.run.lock`` for the run's whole
  life and writes the holder's PID, host and command to ``<run>/.run.lock.json``; a second writer fails
  at once with :class:`RunLockedError` naming them, unless it resumes (``resume=True``, as every run of a
  study plan and of the engine does): a resumed run waits for the live writer, saying once whom it waits for,
  and then loads the finished run or continues it (a notebook of a plan that trains its run in its own kernel,
  the ``01_train`` tutorial, and another notebook's run task asking for the same run may come in either order).
  The OS drops the lock of a process that died, so a holder file left behind is stale: it is taken over with a
  warning naming the dead process.
* **Signals.** While a run trains, SIGTERM and SIGINT stop it between two record writes (a write in
  progress is finished first), keep the checkpoint of the last finished epoch, print one line saying how
  to resume, and raise :class:`RunInterrupted`, a ``SystemExit`` with code 143 (SIGTERM) or 130
  (SIGINT), so the CLI and any script exit with the conventional status. Handlers are installed only in
  the main thread and restored afterwards.
* **Checks before data.** :func:`check_before_loading` validates names (method, dataset, backbone) and
  the method's keyword arguments without reading any image; :func:`check_loaded_data` runs on the split
  listings before any image is decoded or any model built: Recall@K against the test-set size, P × M
  against the training classes, classes with fewer than M images (warning), and the images themselves
  (:func:`dmlstudy.data.base.verify_images`).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from dmlstudy import records
from dmlstudy.paths import project_file, project_root
from dmlstudy.run.identity import (
    ACTIONS,
    RECORD_FILES,
    chosen_in_warmup,
    config_record_text,
    describe_differences,
    differing_fields,
    identity_hash,
    is_complete,
    origins_of,
    read_config_record,
    resume_command,
    warn,
)

LOCK_FILE, HOLDER_FILE = ".run.lock", ".run.lock.json"
LOCK_POLL_SECONDS = 2.0  # how often a resumed run looks again at a run folder another live process is writing


class RunConflictError(RuntimeError):
    """A run folder holds the record of another configuration."""


class RunLockedError(RuntimeError):
    """Another process is writing the run folder."""


class RunStopped(RuntimeError):
    """A run stopped because the code that started it asked it to (:func:`stop_when`): a pruned trial, an
    interrupted grid. Like an interruption it keeps the last finished epoch's checkpoint."""


class RunInterrupted(SystemExit):
    """A run stopped by SIGTERM/SIGINT; ``code`` is 128 + the signal number (143, 130)."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(128 + signum)
        self.signum, self.message = signum, message

    def __str__(self) -> str:
        return self.message


# ---------------------------------------------------------------------------------------------- checks


def check_before_loading(config) -> None:
    """Names and keyword arguments that can be checked without reading data (one-line errors that name
    the parameter and list the valid values)."""
    from dmlstudy.data import list_datasets
    from dmlstudy.methods import METHODS, list_methods

    if config.method not in METHODS:
        raise KeyError(
            f"unknown method {config.method!r} (parameter 'method'); valid names: {', '.join(list_methods())}"
        )
    if config.dataset not in list_datasets():
        raise KeyError(
            f"unknown dataset {config.dataset!r} (parameter 'dataset'); valid names: {', '.join(list_datasets())}"
        )
    import difflib

    import timm

    if not timm.is_model(config.backbone):
        close = difflib.get_close_matches(config.backbone, timm.list_models(), n=8)
        raise KeyError(
            f"unknown backbone {config.backbone!r} (parameter 'backbone'): not a timm model name. "
            f"Close matches: {close or 'none'}; the full list is timm.list_models()."
        )
    builder = METHODS[config.method]
    if inspect.isfunction(builder) and builder.__name__ == "<lambda>":  # a preset method: its class (register_method)
        builder = inspect.getclosurevars(builder).nonlocals.get("builder", builder)
    parameters = inspect.signature(builder).parameters.values()
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        accepted = {p.name for p in parameters if p.kind is not inspect.Parameter.VAR_POSITIONAL} - {
            "backbone",
            "embedding_dim",
            "num_classes",
        }
        unknown = sorted(set(config.method_kwargs) - accepted)
        if unknown:
            raise TypeError(
                f"parameter 'method_kwargs': method {config.method!r} takes no {unknown}; it accepts {sorted(accepted)}"
            )
    if config.checkpoint_path and not project_file(config.checkpoint_path).is_file():
        raise FileNotFoundError(
            f"parameter 'checkpoint_path': backbone weights file not found: {config.checkpoint_path} (looked in the "
            f"working directory and in the project root {project_root()})"
        )
    if config.lr > 1.0 or config.head_lr > 10.0:
        warn(
            f"learning rate lr={config.lr:g}, head_lr={config.head_lr:g} is far above the usual 1e-5 … 1e-2 of DML "
            "training; expect a flat or diverging loss"
        )


def _base_items(dataset) -> tuple[Any, list[int]]:
    """The :class:`ImageListDataset` under wrappers (``.dataset``) and subsets (``.indices``), and the
    positions of ``dataset``'s items in it."""
    positions = list(range(len(dataset)))
    while not hasattr(dataset, "paths") and hasattr(dataset, "dataset"):
        if hasattr(dataset, "indices"):
            positions = [int(dataset.indices[p]) for p in positions]
        dataset = dataset.dataset
    return dataset, positions


def describe_items(dataset, indices) -> str:
    """``index i (<path>)`` for training-set indices, through augmentation wrappers and class subsets."""
    base, positions = _base_items(dataset)
    paths = getattr(base, "paths", None)
    return ", ".join(
        f"index {int(i)} ({paths[positions[int(i)]]})" if paths is not None else f"index {int(i)}" for i in indices
    )


def check_loaded_data(config, datasets: Mapping[str, Any]) -> None:
    """Sizes and images, from the split listings, before any image is decoded for training."""
    from dmlstudy.data.base import verify_images

    train = datasets["train"]
    query, gallery = datasets["query"], datasets.get("gallery")
    retrievable = len(gallery) if gallery is not None else len(query) - 1 if query is not None else float("inf")
    where = f"the {config.dataset} test set" + (
        " gallery"
        if gallery is not None
        else f" ({len(query) if query is not None else 0} images, each query excludes itself)"
    )
    for k in datasets["recall_ks"]:
        if k > retrievable:
            raise ValueError(
                f"parameter 'recall_ks': K={k} is larger than the {retrievable} images a query can retrieve from {where}"
            )
    labels = list(map(int, train.labels))
    counts: dict[int, int] = {}
    for label in labels:
        counts[label] = counts.get(label, 0) + 1
    if config.classes_per_batch > len(counts):
        raise ValueError(
            f"parameter 'classes_per_batch': P={config.classes_per_batch} but the {config.dataset} training split "
            f"has {len(counts)} classes"
            + (f" (train_classes={config.train_classes})" if config.train_classes else "")
            + (
                f" once validation fold {config.validation_fold} of {config.validation_folds} is held out"
                if config.validation_folds
                else ""
            )
        )
    if not config.steps_per_epoch and len(labels) < config.classes_per_batch * config.samples_per_class:
        raise ValueError(
            f"batch P × M = {config.classes_per_batch} × {config.samples_per_class} is larger than the {len(labels)} "
            "training images; lower them or set steps_per_epoch"
        )
    small = sorted(label for label, count in counts.items() if count < config.samples_per_class)
    if small:
        base, _ = _base_items(train)
        names = [base.class_names[label] if hasattr(base, "class_names") else str(label) for label in small]
        shown = ", ".join(f"{name} ({counts[label]})" for name, label in zip(names[:10], small))
        warn(
            f"{len(small)} training classes have fewer than M={config.samples_per_class} images and will repeat images "
            f"within a batch: {shown}{' …' if len(small) > 10 else ''}"
        )
    for split in (train, query, gallery):
        if split is None:
            continue
        base, _ = _base_items(split)
        if hasattr(base, "paths"):
            verify_images(base)


# ---------------------------------------------------------------------------------------------- lock


class RunLock:
    """Exclusive ownership of a run folder for a process's lifetime (see the module docstring)."""

    def __init__(self, run_dir: Path) -> None:
        from filelock import FileLock

        self.run_dir = Path(run_dir)
        self.holder_file = self.run_dir / HOLDER_FILE
        self.lock = FileLock(str(self.run_dir / LOCK_FILE))

    def _holder(self) -> dict[str, Any]:
        try:
            return json.loads(self.holder_file.read_text())
        except (OSError, ValueError):
            return {}

    def describe_holder(self) -> str:
        """``run folder … is being written by PID … on host …, since … (command)``."""
        holder = self._holder()
        who = f"PID {holder.get('pid', '?')} on host {holder.get('host', '?')}" if holder else "another process"
        since = f", since {holder['started']}" if holder.get("started") else ""
        return f"run folder {self.run_dir} is being written by {who}{since} ({holder.get('command', '')})"

    def acquire(self) -> None:
        from filelock import Timeout

        try:
            self.lock.acquire(timeout=0)
        except Timeout:
            raise RunLockedError(f"{self.describe_holder()}; wait for it to finish or stop that process") from None
        previous = self._holder()
        if previous and previous.get("pid") != os.getpid():
            warn(
                f"took over the stale lock of {self.run_dir}: PID {previous.get('pid')} on host {previous.get('host')} "
                f"(started {previous.get('started', '?')}) no longer holds it; that run was interrupted"
            )
        records.write_json(
            self.holder_file,
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                "command": " ".join(sys.argv),
            },
        )

    def release(self) -> None:
        self.holder_file.unlink(missing_ok=True)
        self.lock.release()


# ---------------------------------------------------------------------------------------------- run guard


def kept_checkpoint(run_dir: Path, epochs: int) -> str:
    """What an interrupted run leaves: ``the checkpoint of epoch k/N is kept`` (or that none had finished)."""
    history = Path(run_dir) / "history.csv"
    done = max(0, len(history.read_text().splitlines()) - 1) if history.is_file() else 0
    return f"the checkpoint of epoch {done}/{epochs} is kept" if done else "no epoch had finished"


_stop_requests = threading.local()


@contextlib.contextmanager
def stop_when(requested: Callable[[], bool]) -> Iterator[None]:
    """Within the block, in this thread, :func:`check_stop` raises :class:`RunStopped` once ``requested()``
    is true. The engine runs each training task under the worker's "this task was cancelled" test: a
    thread cannot be interrupted from outside, so a run checks between two training steps instead."""
    previous = getattr(_stop_requests, "check", None)
    _stop_requests.check = requested
    try:
        yield
    finally:
        _stop_requests.check = previous


def check_stop(run_dir: Path, epochs: int) -> None:
    """Raise :class:`RunStopped` when the enclosing :func:`stop_when` says so (call it between record writes)."""
    requested = getattr(_stop_requests, "check", None)
    if requested is not None and requested():
        raise RunStopped(f"stopped on request: {kept_checkpoint(run_dir, epochs)} in {run_dir}")


@contextlib.contextmanager
def interruptible(run_dir: Path, epochs: int) -> Iterator[None]:
    """SIGTERM/SIGINT → :class:`RunInterrupted` after any record write in progress (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame) -> None:
        def stop() -> None:
            raise RunInterrupted(
                signum,
                f"interrupted by {signal.Signals(signum).name}: {kept_checkpoint(run_dir, epochs)} in {run_dir}; "
                f"continue with: {resume_command(run_dir)} (Python: resume=True)",
            )

        if not records.defer_while_writing(stop):
            stop()

    previous = {number: signal.signal(number, handler) for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    except RunInterrupted as interruption:
        print(interruption.message, file=sys.stderr, flush=True)
        raise
    finally:
        for number, action in previous.items():
            signal.signal(number, action)


class RunGuard:
    """What :func:`dmlstudy.run.train.run` does before training and after it: the lock, the signal handlers,
    the reuse/refuse/overwrite policy and the first records. ``writer`` is False on the ranks of a
    distributed run that write nothing (they only read the policy's outcome).

    Attributes after entering: ``reusable`` (a complete run of this configuration is there: load it) and
    ``resume_from`` (the checkpoint to continue from, or None). A complete run that is not to be overwritten
    is read without taking the lock.
    """

    def __init__(self, config, *, writer: bool = True) -> None:
        self.config, self.writer = config, writer
        self.run_dir = config.run_dir
        self.reusable, self.resume_from = False, None
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> RunGuard:
        try:
            # a finished run is only read (its records are complete and its checkpoint is replaced atomically):
            # no lock, so that notebooks executing side by side can load the same run at once
            read_only = not self.config.overwrite and is_complete(self.run_dir)
            if self.writer and not read_only:
                check_stop(self.run_dir, self.config.epochs)  # a task cancelled before it started takes no lock
                self._make_folder()
                lock = RunLock(self.run_dir)
                self._acquire(lock)
                self._stack.callback(lock.release)
                self._stack.enter_context(interruptible(self.run_dir, self.config.epochs))
            self._apply_policy()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        return bool(self._stack.__exit__(kind, error, traceback))

    def _acquire(self, lock: RunLock) -> None:
        """Take the run folder's lock; a resumed run waits for a live writer (checking every
        :data:`LOCK_POLL_SECONDS` whether the code that started it asked it to stop), a new one fails at once."""
        waiting = False
        while True:
            try:
                lock.acquire()
                return
            except RunLockedError:
                if not self.config.resume:
                    raise
                if not waiting:
                    print(f"waiting: {lock.describe_holder()}; resume continues once it ends", file=sys.stderr)
                    waiting = True
            time.sleep(LOCK_POLL_SECONDS)
            check_stop(self.run_dir, self.config.epochs)

    def _make_folder(self) -> None:
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise records.RecordWriteError(f"cannot create the run folder {self.run_dir}: {error.strerror}") from error

    def _apply_policy(self) -> None:
        config, run_dir = self.config, self.run_dir
        stored = read_config_record(run_dir)
        requested = config.to_dict()
        differing = differing_fields(stored, requested) if stored is not None else {}
        if differing and not config.overwrite:
            raise RunConflictError(
                f"run folder {run_dir} holds a run with another configuration ({describe_differences(differing)}); "
                "choose another run_name or study, or pass --overwrite (overwrite=True) to replace it"
            )
        if config.overwrite:
            if self.writer and any((run_dir / name).exists() for name in RECORD_FILES):
                warn(f"--overwrite: deleting the records of {run_dir} before training")
                for name in RECORD_FILES:
                    (run_dir / name).unlink(missing_ok=True)
            return
        if is_complete(run_dir):
            self.reusable = True
            return
        stale = chosen_in_warmup(run_dir) if (run_dir / "checkpoint.pt").is_file() else None
        if stale is not None:
            if self.writer:
                warn(
                    f"{run_dir} reports warm-up epoch {stale}, chosen before warm-up evaluations stopped counting "
                    "(docs/protocol.md, 2026-11-26); deleting its records and training it again"
                )
                for name in RECORD_FILES:
                    (run_dir / name).unlink(missing_ok=True)
            return
        checkpoint = run_dir / "checkpoint.pt"
        if checkpoint.is_file():
            if config.resume:
                self.resume_from = checkpoint
            elif self.writer:
                warn(
                    f"{run_dir} holds an interrupted run of this configuration; starting it again from epoch 1 "
                    "(pass --resume / resume=True to continue it instead)"
                )
        elif config.resume and self.writer:
            self._point_at_siblings()

    def _point_at_siblings(self) -> None:
        """``resume`` with nothing to resume: say so when runs of the same label with other settings exist."""
        label = self.run_dir.name[: -len(identity_hash(self.config.to_dict())) - 1]
        for sibling in sorted(self.run_dir.parent.glob(f"{label}-" + "?" * 8)):
            stored = read_config_record(sibling) if sibling != self.run_dir else None
            if stored is not None:
                changes = describe_differences(differing_fields(stored, self.config.to_dict()))
                warn(
                    f"resume: no run of this configuration yet ({self.run_dir.name}); {sibling.name} holds one with other "
                    f"settings ({changes}); starting a new run"
                )
                return

    def write_start_records(self, environment: Mapping[str, Any]) -> None:
        """``config.yaml`` and ``environment.json`` of a run that is about to train."""
        if self.writer:
            # resume/overwrite are actions, not configuration: the record holds them off, so that
            # `dmlstudy train --config <run>/config.yaml --resume` continues the run and never deletes it
            values = {**self.config.to_dict(), **dict.fromkeys(ACTIONS, False)}
            origins = {key: origin for key, origin in origins_of(self.config).items() if key not in ACTIONS}
            records.write_bytes_atomically(self.run_dir / "config.yaml", config_record_text(values, origins).encode())
            records.write_json(self.run_dir / "environment.json", dict(environment))
