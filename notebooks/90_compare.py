# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # The headline comparison: every method under one protocol
#
# **This notebook executed by the published study** (emoji, EfficientNet-Lite0 with its ImageNet weights at
# 128 px, 5 paired seeds), with every table, verdict and figure of `results/` and `figures/`:
# [`published/90_compare.ipynb`](../published/90_compare.ipynb). Executed without a plan its parameters are
# CI-sized (a 4-conv network on 16 SynBirds classes, one seed): the verdicts it prints then decide nothing.
#
# Each of the four papers reports its method beside numbers copied from other papers — other backbones,
# image sizes, embedding sizes, batches, schedules. Here every method is trained under **one protocol**
# (printed above each table): the same backbone started the same way (the protocol's regime: in the default
# study an ImageNet-pretrained EfficientNet-Lite0 whose last stage is fine-tuned, `dmlstudy/run/regimes.py`), image
# size, embedding size $d$, P × M batch, epochs and seeds, and every number is a mean ± std over seeds.
#
# The rows (the table below lists those of this run, from the method registry, `dmlstudy.methods.method_info`):
# every registered method has a label, a group (paper method or classic baseline), its paper and a one-line
# description; `diml_rerank` and `softmax` are rows made from other runs.
#
# The runs are shared: the method notebooks (10–40) train `ms` and their method under the same run names
# (`<dataset>-<method>-seed<seed>`), so with the same protocol this notebook loads them instead of training
# again. Classic baselines may run with fewer seeds (`classic_seeds`); the table then marks them with †.
#
# **Metrics** (test classes never seen in training, every test image a query against all others):
# Recall@K, R-Precision (RP), MAP@R (R = the other images of the query's class) and NMI of k-means on the
# embeddings. Retrieval numbers are percentages. The best mean of each column is in bold (ties as displayed
# are all bold).
#
# The defaults below are CI-sized (seconds; the numbers mean nothing); the study's plans inject real sizes.
# `protocol` is the protocol every study notebook shares (backbone, image size, d, batch, epochs, seeds, …), one
# mapping: a plan gives each notebook the same one, and the keys left out keep their CI-sized defaults.

# %% tags=["parameters"]
protocol: dict = {'study': 'notebook-90_compare'}  # the shared protocol: ProtocolConfig fields (dmlstudy/run/protocol.py); left out: CI-sized
methods: list = ['ms', 'crt', 'diml_rerank']  # main rows, every seed: registered methods (dmlstudy.methods.list_methods()), diml_rerank, softmax
classic_methods: list = ['triplet']  # classic baselines (registry group 'classic'), with classic_seeds
classic_seeds: list = [0]  # seeds of the classic baselines (fewer than the protocol's seeds: the table says so)
rerank_top_k: int = 20  # K of DIML re-ranking: the cosine top-K re-ranked by cos + s_struct (the paper: 100)
rerank_grid: int = 4  # G of DIML re-ranking: G × G local embeddings (DIML's default 4)
projection_classes: int = 8  # test classes of the first dataset in the UMAP / t-SNE panels (all their images)
umap: bool = True  # draw the UMAP panels (numba compiles UMAP on first use: ~15 s)
tsne: bool = True  # draw the t-SNE panels
ablation_datasets: list = ['synbirds']  # datasets of the ablation claims (the paper notebooks' ablation_datasets)
ablation_seeds: list = [0]  # seeds of the ablation claims (the paper notebooks' ablation_seeds; ≥ 2 for a verdict)
margin: float = 1.0  # equivalence margin of the verdicts, R@1 points (declared in the plan before the runs)
compared_regimes: list = []  # further regimes beside the protocol's regime (dmlstudy/run/regimes.py): every row again, the claims judged in each
seed_cap: int = 0  # sequential design: the most paired seeds a claim may get (0: one look at the seeds given)
seed_batch: int = 5  # sequential design: seeds added to the rows of undecided claims at each further look

