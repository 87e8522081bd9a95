"""The papers' claims, headline and ablation (``claims.yaml``), judged on the study's runs by its one rule
(:mod:`dmlstudy.verdicts`: per-seed paired differences read by the claim's kind, the sequential design's looks,
Holm's adjustment across a regime's claims): the claims and the runs they read, the claims table with the
per-seed table it recomputes from, its Markdown and sentences, and the forest plot."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from dmlstudy import verdicts
from dmlstudy.config import load_yaml
from dmlstudy.findings import numbers as papers
from dmlstudy.findings.numbers import PAPER_DATASET
from dmlstudy.rows import method_grid
from dmlstudy.run.protocol import ProtocolConfig
from dmlstudy.run.regimes import regime
from dmlstudy.run.train import RunResult, selection_rule
from dmlstudy.study import sequential
from dmlstudy.study.grids import results_frame
from dmlstudy.study.report import seed_text, write_table

ABLATION_REGIMES = ("scratch", "imagenet")  # where the published plans' paper notebooks train their ablations

CLAIMS_SOURCE = Path(__file__).with_name("claims.yaml")
CLAIM_FIELDS = {
    "name",
    "kind",
    "a",
    "b",
    "runs",
    "source",
    "metric",
    "a_scale",
    "b_scale",
    "claimed",
    "margin",
    "paper_delta",
    "regimes",
}
NO_SELECTION = "last epoch (no validation classes: test classes evaluated during training)"
VERDICT_COLOURS = {  # the forest plot's colour per outcome
    "held": "#009e73",  # Okabe–Ito bluish green, vermillion, blue: distinct for colour-blind readers
    "reversed": "#d55e00",
    "not held": "#0072b2",
    "undecided": "#7f7f7f",
    "no verdict": "#c8c8c8",
}


@dataclass(frozen=True)
class Claim:
    """A claim "``a`` > ``b``" (or "≈", ``claimed``), judged on per-seed paired differences
    ``a_scale·a_s − b_scale·b_s`` of ``metric`` (:func:`dmlstudy.verdicts.paired_differences`,
    :func:`dmlstudy.study.sequential.judge_sequential`)."""

    name: str
    kind: str  # headline / ablation
    a: str
    b: str
    runs: str  # protocol: the comparison's datasets and seeds; ablation: ablation_datasets and ablation_seeds
    source: str  # where the claim comes from
    metric: str = "R@1"
    a_scale: float = 1.0
    b_scale: float = 1.0
    claimed: str = ">"
    margin: float | None = None  # None: the study's margin
    paper_delta: Mapping[str, Any] | None = None  # see claims.yaml
    regimes: tuple[
        str, ...
    ] = ()  # ablation claims: the regimes they are judged in (default ABLATION_REGIMES); headline: every regime

    def judged_in(self, regime_name: str) -> bool:
        """Whether this claim is judged in ``regime_name``: a headline claim or one on the protocol runs in every
        regime, an ablation claim on ablation runs in its ``regimes`` (default :data:`ABLATION_REGIMES`, where the
        published plans' paper notebooks train the ablations)."""
        return self.kind == "headline" or self.runs == "protocol" or regime_name in (self.regimes or ABLATION_REGIMES)

    @property
    def unit(self) -> str:
        return f"{self.metric} points" if verdicts.metric_scale(self.metric) != 1.0 else self.metric.replace("_", " ")

    def paper_difference(self, dataset: str) -> float | None:
        """The paper's own ``a_scale·a − b_scale·b`` for the paper dataset ``dataset`` stands beside, or None."""
        if not self.paper_delta:
            return None
        spec = self.paper_delta
        key = spec.get("datasets", {}).get(PAPER_DATASET.get(dataset, ""))
        if key is None:
            return None
        values = papers.load()[spec["paper"]]["tables"][spec["table"]]["values"]

        def at(path: Sequence[Any]) -> Any:
            value = values
            for step in path:
                value = value[key if step == "$dataset" else step]
            return value

        first, second = at(spec["a"]), at(spec["b"])
        if first is None or second is None:
            return None
        return round(self.a_scale * first - self.b_scale * second, 2)


def load_claims(path: str | Path = CLAIMS_SOURCE) -> tuple[Claim, ...]:
    """The claims of ``path`` (``claims.yaml``), each checked: known fields, kind, runs and claimed values."""
    path = Path(path)
    entries = (load_yaml(path.read_text()) or {}).get("claims") or []
    claims = []
    for index, entry in enumerate(entries):
        where = f"{path}: claims[{index}] ({entry.get('name', '?')!r})"
        unknown = sorted(set(entry) - CLAIM_FIELDS)
        missing = sorted({"name", "kind", "a", "b", "runs", "source"} - set(entry))
        if unknown or missing:
            raise ValueError(
                f"{where}: unknown keys {unknown}, missing keys {missing}; valid keys {sorted(CLAIM_FIELDS)}"
            )
        for key, allowed in (
            ("kind", ("headline", "ablation")),
            ("runs", ("protocol", "ablation")),
            ("claimed", (">", "≈")),
        ):
            if key in entry and entry[key] not in allowed:
                raise ValueError(f"{where}: {key} must be one of {allowed}, got {entry[key]!r}")
        if "regimes" in entry:
            entry = {**entry, "regimes": tuple(entry["regimes"])}
            for name in entry["regimes"]:
                regime(name)
        claims.append(Claim(**entry))
    return tuple(claims)


def claim_variants(path: str | Path = CLAIMS_SOURCE) -> dict[str, dict[str, Any]]:
    """Run name → spec of the ablation runs the claims read (``variants`` of ``claims.yaml``)."""
    return dict((load_yaml(Path(path).read_text()) or {}).get("variants") or {})


def claim_reranks(path: str | Path = CLAIMS_SOURCE) -> dict[str, dict[str, int]]:
    """Row name → ``top_k`` / ``grid`` overrides of the extra DIML re-rankings of the ``ms`` runs (``reranks``)."""
    return dict((load_yaml(Path(path).read_text()) or {}).get("reranks") or {})


CLAIMS: tuple[Claim, ...] = load_claims()


def ablation_grid(claims: Sequence[Claim] = CLAIMS) -> dict[str, dict[str, Any]]:
    """``{name: spec}`` of every run the ablation claims compare (both sides; the names of
    :func:`claim_variants` with their specs, the others as :func:`~dmlstudy.rows.method_grid` names
    them)."""
    specs = claim_variants()
    names = dict.fromkeys(name for claim in claims if claim.runs == "ablation" for name in (claim.a, claim.b))
    return {name: dict(specs[name]) if name in specs else method_grid([name])[name] for name in names}


def claims_frame(
    frame: pd.DataFrame, *parts: Sequence[tuple[str, RunResult]] | Sequence[Mapping[str, Any]]
) -> pd.DataFrame:
    """The comparison's run rows plus further runs (``(name, result)`` pairs) or rows (mappings): one row per
    (variant, dataset, seed), the first kept where a run appears twice."""
    frames = [frame]
    for part in parts:
        if part and isinstance(part[0], tuple):
            frames.append(results_frame(list(part)))
        elif part:
            frames.append(pd.DataFrame(list(part)))
    return pd.concat(frames, ignore_index=True).drop_duplicates(["variant", "dataset", "seed"]).reset_index(drop=True)


def _selection(frame: pd.DataFrame, dataset: str, names: Sequence[str]) -> str:
    """How the runs' reported checkpoint was chosen: the rules of their ``selection`` records, each once."""
    rows = frame[(frame["dataset"] == dataset) & frame["variant"].isin(names)]
    if "selection" not in rows or rows["selection"].isna().all():
        return NO_SELECTION
    return "; ".join(dict.fromkeys(map(selection_rule, rows["selection"].dropna().astype(str))))


CLAIM_COLUMNS = [
    "claim",
    "kind",
    "claimed",
    "dataset",
    "regime",
    "Δ",
    "CI low",
    "CI high",
    "unit",
    "seeds",
    "margin",
    "verdict",
    "seeds to decide",
    "Holm p",
    "paper Δ",
    "paper",
    "checkpoint",
]
# what a reader needs to recompute a row from the per-seed table (runs_per_seed.csv): the rows A and B compared,
# the metric column, the scales of A_s and B_s, the interval's confidence (the look's level), and the rule's columns
RECOMPUTE_COLUMNS = ["A", "B", "metric", "A scale", "B scale", "confidence", "look", "inside margin", "p"]
HOLM = f"survives Holm at {round(100 * verdicts.ALPHA)} %"
PER_SEED_METRICS = ("R@1", "R@2", "R@4", "R@8", "RP", "MAP@R", "NMI", "P@1", "best_epoch", "seconds_to_best")
PER_SEED_COLUMNS = [
    "regime",
    "dataset",
    "row",
    "seed",
    *PER_SEED_METRICS,
    "best_epoch_censored",
    "checkpoint",
    "digest",
    "numerics",
]


def per_seed_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One line per run the claims read (``runs``: :func:`claims_frame` rows with a ``regime`` column): regime,
    dataset, ``row`` (the label claims use), seed, the test metrics in the units the claims use (retrieval in
    points), the best epoch, whether the epoch cap censored it, how the checkpoint was chosen and the run's
    configuration digest (the last part of its run folder) and the numerics tag it ran under
    (:mod:`dmlstudy.numerics`). ``runs_per_seed.csv`` beside every claims table:
    every Δ and interval of the table recomputes from it (:func:`dmlstudy.verdicts.paired_interval`)."""
    table = runs.rename(columns={"variant": "row"}).copy()
    for metric in PER_SEED_METRICS:
        if metric not in table:
            table[metric] = math.nan
        table[metric] = table[metric].astype(float) * verdicts.metric_scale(metric)
    table["checkpoint"] = (
        table["selection"].map(lambda text: selection_rule(str(text)) if isinstance(text, str) else NO_SELECTION)
        if "selection" in table
        else NO_SELECTION
    )
    if "run_dir" not in table:
        table["run_dir"] = ""
    table["digest"] = table["run_dir"].fillna("").astype(str).map(lambda path: Path(path).name.rpartition("-")[2])
    if "best_epoch_censored" not in table:
        table["best_epoch_censored"] = False
    if "numerics" not in table:
        table["numerics"] = "unrecorded"
    table["numerics"] = table["numerics"].fillna("unrecorded")
    return (
        table[PER_SEED_COLUMNS].sort_values(["regime", "dataset", "row", "seed"], kind="stable").reset_index(drop=True)
    )


def claim_design(claim: Claim, design: sequential.SequentialDesign, seeds: int) -> sequential.SequentialDesign:
    """The sequential design a claim is judged by: the study's for claims on the protocol runs; for ablation
    claims, whose runs never get more seeds, one look at their ``seeds`` (the fixed-sample rule at α)."""
    if claim.runs == "protocol":
        return design
    count = max(seeds, 2)
    return sequential.SequentialDesign(first_seeds=count, batch=1, cap=count, alpha=design.alpha)


def claims_table(
    frame: pd.DataFrame,
    *,
    claims: Sequence[Claim] = CLAIMS,
    margin: float = verdicts.MARGIN,
    ablation_datasets: Sequence[str] | None = None,
    regime: str = "scratch",
    design: sequential.SequentialDesign | None = None,
) -> pd.DataFrame:
    """One row per claim × dataset judged in ``regime`` (:meth:`Claim.judged_in`; the ``regime`` column;
    claims on ``ablation`` runs: ``ablation_datasets`` only, all datasets when None): Δ, its t-interval, the
    paired seeds, the margin, the verdict (:func:`dmlstudy.study.sequential.judge_sequential` under ``design``, the
    plan's sequential design, default one look at 5 seeds; :func:`dmlstudy.verdicts.censor` for epochs-to-best),
    the look that decided it and the interval's confidence, the seeds that would decide an undecided claim,
    the decision's p-value and Holm's adjustment across the regime's claims, the paper's Δ, how the
    checkpoints were chosen, and what the row compares (``A``, ``B``, ``metric`` and their scales: the columns
    that recompute it from :func:`per_seed_table`).

    ``frame``: one row per run (:func:`claims_frame`). Only the seeds both sides ran pair, read in seed order;
    a claim whose side has no run (or no value of the claim's metric) is "not evaluated" and says why."""
    design = design or sequential.SequentialDesign(first_seeds=5, batch=5, cap=5)
    datasets = list(dict.fromkeys(frame["dataset"]))
    rows = []
    for claim in claims:
        if not claim.judged_in(regime):
            continue
        here = (
            datasets
            if claim.runs == "protocol" or ablation_datasets is None
            else [d for d in datasets if d in ablation_datasets]
        )
        claim_margin = margin if claim.margin is None else claim.margin
        for dataset in here:
            paper_delta = claim.paper_difference(dataset)
            row = {
                "claim": claim.name,
                "kind": claim.kind,
                "claimed": f"A {claim.claimed} B",
                "dataset": dataset,
                "regime": regime,
                "unit": claim.unit,
                "margin": claim_margin,
                "paper Δ": "–" if paper_delta is None else paper_delta,
                "paper": claim.source,
                "checkpoint": _selection(frame, dataset, [claim.a, claim.b]),
                "A": claim.a,
                "B": claim.b,
                "metric": claim.metric,
                "A scale": claim.a_scale,
                "B scale": claim.b_scale,
            }
            try:
                paired = verdicts.paired_differences(
                    frame,
                    dataset,
                    claim.a,
                    claim.b,
                    claim.metric,
                    first_scale=claim.a_scale,
                    second_scale=claim.b_scale,
                )
            except KeyError:
                missing = [
                    v
                    for v in (claim.a, claim.b)
                    if frame[(frame["dataset"] == dataset) & (frame["variant"] == v)].empty
                ]
                reason = f"no {' / '.join(missing)} runs" if missing else f"no {claim.metric} in the runs' records"
                rows.append(
                    {
                        **row,
                        "Δ": math.nan,
                        "CI low": math.nan,
                        "CI high": math.nan,
                        "seeds": 0,
                        "verdict": f"not evaluated ({reason})",
                        "outcome": "not evaluated",
                        "seeds to decide": "–",
                        "p": math.nan,
                    }
                )
                continue
            claim_look = claim_design(claim, design, len(paired.differences))
            reading = sequential.judge_sequential(
                paired.differences, claim_look, claimed=claim.claimed, margin=claim_margin
            )
            verdict, text, p_value = reading.verdict, verdict_text(reading), reading.p_value
            if claim.metric in verdicts.CENSORED_METRICS:
                censored = verdicts.censor(verdict, **paired.censoring)
                if censored != verdict:
                    verdict, text, p_value = censored, censored.text, 1.0
            if not reading.look:  # fewer paired seeds than the first look: the fixed-sample verdict's text
                text = verdict.text
            rows.append(
                {
                    **row,
                    **verdict.columns(),
                    "verdict": text,
                    "p": p_value,
                    "confidence": round(verdict.confidence, 6),
                    "look": reading.look,
                    "seeds to decide": verdict.seeds_to_decide if verdict.seeds_to_decide else "–",
                }
            )
    table = pd.DataFrame(rows, columns=[*CLAIM_COLUMNS, "outcome", *RECOMPUTE_COLUMNS])
    table["outcome"] = table["outcome"].fillna("not evaluated")
    table = verdicts.holm_columns(table.drop(columns=["Holm p"]), family=("regime",))
    return table[[*CLAIM_COLUMNS, "outcome", HOLM, *RECOMPUTE_COLUMNS]]


def verdict_text(reading: sequential.SequentialVerdict) -> str:
    """The verdict as the claims table prints it: the rule's reading, with the look that decided it when the
    design has several; an undecided claim says its next look, or at the cap the largest |Δ| its interval
    still allows and the seeds the observed spread says would decide it."""
    verdict, looks = reading.verdict, reading.design.looks
    if not reading.look:
        return verdict.text
    if verdict.outcome != verdicts.UNDECIDED:
        return verdict.reading if len(looks) == 1 else reading.text
    if reading.open:
        return reading.text
    needed = f"≈ {verdict.seeds_to_decide}" if verdict.seeds_to_decide else f"more than {verdicts.MAX_SEEDS}"
    return f"{reading.text}; {needed} seeds would decide"


def _design_lines(design: sequential.SequentialDesign) -> list[str]:
    """The sequential design's paragraph of ``claims.md`` (none for one look)."""
    if len(design.looks) < 2:
        return []
    return [
        f"Sequential design (the plan's `seed_cap` {design.cap}, `seed_batch` {design.batch}): every headline claim is "
        f"judged at the first look; the rows of a claim still undecided get the next seeds (seed s pairs with seed s), "
        f"{design.description}. A claim's `look` and `seeds` are those of the look that decided it, or of the "
        "cap; ablation claims and a claim the epoch cap's censoring left undecided get no further seeds.",
        "",
    ]


@dataclass(frozen=True)
class ClaimsScope:
    """What ``claims.md`` says the claims were judged on: each regime's protocol (the headline regime's first: its
    datasets and seeds are the headline claims'), the classic baselines' seeds (empty: none ran), the ablation
    claims' datasets and seeds, the sequential design and the equivalence margin (R@1 points)."""

    protocols: tuple[ProtocolConfig, ...]
    classic_seeds: tuple[int, ...]
    ablation_datasets: tuple[str, ...]
    ablation_seeds: tuple[int, ...]
    design: sequential.SequentialDesign
    margin: float


def claims_markdown(claims: pd.DataFrame, scope: ClaimsScope) -> str:
    """``results/claims.md``: the rule, the protocol, then every claim × dataset."""
    shown = claims[CLAIM_COLUMNS].copy()
    shown["claim"] = [f"{name} ({kind})" for name, kind in zip(shown["claim"], shown["kind"])]
    shown["Holm p"] = [
        "–" if math.isnan(p) else f"{p:.3f}" + (" ✓" if survives else "")
        for p, survives in zip(claims["Holm p"].astype(float), claims[HOLM])
    ]
    headline = scope.protocols[0]
    protocols = [f"Protocol ({c.regime} regime): {c.protocol_text()}." for c in scope.protocols]
    lines = [
        "# Every claim, headline and ablation",
        "",
        *protocols,
        "",
        f"Regimes: {', '.join(c.regime for c in scope.protocols)}; headline claims on "
        f"{', '.join(headline.datasets)} (seeds {seed_text(headline.seeds)}, "
        f"classic baselines {seed_text(scope.classic_seeds) or '–'}), ablation claims on "
        f"{', '.join(scope.ablation_datasets) or '–'} (seeds {seed_text(scope.ablation_seeds) or '–'}).",
        "",
        *_design_lines(scope.design),
        "Rule (declared before the runs, `dmlstudy.verdicts`, docs/protocol.md): Δ = mean of the per-seed paired "
        "differences A_s − B_s (same seed: same backbone initialisation and batch sequence; only seeds both sides ran "
        "pair, in seed order), t-interval Δ ± t·sd/√n at the look's level (one look at 95 % unless the row's look says "
        "otherwise), read by the claim's kind. **A > B**: held (above 0; *smaller than the margin* when inside "
        "(0, +m)), reversed (below 0), *equivalent (no effect)* → not held (across 0 inside ±m). **A ≈ B**: "
        "equivalent → held (inside ±m, judged first), *not equivalent* → not held (clear of ±m). Otherwise "
        "undecided, with the seeds the observed spread says would decide it, or at the plan's cap the largest "
        "|Δ| the data still allow; fewer than 2 paired seeds: no verdict. Margin m: "
        f"{scope.margin:g} R@1 points unless the row says otherwise. Claims on epochs-to-best: a verdict that "
        "the epoch cap's censoring could overturn is undecided (censored). **Holm p**: Holm's step-down adjustment "
        "of the decisions' p-values across each regime's claims (family-wise 5 %). Every row recomputes from "
        "`runs_per_seed.csv` beside this table (columns A, B, metric, scales and confidence of `claims.csv`). "
        "Paper Δ: the paper's own difference (its backbone and data), for scale.",
        "",
        shown.drop(columns="kind").to_markdown(index=False),
        "",
    ]
    return "\n".join(lines)


def write_claims(
    claims: pd.DataFrame,
    scope: ClaimsScope,
    folder: str | Path,
    *,
    runs: pd.DataFrame | None = None,
) -> list[Path]:
    """``claims.csv`` (every column), ``claims.md`` (:func:`claims_markdown`) and, from ``runs`` (the runs the
    claims read, with their regime), ``runs_per_seed.csv`` (:func:`per_seed_table`) under ``folder``."""
    folder = Path(folder)
    csv_path, md_path = write_table(claims[[*CLAIM_COLUMNS, "outcome", HOLM, *RECOMPUTE_COLUMNS]], folder / "claims")
    text = claims_markdown(claims, scope)
    if runs is not None:
        text += numerics_note(per_seed_table(runs))
    md_path.write_text(text)
    written = [csv_path, md_path]
    if runs is not None:
        per_seed = folder / "runs_per_seed.csv"
        per_seed_table(runs).to_csv(per_seed, index=False)
        written.append(per_seed)
    return written


def numerics_note(per_seed: pd.DataFrame) -> str:
    """A paragraph for a claims table whose runs carry more than one numerics tag (or none recorded): which tags,
    on how many runs; '' when every run ran under one recorded tag."""
    counts = per_seed["numerics"].value_counts()
    if len(counts) == 1 and counts.index[0] != "unrecorded":
        return ""
    tags = ", ".join(f"{tag} ({count} runs)" for tag, count in counts.items())
    return (
        f"\n**Numerics.** The runs of this table ran under {tags} (`numerics` in `runs_per_seed.csv`, "
        'docs/protocol.md, "Numerics"): its digits are not one computation\'s.\n'
    )


DECIDED = ("held", "reversed", "not held")  # the outcomes of a decided claim (verdicts.RULE)


def claim_sentences(claims: pd.DataFrame) -> list[str]:
    """One sentence per evaluated claim and dataset, then one summary sentence, all from the numbers."""
    evaluated = claims[claims["outcome"] != "not evaluated"]
    if evaluated.empty:
        return ["No claim could be evaluated: the methods it compares did not run."]
    sentences = [_claim_sentence(dict(row)) for _, row in evaluated.iterrows()]
    counts = evaluated["outcome"].value_counts()
    decided = int(sum(counts.get(v, 0) for v in DECIDED))
    skipped = sorted(set(claims.loc[claims["outcome"] == "not evaluated", "claim"]))
    regimes = list(dict.fromkeys(evaluated["regime"])) if "regime" in evaluated else []
    summary = (
        f"Of {len(evaluated)} claim × dataset{' × regime' if len(regimes) > 1 else ''} comparisons, {decided} were decided: "
        + ", ".join(f"{int(counts.get(v, 0))} {v}" for v in DECIDED)
        + f" ({int(evaluated[HOLM].sum())} surviving Holm's adjustment)"
        + f"; {int(counts.get('undecided', 0))} undecided and {int(counts.get('no verdict', 0))} without a verdict (fewer than 2 paired seeds)."
        + (f" Not evaluated (runs missing): {', '.join(skipped)}." if skipped else "")
    )
    for regime_name in regimes or [None]:
        headline = evaluated[evaluated["kind"] == "headline"]
        if regime_name is not None:
            headline = headline[headline["regime"] == regime_name]
        if len(headline):
            where = f" ({regime_name} regime)" if len(regimes) > 1 else ""
            summary += f" Headline{where}: {int(headline['outcome'].isin(DECIDED).sum())} of {len(headline)} decided."
    return [*sentences, summary]


def _claim_sentence(row: Mapping[str, Any]) -> str:
    interval = (
        f", {round(100 * row['confidence'], 2):g} % CI [{row['CI low']:+.2f}, {row['CI high']:+.2f}]"
        if row["seeds"] >= 2
        else ""
    )
    paper = row["paper Δ"]
    paper_text = (
        f"the paper reports {paper:+.2f} ({row['paper']})"
        if paper != "–"
        else f"the paper gives no number ({row['paper']})"
    )
    regime_text = f" ({row['regime']})" if row.get("regime", "scratch") != "scratch" else ""
    return (
        f"{row['dataset']}{regime_text}: {row['claim']}: ours {row['Δ']:+.2f} {row['unit']}{interval} over {row['seeds']} paired seed(s); "
        f"{paper_text} → {row['verdict']}."
    )


def forest_figure(claims: pd.DataFrame) -> plt.Figure:
    """Δ with its t-interval per claim × dataset (top to bottom in table order, headline claims above the
    dashed line, ablation claims below), each row's ±margin band shaded, the outcome as the marker's colour
    (hollow: no verdict; ringed: the verdict survives Holm's adjustment); claims not evaluated are left out. With several regimes (the ``regime`` column), each
    claim × dataset is one row with one marker per regime, side by side (shape: regime)."""
    rows = claims[claims["outcome"] != "not evaluated"].reset_index(drop=True)
    if "regime" not in rows:
        rows = rows.assign(regime="scratch")
    regimes = list(dict.fromkeys(rows["regime"]))
    keys = list(dict.fromkeys(zip(rows["claim"], rows["dataset"])))
    figure, axis = plt.subplots(figsize=(9.5, 0.34 * max(len(keys), 1) * (1 + 0.35 * (len(regimes) - 1)) + 1.8))
    position = {key: len(keys) - 1 - i for i, key in enumerate(keys)}
    offsets = {r: (0.0 if len(regimes) == 1 else 0.22 - 0.44 * i / (len(regimes) - 1)) for i, r in enumerate(regimes)}
    markers = dict(zip(regimes, ["o", "s", "^", "D"]))
    for _, row in rows.iterrows():
        y = position[(row["claim"], row["dataset"])]
        if row["regime"] == regimes[0]:
            axis.add_patch(plt.Rectangle((-row["margin"], y - 0.45), 2 * row["margin"], 0.9, color="0.92", linewidth=0))
        y += offsets[row["regime"]]
        colour = VERDICT_COLOURS.get(row["outcome"], "k")
        if row["seeds"] >= 2:
            axis.plot([row["CI low"], row["CI high"]], [y, y], color=colour, linewidth=2)
        axis.plot(
            row["Δ"], y, markers[row["regime"]], color=colour, markerfacecolor=colour if row["seeds"] >= 2 else "white"
        )
        if bool(row.get(HOLM, False)):  # ringed: the verdict survives Holm's adjustment across the regime's claims
            axis.plot(row["Δ"], y, markers[row["regime"]], markersize=11, markerfacecolor="none", color="k", mew=0.9)
    axis.axvline(0, color="0.3", linewidth=0.8)
    kinds = dict(zip(zip(rows["claim"], rows["dataset"]), rows["kind"]))
    headline = sum(kinds[key] == "headline" for key in keys)
    if 0 < headline < len(keys):  # headline claims above, ablation claims below
        axis.axhline(len(keys) - headline - 0.5, color="0.5", linestyle="--", linewidth=0.8)
    units = dict(zip(zip(rows["claim"], rows["dataset"]), rows["unit"]))
    labels = [
        f"{claim} — {dataset}" + ("" if units[(claim, dataset)] == "R@1 points" else f" [{units[(claim, dataset)]}]")
        for claim, dataset in keys
    ]
    axis.set_yticks(range(len(keys)), labels[::-1], fontsize=7)
    axis.set_ylim(-0.6, len(keys) - 0.4)
    axis.set_xlabel(
        "Δ = mean paired difference A − B (R@1 points unless marked), t-interval at the deciding look's level"
    )
    handles = [plt.Line2D([], [], marker="o", color=c, linestyle="none", label=v) for v, c in VERDICT_COLOURS.items()]
    if len(regimes) > 1:
        handles += [
            plt.Line2D([], [], marker=markers[r], color="0.3", linestyle="none", label=f"{r} regime") for r in regimes
        ]
    handles.append(
        plt.Line2D([], [], marker="o", markersize=11, markerfacecolor="none", color="k", linestyle="none", label=HOLM)
    )
    handles.append(plt.Rectangle((0, 0), 1, 1, color="0.92", label="±margin (equivalence)"))
    axis.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    axis.grid(axis="x", alpha=0.3)
    axis.set_title(
        "Every claim: paired Δ per seed, its interval and the verdict"
        + (f" ({' vs '.join(regimes)})" if len(regimes) > 1 else "")
    )
    figure.tight_layout()
    return figure
