"""Run records: seeding, environment capture and atomic writes.

Every run leaves ``config.yaml``, ``metrics.json``, ``history.csv``, ``environment.json`` (git revision,
package versions, device) and its checkpoint in one folder; files are written atomically (temp file +
rename) so a killed run never leaves a half-written record.
"""
from __future__ import annotations

import json
import os
import platform
import random
import subprocess
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import yaml

RECORDED_PACKAGES = ("torch", "torchvision", "timm", "numpy", "faiss-cpu", "pytorch-metric-learning", "scikit-learn", "papermill", "dmlstudy")


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA); the one seeding function of the project."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def git_revision(folder: Path | None = None) -> str:
    """``<sha>`` of HEAD, with ``+dirty`` when the work tree has changes; ``unknown`` outside git."""
    try:
        cwd = str(folder) if folder else None
        sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, cwd=cwd).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, check=True, cwd=cwd).stdout.strip()
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
        "torch_threads": torch.get_num_threads(),
        "packages": versions,
    }


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    try:
        write(Path(temporary))
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def write_json(path: Path, payload: Any) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n"))


def write_yaml(path: Path, payload: Any) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(yaml.safe_dump(payload, sort_keys=False)))


def save_torch(path: Path, payload: Any) -> None:
    atomic_write(path, lambda tmp: torch.save(payload, tmp))
