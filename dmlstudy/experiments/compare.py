"""Notebook 90 (the headline comparison): every method of the study under one protocol, in one table per
dataset, plus the embedding geometry, projections, cost, and a reading of the four papers' claims.

Here: the notebook's parameters (:class:`CompareStudy`), its runs and :func:`compare_regime`, which computes
everything of one regime. ``notebooks/90_compare.ipynb`` also calls the modules that hold each part:
:mod:`~dmlstudy.rows` (what each row is), :mod:`~dmlstudy.experiments.rerank` (DIML re-ranking of the
``ms`` runs), :mod:`~dmlstudy.experiments.tables` (retrieval, geometry and cost tables),
:mod:`~dmlstudy.findings.claims` (the papers' claims and the forest plot),
:mod:`~dmlstudy.experiments.regime_comparison` (the regimes side by side) and
:mod:`~dmlstudy.study.figure_index` (``figures/README.md``).

Runs come from :meth:`ProtocolConfig.grid` with ``{name: {"method": name}}``, so run folders are
``<dataset>-<method>-seed<seed>``: the method notebooks (10_crt, 20_diml, 30_cross_attention, 40_dgcrl) train
``ms`` and their method under exactly these names, and ``resume=True`` reuses them (the plan must give every
notebook the same ``protocol``, or the run folder refuses to resume with a message naming the differing
fields).

Decisions (stated in the notebook too):

* ``diml_rerank`` is a row, not a training method: the ``ms`` runs' test embeddings re-ranked at test time
  with DIML's structural similarity (:func:`dmlstudy.structural.reranking.reranked_retrieval_metrics`): the cosine
  top-``rerank_top_k`` of every query re-ranked by ``cos + s_struct`` on the trained ``ms`` model's
  ``rerank_grid`` × ``rerank_grid`` local embeddings (its own embedding layer applied per cell), DIML's
  default transport (ε = 0.05, cross-correlation marginals). Re-ranking changes the order of neighbours,
  not the embeddings, so its NMI, ESD, ρ and training time are those of the ``ms`` runs; its extra
  test-time cost is recorded as ``rerank_seconds``. Results are cached in the ``ms`` run folders
  (``compare_rerank-<key>.json``).
* Best per column: the highest mean over seeds *as displayed* (rounded to the table's decimals), so equal
  displayed numbers are all marked; every row of a dataset competes, classic baselines included.
* Claims (``claims.yaml``: the headline claims, each paper's method against its baseline, on the protocol's
  datasets, and the ablation claims on ``ablation_datasets``, in every regime the comparison runs; the default
  study, ``plans/default.yaml``, compares on emoji in the imagenet regime) are judged by the study's one rule,
  :func:`dmlstudy.study.sequential.judge_sequential`: per-seed paired differences (seed s = the same backbone
  initialisation and batch sequence for both sides; only seeds both sides ran pair), a t-interval of their mean at
  the look's level, read by the claim's kind (held / reversed / not held, or undecided with the seeds that would
  decide it); fewer than 2 paired seeds give no verdict. With ``seed_cap`` above the seeds, the rows of undecided
  claims get more seeds, look by look (:func:`seeds_needed`). Ablation claims read the paper notebooks' ablation
  runs by the same names (``ablation_datasets``, ``ablation_seeds``). Claims on epochs-to-best
  (:data:`verdicts.CENSORED_METRICS`) also pass :func:`verdicts.censor`: a verdict that runs cut short by the
  epoch cap could overturn is undecided (censored).
* ESD and ρ are the runs' own metrics (``metrics.json``: keys ``ESD``, ``rho``), computed on the test
  embeddings with ``drop_first = 0``. Projections (UMAP, t-SNE) use one fixed subset of the first dataset's
  test images (the first ``projection_classes`` classes, all their images, fewer than 4,096 points), the
  first seed of every method, ``random_state`` = 0.
* The papers' numbers (each on its own backbone and protocol) are used only to print the size of the
  effect each paper claims; SynBirds stands beside CUB-200 and Glyphs beside Cars196.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from dmlstudy import verdicts
from dmlstudy.experiments.kit import StudyConfig
from dmlstudy.experiments.regime_comparison import RegimeComparison
from dmlstudy.experiments.rerank import Reranking, claim_rerank_results, rerank_missing, rerank_results
from dmlstudy.experiments.tables import comparison_frame, comparison_table, table_note
from dmlstudy.findings.claims import (
    CLAIMS,
    Claim,
    ClaimsScope,
    ablation_grid,
    claim_reranks,
    claims_frame,
    claims_table,
)
from dmlstudy.methods import list_methods
from dmlstudy.paths import study_outputs
from dmlstudy.rows import BASELINE, CI_CLASSIC_ROWS, CI_ROWS, EXTRA_ROWS, is_reranked, method_grid, trained_row
from dmlstudy.run.data import class_split_counts
from dmlstudy.run.protocol import ProtocolConfig
from dmlstudy.run.regimes import regime
from dmlstudy.run.train import RunResult, TrainConfig
from dmlstudy.study import sequential
from dmlstudy.study.grids import run_grid, train_grid


@dataclass
class CompareStudy(StudyConfig):
    """Parameters of ``notebooks/90_compare.ipynb``: the protocol plus which methods enter the table."""

    methods: list = field(
        default_factory=lambda: list(CI_ROWS)
    )  # main rows, every seed: registered methods (dmlstudy.methods.list_methods()), diml_rerank, softmax
    classic_methods: list = field(
        default_factory=lambda: list(CI_CLASSIC_ROWS)
    )  # classic baselines (registry group 'classic'), with classic_seeds
    classic_seeds: list = field(
        default_factory=lambda: [0]
    )  # seeds of the classic baselines (fewer than the protocol's seeds: the table says so)
    rerank_top_k: int = 20  # K of DIML re-ranking: the cosine top-K re-ranked by cos + s_struct (the paper: 100)
    rerank_grid: int = 4  # G of DIML re-ranking: G × G local embeddings (DIML's default 4)
    projection_classes: int = 8  # test classes of the first dataset in the UMAP / t-SNE panels (all their images)
    umap: bool = True  # draw the UMAP panels (numba compiles UMAP on first use: ~15 s)
    tsne: bool = True  # draw the t-SNE panels
    ablation_datasets: list = field(
        default_factory=lambda: ["synbirds"]
    )  # datasets of the ablation claims (the paper notebooks' ablation_datasets)
    ablation_seeds: list = field(
        default_factory=lambda: [0]
    )  # seeds of the ablation claims (the paper notebooks' ablation_seeds; ≥ 2 for a verdict)
    margin: float = 1.0  # equivalence margin of the verdicts, R@1 points (declared in the plan before the runs)
    compared_regimes: list = field(
        default_factory=list
    )  # further regimes beside the protocol's regime (dmlstudy/run/regimes.py): every row again, the claims judged in each
    seed_cap: int = 0  # sequential design: the most paired seeds a claim may get (0: one look at the seeds given)
    seed_batch: int = 5  # sequential design: seeds added to the rows of undecided claims at each further look

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in self.compared_regimes:
            regime(name, backbone=self.protocol.backbone)
        headline = self.protocol.regime
        if headline in self.compared_regimes or len(set(self.compared_regimes)) < len(self.compared_regimes):
            raise ValueError(
                f"parameter 'compared_regimes': {self.compared_regimes} must list each regime once and not the "
                f"headline regime {headline!r}"
            )
        known = set(list_methods()) | set(EXTRA_ROWS)
        for name, values in (("methods", self.methods), ("classic_methods", self.classic_methods)):
            unknown = [m for m in values if m not in known]
            if unknown:
                raise ValueError(f"parameter {name!r}: unknown methods {unknown}; valid: {sorted(known)}")
        reranked = [name for name in self.classic_methods if is_reranked(name)]
        if reranked:
            raise ValueError(
                f"parameter 'classic_methods': {reranked} must each be a main method (a re-ranked row re-ranks the "
                "runs of every seed of the row it re-ranks)"
            )
        overlap = sorted(set(self.methods) & set(self.classic_methods))
        if overlap:
            raise ValueError(f"parameters 'methods' and 'classic_methods' share {overlap}; list each method once")
        if self.classic_methods and not self.classic_seeds:
            raise ValueError(
                "parameter 'classic_seeds' must list at least one seed when 'classic_methods' is not empty"
            )
        if self.rerank_top_k < 1 or self.rerank_grid < 1:
            raise ValueError(
                f"parameters 'rerank_top_k' and 'rerank_grid' must be ≥ 1, got {self.rerank_top_k} and {self.rerank_grid}"
            )
        if self.projection_classes < 2:
            raise ValueError(f"parameter 'projection_classes' must be ≥ 2, got {self.projection_classes}")
        if self.seed_cap and (self.seed_cap < len(self.protocol.seeds) or self.seed_batch < 1):
            raise ValueError(
                f"parameters 'seed_cap' ({self.seed_cap}) and 'seed_batch' ({self.seed_batch}): the cap must be 0 or at "
                f"least the {len(self.protocol.seeds)} seeds of the first look, and the batch ≥ 1"
            )
        if not self.margin > 0:
            raise ValueError(f"parameter 'margin' must be > 0 (R@1 points), got {self.margin}")

    def design(self) -> sequential.SequentialDesign:
        """The sequential design the plan declares (docs/protocol.md): the first look at ``seeds``, then
        ``seed_batch`` more seeds per look for the rows of undecided claims up to ``seed_cap``, α spent by
        Pocock-type error spending; with ``seed_cap`` 0 (or equal to the seeds) one look at 95 %."""
        first = max(len(self.protocol.seeds), 2)
        return sequential.SequentialDesign(first_seeds=first, batch=self.seed_batch, cap=max(self.seed_cap, first))

    def regime_configs(self) -> list[CompareStudy]:
        """This config (the headline regime) and one per compared regime, in that order."""
        return [
            self,
            *(
                dataclasses.replace(self, protocol=dataclasses.replace(self.protocol, regime=name), compared_regimes=[])
                for name in self.compared_regimes
            ),
        ]

    def regime_protocols(self) -> list[ProtocolConfig]:
        """The protocol of each regime of :meth:`regime_configs`, in that order."""
        return [config.protocol for config in self.regime_configs()]

    def reranks(self) -> bool:
        """Whether a main row re-ranks another row's runs (:func:`~dmlstudy.rows.is_reranked`)."""
        return any(is_reranked(name) for name in self.methods)

    def classic_protocol(self) -> ProtocolConfig:
        """The protocol with the classic baselines' seeds."""
        return self.protocol.with_seeds(self.classic_seeds)

    def rows(self) -> list[str]:
        """Every row of the comparison, in table order: ``methods`` then ``classic_methods``."""
        return [*self.methods, *self.classic_methods]

    def reranking(self) -> Reranking:
        """The DIML re-ranking of the ``ms`` runs: the ``diml_rerank`` row's top-K and grid, whether the row is
        shown, and the protocol's workers."""
        return Reranking(
            top_k=self.rerank_top_k, grid=self.rerank_grid, shown=self.reranks(), workers=self.protocol.workers
        )

    def table_note(self) -> str:
        """The note beside each retrieval table (:func:`~dmlstudy.experiments.tables.table_note`): classic
        baselines with fewer seeds, the re-ranked row's settings."""
        return table_note(
            seeds=self.protocol.seeds,
            classic_seeds=self.classic_seeds if self.classic_methods else (),
            rerank=(self.rerank_top_k, self.rerank_grid) if self.reranks() else None,
        )

    def claims_scope(self) -> ClaimsScope:
        """What ``claims.md`` says the claims were judged on (:class:`~dmlstudy.findings.claims.ClaimsScope`)."""
        return ClaimsScope(
            protocols=tuple(self.regime_protocols()),
            classic_seeds=tuple(self.classic_seeds) if self.classic_methods else (),
            ablation_datasets=tuple(self.ablation_datasets),
            ablation_seeds=tuple(self.ablation_seeds),
            design=self.design(),
            margin=self.margin,
        )

    def results_folder(self) -> Path:
        """Where the notebook writes its tables (``<project>/results`` for the published study)."""
        return study_outputs(self.protocol.study, "results", runs_root_override=self.protocol.runs_root)

    def figures_folder(self) -> Path:
        """Where the study's figures are (``<project>/figures`` for the published study)."""
        return study_outputs(self.protocol.study, "figures", runs_root_override=self.protocol.runs_root)