# %%
import matplotlib.pyplot as plt
from IPython.display import Markdown, display

from dmlstudy import plots, rows
from dmlstudy.experiments import compare, kit, regime_comparison, tables
from dmlstudy.findings import claims
from dmlstudy.records import seed_everything
from dmlstudy.study import figure_index
from dmlstudy.study.report import write_table

config = compare.CompareStudy.from_namespace(globals())
seed_everything(0)
results_folder = config.results_folder()
print("protocol:", config.protocol.protocol_text(), "on", config.protocol.datasets)
print(
    "main methods:", config.methods, "| classic baselines:", config.classic_methods, "with seeds", config.classic_seeds
)
display(Markdown(rows.rows_markdown(config.rows())))

# %% [markdown]
# ## Runs
#
# Every main method on every dataset and seed, every classic baseline with `classic_seeds`. Finished runs
# are loaded from their folders (`runs/<study>/`); only missing ones are trained. The DIML re-ranking row
# is computed from the trained `ms` models (their grid embeddings, re-ranking cached in the run folders).

# %%
comparisons = [compare.compare_regime(regime_config) for regime_config in config.regime_configs()]
for comparison in comparisons:
    print(
        f"{comparison.protocol.regime} regime: {len(comparison.frame)} rows: {len(comparison.main)} main runs, "
        f"{len(comparison.classic)} classic runs; {len(comparison.claims)} claim rows"
    )
headline = comparisons[0]  # the figures below are the headline regime's
main_results, classic_results, frame = headline.main, headline.classic, headline.frame

# %% [markdown]
# ## The table
#
# One table per dataset in the form of the papers' state-of-the-art tables. Read a difference as real only
# when it is larger than about two standard deviations over the seeds.
#
# The re-ranked row only reorders each query's cosine top-K. Its NMI is the MS embeddings' by
# construction; and when K is at most R (the number of other images of the query's class: about 6.5 on emoji,
# 39 on SynBirds),
# the first R results keep their members, so RP cannot change. Only the order inside them changes, which
# moves Recall@K and MAP@R.

# %%
for comparison in comparisons:
    for dataset in config.protocol.datasets:
        markdown = tables.comparison_markdown(
            comparison.table, comparison.protocol, dataset=dataset, note=comparison.note
        )
        display(Markdown(markdown))
    written = tables.write_comparison(comparison.table, comparison.protocol, results_folder, note=comparison.note)
    print("written:", *[str(p) for p in written], sep="\n  ")

# %% [markdown]
# ## Validation and test R@1 on one scale
#
# Each run chose its checkpoint by R@1 on the validation fold, one fold of the training classes, and read the
# test classes once. Recall@1 falls as the gallery holds more classes, so the two numbers are on different
# scales. The last column reads each run's test embeddings on random draws of the validation fold's number of
# test classes (`dmlstudy.metrics.class_subset_recall`, 20 draws). If it is close to the validation R@1, the gap
# between validation and test is the class count, not a checkpoint fitted to the validation classes.

# %%
validation_classes = compare.validation_class_counts(config)
scale = tables.scale_table(main_results + classic_results, validation_classes=validation_classes)
if scale.empty:
    print("no validation fold in this protocol (validation_folds < 2): nothing to put on one scale")
else:
    display(scale[[c for c in scale.columns if not c.endswith(("_mean", "_std"))]])
    write_table(scale, results_folder / "compare_scale")

# %% [markdown]
# ## What the regime changes
#
# With `compared_regimes`, every row ran in each regime. Per row and dataset: Δ R@1 = headline regime − compared
# regime over the paired seeds (same batches; only the backbone's start differs). The `ms` row is the transfer
# check: does the pretrained backbone beat random initialisation at all?

