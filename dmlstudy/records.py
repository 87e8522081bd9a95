"""Run records: seeding, environment capture and atomic writes.

Every run leaves ``config.yaml``, ``metrics.json``, ``history.csv``, ``environment.json`` (git revision,
package versions, device, numerics: :func:`dmlstudy.numerics.observed`) and its checkpoint in one folder; files are written atomically (temp file +
rename) so a killed run never leaves a half-written record.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import platform
import random
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from dmlstudy import numerics

RECORDED_PACKAGES = (
    "torch",
    "torchvision",
    "timm",
    "numpy",
    "faiss-cpu",
    "pytorch-metric-learning",
    "scikit-learn",
    "papermill",
    "dmlstudy",
)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA); the one seeding function of the project."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def git_revision(folder: Path | None = None) -> str:
    """``<sha>`` of HEAD, with ``+dirty`` when a tracked file's content differs from HEAD (staged or not), as
    git's filters see it: a notebook saved with outputs is not a change (``.gitattributes``); ``unknown``
    outside git.

    The index is refreshed first (``git update-index --refresh``, as ``git status`` does): ``git diff`` runs
    the notebook filter on every file whose stat differs from the index (every file of a fresh clone, whose
    checkout and index share a second) and does not write the new stat back, so without the refresh the
    filter (~2 s a notebook) ran at every run's start: 16 s per call in a fresh clone, 3 ms after one refresh.
    (``git status`` cannot replace the diff: it calls a notebook saved with outputs modified.)"""
    try:
        cwd = str(folder) if folder else None
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, cwd=cwd
        ).stdout.strip()
        subprocess.run(["git", "update-index", "-q", "--refresh"], capture_output=True, cwd=cwd)  # may fail: read-only
        dirty = subprocess.run(
            ["git", "diff", "--name-only", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=cwd,
        ).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def environment_info(device: str = "cpu") -> dict[str, Any]:
    versions = {}
    for package in RECORDED_PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "git_revision": git_revision(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": device,
        "cuda_device": torch.cuda.get_device_name(0) if device.startswith("cuda") else None,
        **numerics.observed(device),
        "packages": versions,
    }


def run_numerics(run_dir: str | Path) -> str:
    """The numerics tag a run recorded in its ``environment.json`` (:mod:`dmlstudy.numerics`); ``unrecorded`` for a
    run made before runs recorded it, or whose record is missing."""
    try:
        return str(json.loads((Path(run_dir) / "environment.json").read_text()).get("numerics", "unrecorded"))
    except (OSError, ValueError):
        return "unrecorded"


class RecordWriteError(OSError):
    """A record could not be written; the message names the file, the reason and the bytes it needed
    (``errno`` and ``filename`` are those of the original error)."""

    def __str__(self) -> str:
        return str(self.args[0])


class _WriteGuard:
    """Signals that arrive while a record is being written wait until the write has finished, so an
    interrupted run never loses a record to a half-done rename (see :func:`defer_while_writing`)."""

    depth = 0
    pending: Callable[[], None] | None = None


@contextlib.contextmanager
def uninterruptible() -> Iterator[None]:
    """Signals handled with :func:`defer_while_writing` wait until the block ends (nesting allowed): for
    records that belong together, such as an epoch's ``history.csv`` and its checkpoint."""
    _WriteGuard.depth += 1
    try:
        yield
    finally:
        _WriteGuard.depth -= 1
        if _WriteGuard.depth == 0 and _WriteGuard.pending is not None:
            action, _WriteGuard.pending = _WriteGuard.pending, None
            action()


def defer_while_writing(action: Callable[[], None]) -> bool:
    """Postpone ``action`` (a signal handler's work) until the atomic write in progress ends; returns
    False (and does nothing) when no write is in progress, so the caller acts at once."""
    if _WriteGuard.depth == 0:
        return False
    _WriteGuard.pending = action
    return True


_SPACE_ERRORS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}
_ACCESS_ERRORS = {
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "read-only file system",
}


def _explained(error: OSError, path: Path, size: int) -> OSError:
    """``error`` rewritten as a :class:`RecordWriteError` naming ``path`` and ``size`` (other errors as they are)."""
    if error.errno in _SPACE_ERRORS:
        try:
            free = f"{shutil.disk_usage(path.parent).free:,} bytes free there"
        except OSError:
            free = "free space unknown"
        explained = RecordWriteError(
            f"cannot write {path}: {_SPACE_ERRORS[error.errno]} ({size:,} bytes needed, {free})"
        )
    elif error.errno in _ACCESS_ERRORS:
        explained = RecordWriteError(f"cannot write {path}: {_ACCESS_ERRORS[error.errno]} ({size:,} bytes to write)")
    else:
        return error
    explained.errno, explained.filename = error.errno, str(path)
    return explained


def _write_all(handle: int, data: bytes) -> None:
    """Write every byte of ``data`` to the open file descriptor (tests replace it to simulate a full disk)."""
    view = memoryview(data)
    while view:
        view = view[os.write(handle, view) :]


def write_bytes_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, flush it to disk, then rename it over ``path``.

    A reader sees the old file or the new one, never a part. The payload is serialized in memory first, so
    its size is known and a full disk or a missing permission becomes a :class:`RecordWriteError` naming
    the file and the bytes needed (``torch.save`` straight to disk reported a full disk as
    ``RuntimeError: [enforce fail at inline_container.cc] unexpected pos``). Signals wait for the rename.
    """
    path = Path(path)
    temporary = None
    with uninterruptible():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            try:
                _write_all(handle, data)
                os.fsync(handle)
            finally:
                os.close(handle)
            os.replace(temporary, path)
        except OSError as error:
            explained = _explained(error, path, len(data))
            if explained is error:  # "raise error from error" makes a cause cycle that tracebacks never finish
                raise
            raise explained from error
        finally:
            if temporary is not None and os.path.exists(temporary):
                os.unlink(temporary)


def write_json(path: Path, payload: Any) -> None:
    write_bytes_atomically(path, (json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n").encode())


def write_yaml(path: Path, payload: Any) -> None:
    write_bytes_atomically(path, yaml.safe_dump(payload, sort_keys=False).encode())


def write_csv(path: Path, frame: Any) -> None:
    """A ``pandas.DataFrame`` as CSV without its index, atomically."""
    write_bytes_atomically(path, frame.to_csv(index=False).encode())


def write_npz(path: Path, arrays: dict[str, Any]) -> None:
    """``numpy.savez`` of ``arrays``, atomically."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    write_bytes_atomically(path, buffer.getvalue())


def save_torch(path: Path, payload: Any) -> None:
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    write_bytes_atomically(path, buffer.getvalue())
