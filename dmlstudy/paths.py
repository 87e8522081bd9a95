"""Where data, runs and a study's outputs live: ``<project>/data``, ``<project>/runs``, and the published
study's ``<project>/figures`` and ``<project>/results``. Runs go elsewhere when ``$DMLSTUDY_RUNS`` names a folder.

The project root is ``$DMLSTUDY_HOME`` if set, else the nearest folder at or above the working directory
that holds this project's ``pyproject.toml`` (so notebooks executed from ``notebooks/`` share the data
and runs of the repository), else the working directory.
"""

from __future__ import annotations

import functools
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


RUNS_VARIABLE = "DMLSTUDY_RUNS"  # another folder for runs/ (nbval's notebook kernels: a fresh one per test run)


def runs_root() -> Path:
    """``$DMLSTUDY_RUNS`` if set, else ``<project>/runs``."""
    if os.environ.get(RUNS_VARIABLE):
        return Path(os.environ[RUNS_VARIABLE]).resolve()
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


GENERATED_DATA_STUDIES = ("embedded", "headline10", "convergence")  # published studies on generated sets only
PUBLISH_DIFFERENT_BUILD = "DMLSTUDY_PUBLISH_DIFFERENT_BUILD"  # "1": a differing emoji build still writes the outputs


def different_build() -> str:
    """'' when the emoji build under the data root may write the published outputs: it is the published build (its
    fingerprint equals the committed one), none is built yet, or ``$DMLSTUDY_PUBLISH_DIFFERENT_BUILD`` is ``1``;
    else the sentence saying how it differs (:func:`dmlstudy.data.emoji_checks.fingerprint_difference`).

    Decision: tables and figures of another build are not the published study's, so a differing build writes them
    beside its runs until the user says otherwise; the generated sets are byte-identical everywhere and have no
    such check."""
    if os.environ.get(PUBLISH_DIFFERENT_BUILD, "") == "1":
        return ""
    built = data_root() / "emoji" / "fingerprint.tsv"
    if not built.is_file():
        return ""
    return _build_difference(str(built), built.stat().st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _build_difference(built: str, modified: int) -> str:
    from dmlstudy.data.emoji import PUBLISHED_FINGERPRINT
    from dmlstudy.data.emoji_checks import fingerprint_difference, read_fingerprint

    return fingerprint_difference(Path(built).read_text(encoding="utf-8"), read_fingerprint(PUBLISHED_FINGERPRINT))


def different_numerics() -> str:
    """'' when this process computes under the published study's pinned numerics (:mod:`dmlstudy.numerics`) or
    ``$DMLSTUDY_PUBLISH_DIFFERENT_BUILD`` is ``1``; else the sentence saying which numerics it uses instead.

    Decision: digits of other kernels are not the published study's, so they go beside the runs, as another emoji
    build's do."""
    from dmlstudy import numerics

    if os.environ.get(PUBLISH_DIFFERENT_BUILD, "") == "1" or numerics.mode() == "pinned":
        return ""
    return f"{numerics.MODE_VARIABLE}={numerics.mode()}: each library's own kernels, not the published {numerics.PINNED_TAG}"


def different_build_message(study: str) -> str:
    """What a published study says when :func:`different_build` or :func:`different_numerics` keeps its outputs
    beside its runs ('' otherwise)."""
    if study not in PUBLISHED_STUDIES:
        return ""
    reasons = []
    build = different_build() if study not in GENERATED_DATA_STUDIES else ""
    if build:
        reasons.append(f"emoji: the build in {data_root() / 'emoji'} differs from the published build ({build})")
    numerics = different_numerics()
    if numerics:
        reasons.append(f"numerics: this process runs with {numerics}")
    if not reasons:
        return ""
    where = ", ".join(str(study_outputs(study, kind)) for kind in OUTPUT_KINDS)
    return (
        f"{'; '.join(reasons)}, so study {study!r} writes its tables, figures and published notebooks to {where}, "
        f"not into the repository's folders. To write them there anyway: make study PUBLISH_DIFFERENT_BUILD=1 (or "
        f"{PUBLISH_DIFFERENT_BUILD}=1 in the environment)."
    )


OUTPUT_KINDS = ("results", "figures", "published")


def study_outputs(study: str, kind: str, *, runs_root_override: str | Path = "") -> Path:
    """Folder for a study's ``kind`` of output (``"figures"``, ``"results"`` or ``"published"``: its executed
    notebooks, :mod:`dmlstudy.study.publish`).

    The published study writes to ``<project>/figures``, ``<project>/results`` and ``<project>/published``, the
    other committed ones (:data:`PUBLISHED_STUDIES`: the generated datasets in their two regimes, the headline
    claims with 10 seeds, DGCRL vs triplet under a 30-epoch cap, the sequential design on emoji and its
    confirmatory studies of CRT > MS and DGCRL > lifted structure) to ``<project>/<kind>/<study>``; any other
    study (the CI-sized notebook defaults, the smoke and full plans) to ``<runs>/<study>/<kind>``, so test runs
    never overwrite the committed figures. So does a published study on emoji when the emoji build on disk differs
    from the published one (:func:`different_build`), and any published study run under other numerics than the
    published pinned ones (:func:`different_numerics`).
    """
    if kind not in OUTPUT_KINDS:
        raise ValueError(f"study_outputs: kind must be one of {list(OUTPUT_KINDS)}, got {kind!r}")
    if (
        study in PUBLISHED_STUDIES
        and not different_numerics()
        and (study in GENERATED_DATA_STUDIES or not different_build())
    ):
        return project_root() / kind if study == PUBLISHED_STUDY else project_root() / kind / study
    return Path(runs_root_override or runs_root()) / study / kind
