"""Where data and runs live: ``<project>/data`` and ``<project>/runs``.

The project root is ``$DMLSTUDY_HOME`` if set, else the nearest folder at or above the working directory
that holds this project's ``pyproject.toml`` (so notebooks executed from ``notebooks/`` share the data
and runs of the repository), else the working directory.
"""
from __future__ import annotations

import os
from pathlib import Path


def project_root() -> Path:
    if os.environ.get("DMLSTUDY_HOME"):
        return Path(os.environ["DMLSTUDY_HOME"]).resolve()
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        manifest = folder / "pyproject.toml"
        if manifest.is_file() and 'name = "dmlstudy"' in manifest.read_text(encoding="utf-8", errors="ignore"):
            return folder
    return here


def data_root() -> Path:
    return project_root() / "data"


def runs_root() -> Path:
    return project_root() / "runs"