# %%
if len(comparisons) > 1:
    regime_table = regime_comparison.regime_differences(comparisons, margin=config.margin)
    display(Markdown(regime_table.drop(columns=["variant", "outcome"]).to_markdown(index=False)))
    regimes = [comparison.protocol.regime for comparison in comparisons]
    written = regime_comparison.write_regime_differences(
        regime_table, results_folder, regimes=regimes, margin=config.margin
    )
    print("written:", *[str(p) for p in written], sep="\n  ")

# %% [markdown]
# ## Did the papers' claims hold on our data?
#
# Every claim of `dmlstudy/findings/claims.yaml`, one row per claim and dataset: the eight headline
# claims (each paper's method against its baseline) and the ablation claims the study runs (CRT's
# components, DIML's grid and truncation, cross-attention's block count, DGCRL's scale α and its speed).
# Ablation runs are the paper notebooks' (same names, `ablation_datasets` × `ablation_seeds`); the extra
# DIML re-rankings (1 × 1 grid, top 10) are computed here from the `ms` runs.
#
# **The rule, declared before the runs** (`docs/protocol.md`, `dmlstudy/verdicts.py`). Seed $s$ gives both
# sides of a claim the same backbone initialisation and the same batch sequence, so the differences are paired:
# $d_s = A_s - B_s$ over the seeds both sides ran, $\Delta = \bar d$ with the t-interval
# $\Delta \pm t_{1-\alpha_k/2,\,n-1}\, s_d / \sqrt n$ at the look's level ($\alpha_k = 0.05$ for a single look).
# The interval is read by the claim's kind, in a stated order: for **A > B**, *held* above 0 (*smaller than the
# margin* when it stays inside $(0, +m)$), *reversed* below 0, *equivalent (no effect)* — the claim **not
# held** — across 0 inside $\pm m$; for **A ≈ B**, *equivalent* (held) inside $\pm m$, judged first, *not
# equivalent* clear of it. Otherwise *undecided*: with the plan's sequential design (`seed_cap` above the seeds)
# the rows of undecided claims get `seed_batch` more seeds per look, the error rate spent across the looks;
# at the cap the table says the largest |Δ| the data still allow. A claim on epochs-to-best whose runs reached
# the epoch cap still improving (censored) reads **undecided (censored)** where that could overturn it.
# **Holm p** adjusts the decisions' p-values across each regime's claims. Every row recomputes from
# `runs_per_seed.csv`, written beside `claims.csv`. The paper's Δ (its backbone, its data: CUB-200 beside emoji
# in the default study, beside SynBirds in the embedded one; Cars196 beside Glyphs) is for scale only.

# %%
claim_table = regime_comparison.all_claims(comparisons)
for comparison in comparisons:
    print(f"protocol ({comparison.protocol.regime} regime): {comparison.protocol.protocol_text()}")
display(Markdown(claim_table[claims.CLAIM_COLUMNS].to_markdown(index=False)))
claims_written = claims.write_claims(
    claim_table, config.claims_scope(), results_folder, runs=regime_comparison.all_runs(comparisons)
)
print("written:", *[str(p) for p in claims_written], sep="\n  ")
claim_readings = claims.claim_sentences(claim_table)
for sentence in claim_readings:
    print("→", sentence)

# %% [markdown]
# **Forest plot**: each claim's Δ with its interval; the grey band is ±margin, the colour the claim's outcome
# (hollow: one seed, no verdict), a black ring a verdict that survives Holm's adjustment.

# %%
figure = claims.forest_figure(claim_table)
plots.save_and_show(figure, "claims_forest", study=config.protocol.study)
plt.show()