# ----------------------------------------------------------------------------------------------
# Runs
# ----------------------------------------------------------------------------------------------
CLAIMS_BY_NAME = {claim.name: claim for claim in CLAIMS}


def trained_methods(methods: Sequence[str]) -> list[str]:
    """The registered methods to train for ``methods``: a re-ranked row needs the runs it re-ranks
    (:func:`~dmlstudy.rows.trained_row`; ``diml_rerank`` the ``ms`` runs)."""
    return list(dict.fromkeys(trained_row(name) for name in methods))


def main_grid(config: CompareStudy) -> list[tuple[str, TrainConfig]]:
    """The main methods on every dataset and seed."""
    return config.protocol.grid(method_grid(trained_methods(config.methods)))


def classic_grid(config: CompareStudy) -> list[tuple[str, TrainConfig]]:
    """The classic baselines on every dataset with ``classic_seeds``."""
    return config.classic_protocol().grid(method_grid(config.classic_methods)) if config.classic_methods else []


def run_main(config: CompareStudy) -> list[tuple[str, RunResult]]:
    """Train (or load) the main methods on every dataset and seed."""
    return run_grid(main_grid(config), workers=config.protocol.workers)


def run_classic(config: CompareStudy) -> list[tuple[str, RunResult]]:
    """Train (or load) the classic baselines on every dataset with ``classic_seeds``."""
    return run_grid(classic_grid(config), workers=config.protocol.workers)


