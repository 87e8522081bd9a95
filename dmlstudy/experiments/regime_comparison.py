"""The comparison across regimes: what it computes in one regime (:class:`RegimeComparison`), every regime's
claims in one table, and what the headline regime changes row by row (Δ R@1 against each compared regime)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dmlstudy import verdicts
from dmlstudy.rows import method_label
from dmlstudy.run.protocol import ProtocolConfig
from dmlstudy.study.report import write_table


@dataclass
class RegimeComparison:
    """What the comparison computes in one regime: the protocol it ran under (its ``regime``), its runs, run rows,
    table with the note printed beside it (:func:`~dmlstudy.experiments.tables.table_note`) and judged claims."""

    protocol: ProtocolConfig
    note: str
    main: list
    classic: list
    frame: pd.DataFrame
    table: pd.DataFrame
    claims: pd.DataFrame
    runs: pd.DataFrame  # the runs the claims read (claims.claims_frame), one row per run


def all_runs(comparisons: Sequence[RegimeComparison]) -> pd.DataFrame:
    """The runs every regime's claims read, with a ``regime`` column (for :func:`~dmlstudy.findings.claims.
    per_seed_table`)."""
    return pd.concat([c.runs.assign(regime=c.protocol.regime) for c in comparisons], ignore_index=True)


def all_claims(comparisons: Sequence[RegimeComparison]) -> pd.DataFrame:
    """Every regime's claims in one table: claim by claim in ``claims.yaml`` order, the regimes side by side."""
    table = pd.concat([c.claims for c in comparisons], ignore_index=True)
    order = {
        column: {value: i for i, value in enumerate(dict.fromkeys(table[column]))}
        for column in ("claim", "dataset", "regime")
    }
    return table.sort_values(list(order), key=lambda column: column.map(order[column.name]), kind="stable").reset_index(
        drop=True
    )


REGIME_COLUMNS = ["method", "variant", "dataset", "A", "B", "Δ", "CI low", "CI high", "seeds", "verdict", "outcome"]


def regime_differences(comparisons: Sequence[RegimeComparison], *, margin: float = verdicts.MARGIN) -> pd.DataFrame:
    """What the headline regime changes, row by row: for every row and dataset of both the headline regime
    (A, first of ``comparisons``) and each compared regime (B), the per-seed paired Δ R@1 = A_s − B_s, its
    t-interval and the study's verdict (:func:`verdicts.judge`). Seed s gives both regimes the same batch sequence;
    the backbones differ by design (pretrained weights vs random initialisation). ``pretrained > scratch`` for
    ``ms`` is the transfer check: is the pretraining worth anything on this dataset?"""
    first, rows = comparisons[0], []
    for other in comparisons[1:]:
        tag = {first.protocol.regime: "A", other.protocol.regime: "B"}
        frame = pd.concat(
            [c.frame.assign(variant=c.frame["variant"] + "@" + tag[c.protocol.regime]) for c in (first, other)],
            ignore_index=True,
        )
        for variant in dict.fromkeys(first.frame["variant"]):
            for dataset in dict.fromkeys(first.frame["dataset"]):
                try:
                    paired = verdicts.paired_differences(frame, dataset, f"{variant}@A", f"{variant}@B")
                except KeyError:
                    continue
                verdict = verdicts.judge(paired.differences, margin=margin)
                rows.append(
                    {
                        "method": method_label(variant),
                        "variant": variant,
                        "dataset": dataset,
                        "A": first.protocol.regime,
                        "B": other.protocol.regime,
                        **verdict.columns(),
                    }
                )
    return pd.DataFrame(rows, columns=REGIME_COLUMNS)


def write_regime_differences(
    table: pd.DataFrame, folder: str | Path, *, regimes: Sequence[str], margin: float = verdicts.MARGIN
) -> list[Path]:
    """``regimes.csv`` and ``.md`` under ``folder`` (Δ R@1 points, headline regime − compared regime, per row and
    dataset): ``table`` is :func:`regime_differences` of the comparisons in ``regimes`` (the headline first),
    judged with ``margin``."""
    csv_path, md_path = write_table(table, Path(folder) / "regimes")
    shown = table.drop(columns=["variant", "outcome"])
    headline, *compared = regimes
    md_path.write_text(
        "# What the regime changes: Δ R@1 = A − B per row and dataset\n\n"
        f"A = {headline} regime, B = {', '.join(compared)}; per-seed paired differences (same "
        f"batch sequence, the backbone's start differs), {round(100 * verdicts.CONFIDENCE)} % t-interval, verdict by the "
        f"study's rule (margin ±{margin:g}).\n\n" + shown.to_markdown(index=False) + "\n"
    )
    return [csv_path, md_path]
