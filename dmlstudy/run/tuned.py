"""The tuned-values files ``plans/tuned/<dataset>.yaml``: what :mod:`dmlstudy.study.tuning` writes after a search and
what the study reads back for every row it trains (:meth:`dmlstudy.run.protocol.ProtocolConfig.tuned_values`).

A file is ``{dataset: <name>, rows: {<row>: {overrides: {…}, val_R@1: …, trials: …}}}``, checked against the
declared search spaces (:mod:`dmlstudy.search_space`) whenever it is read. Reading needs neither Optuna nor the
tuning driver, so the study's protocol imports this module and not :mod:`dmlstudy.study.tuning`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dmlstudy import search_space as search
from dmlstudy.config import load_yaml
from dmlstudy.methods import VARIANT_SEARCH_SPACES, list_methods, search_space

OBJECTIVE = "val_R@1"  # best validation R@1 of a run (metrics.json) and its per-epoch column (history.csv)


def list_rows() -> list[str]:
    """Every tunable row: the registered methods and the variants with a declared search space."""
    return [*list_methods(), *sorted(VARIANT_SEARCH_SPACES)]


@dataclass
class RowResult:
    """The outcome of one (dataset, row) study: its best trial's overrides and value, and every trial's value."""

    dataset: str
    row: str
    overrides: dict[str, Any]
    value: float
    trials: int
    values: list[float | None]  # per trial number: the objective of a complete trial, None otherwise
    seconds: float


class TunedValuesError(ValueError):
    """A tuned-values file that does not match the declared search spaces (names the file, key and type)."""


def write_tuned(
    path: Path, dataset: str, results: list[RowResult], header: dict[str, str], *, regime: str = "scratch"
) -> Path:
    """Write (or update: rows tuned now replace theirs, others are kept) the tuned values of ``dataset`` in
    ``regime``."""
    rows = _read_tuned(path)["rows"] if path.is_file() else {}
    for result in results:
        rows[result.row] = {"overrides": result.overrides, OBJECTIVE: round(result.value, 6), "trials": result.trials}
    comment = "".join(f"# {key}: {value}\n" for key, value in header.items())
    text = (
        f"# Tuned hyperparameters on {dataset}'s validation classes, {regime} regime (best validation R@1 of each row's "
        "Optuna study).\n"
        f"# Regenerate with `make tune`; the study reads them through dmlstudy.run.tuned.tuned_overrides.\n{comment}"
        + yaml.safe_dump({"dataset": dataset, "rows": dict(sorted(rows.items()))}, sort_keys=False)
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _expected(parameter: search.Parameter) -> tuple[str, Callable[[Any], bool]]:
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
    if isinstance(parameter, (search.LogFloat, search.Float)):
        return "float", number
    if isinstance(parameter, search.Int):
        return "int", lambda v: isinstance(v, int) and not isinstance(v, bool)
    return f"one of {list(parameter.choices)}", lambda v: v in parameter.choices


def _read_tuned(path: Path) -> dict[str, Any]:
    """Parse and validate a tuned-values file against the declared spaces."""
    try:
        content = load_yaml(path.read_text())
    except yaml.YAMLError as error:
        raise TunedValuesError(f"{path}: not valid YAML ({error})") from None
    if not isinstance(content, dict) or not isinstance(content.get("rows"), dict):
        raise TunedValuesError(f"{path}: key 'rows' must be a mapping of row name to tuned values")
    for row, entry in content["rows"].items():
        if row not in list_rows():
            raise TunedValuesError(f"{path}: key 'rows.{row}': unknown row (expected one of {list_rows()})")
        if not isinstance(entry, dict) or not isinstance(entry.get("overrides"), dict):
            raise TunedValuesError(f"{path}: key 'rows.{row}.overrides' must be a mapping")
        space = search_space(row)
        for key, value in search.flattened(entry["overrides"]).items():
            if key not in space:
                raise TunedValuesError(
                    f"{path}: key 'rows.{row}.overrides.{key}' is not in {row}'s search space {sorted(space)}"
                )
            expected, valid = _expected(space[key])
            if not valid(value):
                raise TunedValuesError(
                    f"{path}: key 'rows.{row}.overrides.{key}' must be {expected}, got {type(value).__name__} {value!r}"
                )
    return content


def tuned_file(folder: str | Path, dataset: str) -> Path:
    """Where ``make tune`` writes the tuned values of ``dataset``: ``<folder>/<dataset>.yaml``."""
    return Path(folder) / f"{dataset}.yaml"


def tuned_overrides(path: str | Path, dataset: str, row: str) -> dict[str, Any]:
    """The tuned TrainConfig overrides of ``row`` on ``dataset`` (nested: ``{"lr": …, "method_kwargs": {…}}``;
    merge into the row's spec with :func:`dmlstudy.search_space.merged`).

    ``path`` is a tuned-values file or the folder of ``<dataset>.yaml`` files. A missing file or a row absent
    from it gives ``{}`` (the paper defaults); an unknown row or a value of the wrong type raises
    :class:`TunedValuesError` naming the file, the key and the expected type.
    """
    path = Path(path)
    file = tuned_file(path, dataset) if path.is_dir() or not path.suffix else path
    if not file.is_file():
        return {}
    content = _read_tuned(file)
    if content.get("dataset", dataset) != dataset:
        raise TunedValuesError(f"{file}: key 'dataset' must be {dataset!r}, got {content['dataset']!r}")
    entry = content["rows"].get(row)
    return {} if entry is None else search.nested(search.flattened(entry["overrides"]))