def ablations_grid(config: CompareStudy, claims: Sequence[Claim] = CLAIMS) -> list[tuple[str, TrainConfig]]:
    """The runs of the ablation claims judged in the protocol's regime on ``ablation_datasets`` with
    ``ablation_seeds``."""
    claims = [claim for claim in claims if claim.judged_in(config.protocol.regime)]
    if not config.ablation_seeds or not config.ablation_datasets or not claims:
        return []
    protocol = config.protocol.with_seeds(config.ablation_seeds)
    return protocol.grid(ablation_grid(claims), datasets=config.ablation_datasets)


def run_ablations(config: CompareStudy, claims: Sequence[Claim] = CLAIMS) -> list[tuple[str, RunResult]]:
    """Train (or load: the paper notebooks trained them under the same names) the runs of the ablation claims
    judged in the protocol's regime on ``ablation_datasets`` with ``ablation_seeds``."""
    return run_grid(ablations_grid(config, claims), workers=config.protocol.workers)


def compare_regime(config: CompareStudy) -> RegimeComparison:
    """Train (or load) every row of ``config`` in its regime, the DIML re-rankings, the ablation runs the claims
    judged in this regime need, and judge those claims (:func:`~dmlstudy.findings.claims.claims_table`).

    It waits twice: all of the regime's runs (main rows, classic baselines, ablations) go to the engine as one
    grid, then all of its missing re-rankings (the table's and the claims') as one batch; the rest reads them
    from disk. Waiting once per phase, five times, left a GPU's workers idle behind each phase's last task.
    Regime after regime, not both at once: a run's engine priority is set by whoever asks for it first, and the
    scratch regime's main runs are the paper notebooks' own. Sent at the start with the comparison's hundreds
    of pretrained runs, they took that grid's low priority, and the paper notebooks waited behind it."""
    train_grid(main_grid(config) + classic_grid(config) + ablations_grid(config), workers=config.protocol.workers)
    main = run_main(config)
    reranking = config.reranking()
    rerank_missing(main, reranking)
    classic = run_classic(config)
    frame = comparison_frame(main, classic, rerank_results(main, reranking), methods=config.methods)
    extra_runs, extra_rows = run_ablations(config), claim_rerank_results(main, reranking)
    runs = claims_frame(frame, extra_runs, extra_rows)
    design = config.design()
    asked = dict.fromkeys(runs["variant"].unique(), len(config.protocol.seeds))
    while True:
        claims = claims_table(
            runs,
            margin=config.margin,
            ablation_datasets=config.ablation_datasets,
            regime=config.protocol.regime,
            design=design,
        )
        needs = {row: count for row, count in seeds_needed(claims, design).items() if count > asked.get(row, 0)}
        if not needs:  # every open claim at its cap, or (a guard) no row would get a seed it has not had
            break
        asked.update(needs)
        runs = claims_frame(runs, *run_more_seeds(config, needs))
    return RegimeComparison(
        config.protocol, config.table_note(), main, classic, frame, comparison_table(frame), claims, runs
    )


