"""Tables of a study's runs: one row per finished run (:func:`gather_runs`), mean ± std over the seeds of each
configuration (:func:`summarize`), written as CSV and Markdown (:func:`write_table`).

``study table`` groups runs by configuration: the ``--by`` columns plus every configuration field that
varies among the gathered runs (:func:`configuration_columns`), so runs of different settings are never
averaged together as if they were seeds. Each entry's kernel notes the runs it reports in the entry's
``runs.txt``; a run folder that no entry reported, beside one of the same run name that one did (the run
under older tuned values), is left out and named (:func:`dmlstudy.run.identity.superseded_runs`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from dmlstudy.config import load_yaml
from dmlstudy.paths import runs_root
from dmlstudy.run.identity import superseded_runs
from dmlstudy.verdicts import PERCENT_METRICS


def configuration_columns(frame: pd.DataFrame, by: Iterable[str]) -> list[str]:
    """Configuration fields (from ``config.yaml``) that vary among the gathered runs, other than ``by``,
    ``seed`` and the fields that do not change results: grouping by ``by`` plus these keeps runs of
    different settings apart. Metric columns, ``run_dir`` and ``config_hash`` are not configuration."""
    from dmlstudy.run.identity import NON_IDENTITY_FIELDS

    fields = [c for c in frame.columns if c in getattr(frame, "attrs", {}).get("config_columns", [])]
    skip = {*by, "seed", *NON_IDENTITY_FIELDS}
    return [c for c in fields if c.split(".")[0] not in skip and frame[c].astype(str).nunique(dropna=False) > 1]


def configuration_text(table: pd.DataFrame, columns: Iterable[str]) -> pd.Series:
    """One readable cell per row naming its settings among ``columns`` (:func:`configuration_columns`):
    ``"lr=0.00125, num_blocks=5"``. A field the row's runs do not have (another method's keyword argument) or
    leave empty is not named; ``method_kwargs.`` is dropped from names, floats keep 3 significant digits and a
    file path its name. The tables' Markdown shows this instead of one mostly empty column per field."""

    def shown(value: Any) -> str | None:
        if value is None or (isinstance(value, float) and math.isnan(value)) or value == "":
            return None
        if isinstance(value, float):
            return f"{value:.3g}"
        if isinstance(value, str) and "/" in value:
            return Path(value).name
        return str(value)

    columns = list(columns)
    return pd.Series(
        [
            ", ".join(
                f"{column.removeprefix('method_kwargs.')}={text}"
                for column in columns
                if (text := shown(row[column])) is not None
            )
            for _, row in table[columns].iterrows()
        ]
        if columns
        else [""] * len(table),
        index=table.index,
        dtype=object,
    )


def _flatten(prefix: str, value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return {
            k: v for key, item in value.items() for k, v in _flatten(f"{prefix}.{key}" if prefix else key, item).items()
        }
    return {prefix: json.dumps(value) if isinstance(value, list) else value}


def gather_runs(study: str, *, root: str | Path | None = None) -> pd.DataFrame:
    """One row per finished run of a study: its config fields (``method_kwargs.K1``, …) and metrics.

    Runs a newer configuration of the same run has replaced (:func:`dmlstudy.run.identity.superseded_runs`: older
    tuned values, an older protocol) are left out and listed, by folder name, in ``attrs["superseded"]``."""
    root = Path(root) if root else runs_root()
    superseded = superseded_runs(root / study)
    rows, config_columns = [], set()
    for metrics_file in sorted((root / study).glob("**/metrics.json")):
        if metrics_file.parent.name in superseded and metrics_file.parent.parent == root / study:
            continue
        config_file = metrics_file.parent / "config.yaml"
        config = (load_yaml(config_file.read_text()) or {}) if config_file.is_file() else {}
        flat = _flatten("", config)
        config_columns.update(flat)
        rows.append({**flat, **json.loads(metrics_file.read_text()), "run_dir": str(metrics_file.parent)})
    frame = pd.DataFrame(rows)
    frame.attrs["config_columns"] = sorted(config_columns)
    frame.attrs["superseded"] = sorted(superseded)
    return frame


def mean_std_text(mean: float, std: float, runs: int, *, decimals: int = 1) -> str:
    """``"mean ± std"`` over ``runs`` seeds; one run has no spread to show, so just ``"mean"``."""
    return f"{mean:.{decimals}f} ± {std:.{decimals}f}" if runs > 1 else f"{mean:.{decimals}f}"


def seed_text(seeds: Iterable[Any]) -> str:
    """The distinct seeds, sorted, as ``0, 1, 2``."""
    return ", ".join(str(int(s)) for s in sorted(set(seeds)))


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