# %% [markdown]
# ## Generalisation: embedding-space density and spectral decay, for every method
#
# The CRT paper's two generalisation tables, extended to every method. From each run's own metrics,
# computed on its **test** embeddings with `drop_first = 0`:
#
# * **ESD** $= \pi_{intra} / \pi_{inter}$ with cosine distances: mean distance within a class over mean
#   distance between class centroids. The CRT paper reads a higher ESD (less over-compressed classes) as
#   better generalisation and reports CRT raising it.
# * **spectral decay** $\rho = KL(\mathcal U \,\|\, \tilde s)$ of the normalised singular values of the
#   embedding matrix: lower means a flatter spectrum, more directions in use (Roth et al., ICML 2020).
#
# The re-ranked row is left out: its embeddings are the MS baseline's. Look at whether the methods that
# rank higher in R@1 also have the higher ESD and lower ρ (the rank correlations below).

# %%
print(f"protocol: {config.protocol.protocol_text()}; test embeddings, drop_first = 0")
geometry_written = []
for metric, title in kit.GEOMETRY.items():
    geometry = tables.geometry_table(frame, metric=metric)
    print(f"\n{title}")
    display(geometry[[c for c in geometry.columns if not c.endswith("_mean") and c != "variant"]])
    geometry_written += write_table(geometry, results_folder / f"compare_{metric.lower()}")
geometry_readings = tables.geometry_readings(frame)
for sentence in geometry_readings:
    print("→", sentence)

# %% [markdown]
# **Singular-value spectra** of every method's test embeddings (first seed), normalised to sum 1, on a log
# scale; the legend gives ρ. A curve that stays high for longer uses more of the $d$ dimensions.

# %%
all_results, shown = main_results + classic_results, list(dict.fromkeys(frame["variant"]))
for dataset in config.protocol.datasets:
    embeddings = kit.first_seed_embeddings(all_results, dataset=dataset, variants=shown)
    figure = tables.spectrum_figure(embeddings, dataset=dataset)
    plots.save_figure(figure, f"compare_spectrum_{dataset}", study=config.protocol.study)
    plt.show()

# %% [markdown]
# ## The embedding spaces, side by side
#
# UMAP and t-SNE of the same test images in every panel — all images of the first `projection_classes`
# classes of the first dataset, first seed of each method — coloured by class. Both keep neighbourhoods,
# not distances: look for tight, separated clusters, and for classes that several methods confuse alike.

# %%
projected = kit.first_seed_embeddings(all_results, dataset=config.protocol.datasets[0], variants=shown)
for kind, enabled in (("umap", config.umap), ("tsne", config.tsne)):
    if enabled:
        figure = kit.projection_figure(
            projected,
            kind=kind,
            classes=config.projection_classes,
            title=f"{config.protocol.datasets[0]}, first seed",
            label=rows.method_label,
        )
        plots.save_figure(figure, f"compare_{kind}", study=config.protocol.study)
        plt.show()

# %% [markdown]
# ## Accuracy against training time
#
# Each method's R@1 against the wall-clock seconds its runs trained (from `metrics.json`; on a shared
# machine these vary with the load). The re-ranked MS row sits at the MS runs' training time: its cost
# is at test time (the `rerank_seconds` column).

# %% tags=["nbval-ignore-output"]
cost = tables.cost_table(frame)
display(cost)
write_table(cost, results_folder / "compare_cost")
figure = tables.time_figure(frame)
plots.save_and_show(figure, "compare_recall_vs_time", study=config.protocol.study)
plt.show()

# %% [markdown]
# ## Reading
#
# The sentences below are computed from the tables above: which claims held, which did not, what the
# geometry says — followed by the caveats that bound every one of them.

# %%
print("Claims:")
for sentence in claim_readings:
    print("•", sentence)
print("\nGeneralisation:")
for sentence in geometry_readings:
    print("•", sentence)
print("\nCaveats:")
for sentence in compare.caveats(config, frame):
    print("•", sentence)

# %% [markdown]
# ## figures/README.md
#
# This is the last notebook of the default plan: it indexes every figure the study wrote, each with the
# notebook that made it (from the file-name prefix).

# %%
readme = figure_index.write_figures_readme(config.figures_folder(), study=config.protocol.study)
print(readme, "lists", readme.read_text().count("![]("), "figures")