def validation_class_counts(config: CompareStudy) -> dict[str, int]:
    """Dataset → the number of classes in the validation fold each run chose its checkpoint on (fold
    ``validation_fold`` of the first ``train_classes`` training classes, :func:`dmlstudy.data.folds.fold_classes`);
    {} without validation folds."""
    protocol = config.protocol
    if protocol.validation_folds < 2:
        return {}
    return {
        dataset: class_split_counts(protocol.train_config(dataset=dataset, method=BASELINE, seed=0, name="classes"))[1]
        for dataset in protocol.datasets
    }


def seeds_needed(claims: pd.DataFrame, design: sequential.SequentialDesign) -> dict[str, int]:
    """Row → the paired seeds its next look needs, for the rows of every claim on the protocol runs that is
    undecided before the design's cap (:func:`dmlstudy.study.sequential.rows_needing_seeds`: a row read by several open
    claims gets the most any of them needs; a decided claim's rows get nothing for it). A claim the epoch cap's
    censoring left undecided (:func:`dmlstudy.verdicts.censor`) gets none: more seeds of the same cap cannot
    decide it, and its sequential reading, already stopped, would ask for the same look again."""
    looks = design.looks
    open_claims = claims[
        (claims["outcome"] == verdicts.UNDECIDED)
        & ~claims["verdict"].str.contains(verdicts.CENSORED_READING, regex=False)
        & claims["claim"].map(lambda name: CLAIMS_BY_NAME[name].runs == "protocol" if name in CLAIMS_BY_NAME else False)
        & (claims["look"].fillna(0).astype(int) < len(looks))
    ]
    needs: dict[str, int] = {}
    for _, row in open_claims.iterrows():
        for name in (row["A"], row["B"]):
            needs[name] = max(needs.get(name, 0), looks[int(row["look"])])
    return needs


