"""Where data, runs and a study's outputs live: ``<project>/data``, ``<project>/runs``, and the published
study's ``<project>/figures`` and ``<project>/results``.

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


def project_file(path: str | Path) -> Path:
    """``path`` as given when it is absolute or exists from the working directory, else from the project root:
    a plan or the pretrained regime names ``weights/…`` once, and a notebook run from ``notebooks/``, a Dask
    worker and the CLI all find the same file (and the run's recorded configuration stays machine-independent)."""
    path = Path(path)
    if path.is_absolute() or path.exists():
        return path
    return project_root() / path


def data_root() -> Path:
    return project_root() / "data"


def runs_root() -> Path:
    return project_root() / "runs"


PUBLISHED_STUDY = "default"  # the study whose figures and tables the repository holds (``make study``)
PUBLISHED_STUDIES = (
    PUBLISHED_STUDY,
    "embedded",
    "headline10",
    "convergence",
    "sequential",
    "confirm",
    "confirm_dgcrl",
    "robust_partitions",
    "robust_budget",
    "robust_epochs30",
    "robust_224",
    "robust_designers",
    "robustness",
)  # every study whose outputs are committed


def study_outputs(study: str, kind: str, *, runs_root_override: str | Path = "") -> Path:
    """Folder for a study's ``kind`` of output (``"figures"`` or ``"results"``).

    The published study writes to ``<project>/figures`` and ``<project>/results``, the other committed ones
    (:data:`PUBLISHED_STUDIES`: the generated datasets in their two regimes, the headline claims with 10 seeds,
    DGCRL vs triplet under a 30-epoch cap, the sequential design on emoji and its confirmatory studies of CRT > MS
    and DGCRL > lifted structure) to ``<project>/<kind>/<study>``; any other study (the CI-sized notebook
    defaults, the smoke and full plans) to ``<runs>/<study>/<kind>``, so test runs never overwrite the committed
    figures.
    """
    if kind not in ("figures", "results"):
        raise ValueError(f"study_outputs: kind must be 'figures' or 'results', got {kind!r}")
    if study == PUBLISHED_STUDY:
        return project_root() / kind
    if study in PUBLISHED_STUDIES:
        return project_root() / kind / study
    return Path(runs_root_override or runs_root()) / study / kind
