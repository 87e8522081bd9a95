"""Study plans: which notebooks run with which parameters, and whether an entry is up to date (the execution:
:mod:`dmlstudy.study.executor`; the tables of their runs: :mod:`dmlstudy.study.report`).

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
parameter (:data:`PROTOCOL_PARAMETER`, a mapping of :class:`~dmlstudy.run.protocol.ProtocolConfig`
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
``runs/default/`` that ``runs/<study>/`` lacks before the first entry (:func:`dmlstudy.run.identity.copy_finished_runs`),
so a plan that adds seeds to the default study trains only the new ones. A run folder's name carries its
identity hash and ``study`` is not part of the identity, so a copied folder is loaded only by a run of the
same configuration; with ``--overwrite`` nothing is copied.

Plans resume by default: ``resume=True`` is injected into every notebook that declares ``resume`` (unless
the entry sets it), so an entry whose notebook was stopped continues its interrupted runs, and runs that
finished are loaded, never retrained. ``overwrite`` (``dmlstudy study run --overwrite``) executes every
entry again and injects ``overwrite=True`` where declared: the only way a plan replaces finished records.
Plans are read with :func:`dmlstudy.config.load_yaml` (``lr: 1e-3`` is a float).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dmlstudy.config import load_yaml
from dmlstudy.paths import project_root
from dmlstudy.run.identity import SELECTION_RULE
from dmlstudy.study.progress import shown_path


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


def read_plan(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise PlanError(f"plan file not found: {path}")
    try:
        plan = load_yaml(path.read_text()) or {}
    except Exception as error:  # yaml.YAMLError: the message holds the line and column
        raise PlanError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(plan, dict) or not isinstance(plan.get("entries"), list):
        raise PlanError(f"{path}: expected a mapping with 'study' and a list of 'entries'")
    return plan


def reused_study(plan: dict[str, Any], path: Path) -> str:
    """The plan's ``reuse_runs_of``: another study whose finished run folders this one starts from ('' if none)."""
    value = plan.get("reuse_runs_of") or ""
    if not isinstance(value, str) or "/" in value or value == str(plan.get("study") or path.stem):
        raise PlanError(f"{path}: 'reuse_runs_of' must name another study (a folder of runs/), got {value!r}")
    return value


def concurrent_entries(plan: dict[str, Any], path: Path) -> int:
    """The plan's ``concurrent_entries``: how many entries execute side by side (default 1)."""
    value = plan.get("concurrent_entries", 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"{path}: 'concurrent_entries' must be an integer ≥ 1, got {value!r}")
    return value


def plan_study(path: str | Path) -> str:
    """The study a plan's runs go to: its ``study``, else the plan file's stem."""
    path = Path(path)
    return str(read_plan(path).get("study") or path.stem)


def load_plan(path: str | Path) -> list[PlanEntry]:
    """Read a plan file and expand every entry's grid into :class:`PlanEntry` objects."""
    path = Path(path)
    return plan_entries(read_plan(path), path)


def plan_entries(plan: dict[str, Any], path: Path) -> list[PlanEntry]:
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


def entry_inputs(parameters: dict[str, Any], notebook: Path | None = None) -> dict[str, str]:
    """What an entry reads besides its parameters and its runs: the revision of the checkpoint-selection rule
    (:data:`dmlstudy.run.identity.SELECTION_RULE`, so that the entries run again, and retrain the runs the new rule
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


def is_up_to_date(record: Path, parameters: dict[str, Any], notebook: Path | None = None) -> bool:
    """Whether ``record`` (an entry's ``study_entry.json``) says complete with these parameters and inputs."""
    if not record.is_file():
        return False
    stored = json.loads(record.read_text())
    return (
        stored.get("status") == "complete"
        and stored.get("parameters") == json.loads(json.dumps(parameters, default=str))
        and stored.get("inputs", {}) == entry_inputs(parameters, notebook)
    )


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