def seed_sequence(config: CompareStudy, count: int) -> list[int]:
    """The first ``count`` seeds of the study: its ``seeds``, then the next integers after the largest."""
    seeds = list(config.protocol.seeds)
    return (seeds + list(range(max(seeds) + 1, max(seeds) + 1 + count)))[:count]


def run_more_seeds(config: CompareStudy, needs: dict[str, int]) -> tuple[list, list]:
    """Train (or load) the runs of the rows in ``needs`` up to their seed counts (re-rankings: the ``ms`` runs,
    re-ranked) and return them as :func:`~dmlstudy.findings.claims.claims_frame` parts: the runs of the rows,
    and the re-ranked rows."""
    trained: dict[str, int] = {}
    for name, count in needs.items():
        run_name = BASELINE if name in claim_reranks() else trained_row(name)
        trained[run_name] = max(trained.get(run_name, 0), count)
    grid = []
    for name, count in trained.items():
        grid += config.protocol.with_seeds(seed_sequence(config, count)).grid(method_grid([name]))
    results = run_grid(grid, workers=config.protocol.workers)
    ms = [(name, result) for name, result in results if name == BASELINE]
    reranking = config.reranking()
    rerank_missing(ms, reranking)
    reranks = [*rerank_results(ms, reranking), *claim_rerank_results(ms, reranking)]
    return results, [row for row in reranks if row["variant"] in needs]


def caveats(config: CompareStudy, frame: pd.DataFrame) -> list[str]:
    """What limits the reading, with this study's actual settings."""
    parameters = frame.groupby("variant")["parameters"].first() if "parameters" in frame else pd.Series(dtype=float)
    base = f" ({parameters[BASELINE] / 1e6:.2f} M parameters with the MS head)" if BASELINE in parameters else ""
    classic = f"; classic baselines {len(set(config.classic_seeds))} seed(s)" if config.classic_methods else ""
    protocol = config.protocol
    return [
        f"Synthetic data: {', '.join(protocol.datasets)} stand in for CUB-200 / Cars196; the papers' effects were measured on real photographs.",
        f"Small backbone trained from scratch: {protocol.backbone}{base}, random initialisation — no ImageNet pre-training, which every paper uses "
        "and which several of the methods (prototypes, attention, local matching) build on.",
        f"Short training at low resolution: {protocol.epochs} epochs × {protocol.steps_per_epoch or 'full'} steps, {protocol.image_size} px, "
        f"d = {protocol.embedding_dim}, batch {protocol.classes_per_batch}×{protocol.samples_per_class}; the papers train for up to 100+ epochs at 224–227 px.",
        f"Seeds: {len(set(protocol.seeds))} for the main methods{classic}; a claim is decided only when the {round(100 * verdicts.CONFIDENCE)} % "
        f"t-interval of its per-seed paired differences excludes 0 or fits inside ±{config.margin:g} points.",
        "One protocol for every method (same backbone, size, batch, epochs, seeds): the papers each used their own, so their gains are not "
        "comparable with each other or with ours; the paper columns show only the direction and size each paper claims.",
        "Training seconds come from each run's records; on a shared machine they vary with the load at the time the run trained.",
    ]
