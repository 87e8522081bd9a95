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
# # DIML — structural similarity by optimal transport (Zhao et al., ICCV 2021)
#
# **The paper.** Wenliang Zhao, Yongming Rao, Ziyi Wang, Jiwen Lu and Jie Zhou, *Towards Interpretable Deep
# Metric Learning with Structural Matching*, ICCV 2021
# ([CVF open access](https://openaccess.thecvf.com/content/ICCV2021/html/Zhao_Towards_Interpretable_Deep_Metric_Learning_With_Structural_Matching_ICCV_2021_paper.html);
# [arXiv:2108.05889](https://arxiv.org/abs/2108.05889)).
# **This notebook executed by the published study**, with every table and figure:
# [`published/20_diml.ipynb`](../published/20_diml.ipynb).
#
# **What it shows.** Optimal transport between two grids on a worked example; DIML as test-time re-ranking of a
# plain MS model, swept over the truncation $K$ and the grid size $G$ (the supplement's Tables 1 and 2); DIML in
# training; the transport plans between real test queries and their retrievals; and what re-ranking costs.
#
# **Data and network.** The default study (`plans/default.yaml`) runs it on **emoji** (1,122 emoji classes
# drawn by nine design families, rendered at 128 px) with **EfficientNet-Lite0** and its ImageNet weights, its
# last stage fine-tuned on a frozen, cached stem (the `imagenet` regime), 5 paired seeds. Executed without a
# plan, its parameters are CI-sized: a 4-conv network from random initialisation on 16 classes of the generated
# SynBirds set at 64 px, trained for seconds, so that the code runs end to end; those numbers mean nothing.
#
# **What it costs** on 2 CPU cores (docs/time.md): at CI size about 2 CPU-minutes; with the teaching preset
# (`make teach ONLY=diml`: emoji, EfficientNet-Lite0, one seed, at most 4 epochs) under 4 minutes once the data
# is built and the stem cached; in the published study its runs are part of the 69 that `make study` trains in
# 53 minutes.
#
# **Idea.** A global embedding $\bar z$ averages the whole feature map away: two drawings can have the same
# average colour and still differ in *where* each colour sits. DIML keeps, next to $\bar z$, a $G \times G$
# grid of **local embeddings** $\hat z_1, \dots, \hat z_{G^2}$ (the same embedding layer applied to each
# cell of the backbone map, each L2-normalised) and compares two images by how cheaply the cells of one can
# be *transported* onto the cells of the other. The resulting **structural similarity** is
#
# * interpretable — the transport plan says which part of image $s$ was matched to which part of $t$;
# * a drop-in for cosine: at test time it re-ranks the cosine top-$K$ of any trained model (no
#   retraining), and in training it replaces the similarity (or distance) inside a standard loss.
#
# This notebook builds both uses on the protocol's datasets (the default study: emoji), sweeps the truncation
# $K$ and the grid size $G$ as the paper's supplement does (its Tables 1 and 2), shows transport plans between
# real retrievals, and measures the cost. One seed decides nothing: a row's R@1 varies by 0.8–2.4 points from
# seed to seed in the default study, so with one seed the readings report differences, not verdicts. The
# defaults below are CI-sized (seconds, meaningless numbers); the study's plans inject real sizes.
# `protocol` is the protocol every study notebook shares (backbone, image size, d, batch, epochs, seeds, …), one
# mapping: a plan gives each notebook the same one, and the keys left out keep their CI-sized defaults.

# %% tags=["parameters"]
protocol: dict = {'study': 'notebook-20_diml'}  # the shared protocol: ProtocolConfig fields (dmlstudy/run/protocol.py); left out: CI-sized
base_losses: list = ['ms']  # base losses: a plain run and a DIML-trained run each (ms, margin, proxynca)
train_diml: bool = True  # also train the DIML variants (False: only re-rank the plain baselines)
top_ks: list = [0, 10, 50]  # truncation K of the re-ranking sweep (at grid_size)
grid_sizes: list = [1, 2, 4]  # grid sizes G of the grid sweep (at top_k); > 4 upsamples the 4 × 4 map
grid_size: int = 4  # G for DIML training and for the K sweep
top_k: int = 50  # K for the grid sweep (the paper: 100)
epsilon: float = 0.05  # entropic regularisation ε of the transport (training and re-ranking)
uniform_marginals: bool = False  # uniform 1/G² marginals instead of cross-correlation ones
paper_dataset: str = 'CUB-200'  # which of the paper's datasets is printed beside ours (CUB-200, Cars196, SOP)
cost_top_ks: list = [10, 50]  # K values of the re-ranking cost table
cost_grid_sizes: list = [2, 4]  # G values of the re-ranking cost table
cost_queries: int = 32  # queries timed per (K, G) cell of the cost table
example_queries: int = 2  # queries in the transport-plan figure
example_retrievals: int = 3  # retrievals per query in the transport-plan figure

# %%
from functools import partial

import pandas as pd
from IPython.display import display

from dmlstudy import plots
from dmlstudy.experiments import kit
from dmlstudy.experiments.papers import diml as diml_study
from dmlstudy.methods.diml import transport_explanation
from dmlstudy.records import seed_everything
from dmlstudy.run.data import load_datasets
from dmlstudy.structural import reranking

config = diml_study.DIMLStudy.from_namespace(globals())
seed_everything(0)
print(config.protocol.protocol_text(), "on", config.protocol.datasets)
print(
    "variants:",
    {name: spec.get("method_kwargs", {}) or spec["method"] for name, spec in diml_study.variants(config).items()},
)

# %% [markdown]
# ## Optimal transport between two grids
#
# For a pair of images $(s, t)$ with local embeddings $\hat z^s_i$, $\hat z^t_j$ ($i, j = 1..G^2$):
#
# $$S_{ij} = \langle \hat z^s_i, \hat z^t_j\rangle, \qquad C = \mathbf 1 \mathbf 1^\top - S, \qquad
#   K = \exp(-C/\varepsilon).$$
#
# How much "mass" each cell carries comes from **cross-correlation** with the *other* image's global
# embedding — a cell matters if it looks like what the other image is about (background cells get little):
#
# $$\mu^s_i \propto \operatorname{ReLU}\big(\langle \hat z^s_i, \bar z^t\rangle\big), \qquad
#   \mu^t_j \propto \operatorname{ReLU}\big(\langle \hat z^t_j, \bar z^s\rangle\big), \qquad
#   \textstyle\sum_i \mu^s_i = \sum_j \mu^t_j = 1.$$
#
# The entropic optimal transport problem (supplement Eq. A.1)
#
# $$T^\ast = \arg\min_{T \ge 0,\; T\mathbf 1 = \mu^s,\; T^\top \mathbf 1 = \mu^t}
#   \langle C, T\rangle + \varepsilon \sum_{ij} T_{ij}(\log T_{ij} - 1)$$
#
# is solved by **Sinkhorn's iterations** (Eq. A.2–A.3): starting from $b = \mathbf 1$,
#
# $$a \leftarrow \mu^s \oslash K b, \qquad b \leftarrow \mu^t \oslash K^\top a, \qquad
#   T = \operatorname{diag}(a)\, K \operatorname{diag}(b),$$
#
# and the **structural similarity** is the similarity the plan collects (Eq. 6):
# $s_{\text{struct}}(s, t) = \sum_{ij} T_{ij} S_{ij}$. Small $\varepsilon$ makes $T$ close to an exact
# matching (a permutation when the marginals are uniform); large $\varepsilon$ blurs it towards
# $\mu^s {\mu^t}^\top$. The paper uses $\varepsilon = 0.05$, $G = 4$, $K = 100$.
#
# **Worked example.** A toy $3 \times 3$ "image" $s$ (random unit vectors per cell) and $t$ = the same
# content moved down one row, plus noise. Look for: at $\varepsilon = 0.05$ with uniform marginals the plan
# is the shifted diagonal — it *finds* the correspondence, so $s_{\text{struct}}$ equals the
# true-correspondence similarity, while comparing cells at the same positions fails; at
# $\varepsilon = 0.5$ the plan is blurred and $s_{\text{struct}}$ drops; cross-correlation marginals move the
# mass to the cells that resemble the other image as a whole.

# %%
figure, example = diml_study.worked_example()
plots.save_and_show(figure, "diml_worked_example", study=config.protocol.study)
example.round(3)

# %% [markdown]
# ## Our implementation, and what it decides
#
# `dmlstudy/structural/transport.py` and `dmlstudy/methods/diml.py` (tested against slow per-pair loops, an exact assignment solver and
# pytorch-metric-learning in `tests/test_diml.py`):
#
# * **Grid.** Adaptive average pooling of the backbone map to $G \times G$. The default study's map is
#   $4 \times 4$ (EfficientNet-Lite0 at 128 px, stride 32; the CI-sized 4-conv network at 64 px, stride 16,
#   too): $G = 1, 2, 4$ pool it, $G = 7$ first **bilinearly upsamples** it to $7 \times 7$ (as the authors'
#   code does for sizes that do not divide the map) — so $G = 7$ adds no new information here, only finer
#   interpolated cells. $G = 1$ is the global embedding itself: $s_{\text{struct}} = \cos$, so
#   re-ranking by $\cos + s_{\text{struct}} = 2\cos$ changes nothing (the paper's $G = 1$ row equals its
#   $K = 0$ row for the same reason).
# * **Sinkhorn** runs in float32, on all pairs at once (a chunk of queries × all their candidates; the
#   $B \times B$ pairs of a batch in training). Each pair stops when its row marginal is within $10^{-3}$
#   (L1) or after 100 iterations; converged pairs leave the batch. Marginals whose weights are all zero
#   fall back to uniform (the authors' code would return an all-zero plan).
# * **Re-ranking** is a true top-$K$ re-rank: the first $K$ cosine neighbours are re-ordered by
#   $\cos + s_{\text{struct}}$, every later position keeps its cosine order (the authors' ablation code
#   splices lists and can duplicate items; we don't). It works on any model with a linear embedding
#   layer, e.g. the plain `ms` baseline, whose embedding layer is applied to each cell.
# * **Training** (supplement A.3): the plan $T$ is computed without gradient; gradients flow through $S$.
#   Multi-Similarity uses $s = \tfrac12(\cos(\bar z^s, \bar z^t) + s_{\text{struct}})$; Margin uses
#   $D = \tfrac12\big(\lVert \bar z^s - \bar z^t\rVert + \sum_{ij} T_{ij} \lVert \hat z^s_i - \hat z^t_j\rVert\big)$
#   (β = 1.2, margin 0.2, all triplets: the `margin` baseline's settings); ProxyNCA (option
#   `base_losses: [proxynca]`; the authors never released it) uses per-class grids of proxies whose mean is
#   the global proxy and $d \leftarrow \tfrac12(d + d_{\text{struct}})$.
# * **Metrics.** P@1, R-Precision and MAP@R with $R$ = the *other* images of the query's class. DIML's
#   evaluation code counts the query itself in $R$, which lowers its RP and MAP@R: compare directions of
#   effect with the paper's numbers, not levels (they are also on CUB-200 with an ImageNet-pretrained
#   ResNet-50 and $7 \times 7$ maps; the default study's are EfficientNet-Lite0's $4 \times 4$ maps of
#   128-px emoji).

# %% [markdown]
# ## Training the models
#
# Every base loss gets a plain run (`ms`, `margin`: test-time re-ranking is applied to these) and, with
# `train_diml`, a DIML-trained run (`diml` = DIML + Multi-Similarity, `diml_margin`), under one protocol,
# on every dataset and seed. Complete runs are loaded, not retrained (`ms` and `diml` are shared with the
# comparison notebook). Each model's test set is then embedded at every grid size and re-ranked for every
# $K$; the structural similarities of the top-$\max K$ candidates are computed once and reused.
# The runs and tables are declared in `dmlstudy/experiments/papers/diml.yaml`; `grid_size`, `epsilon` and
# `uniform_marginals` away from DIML's defaults suffix the DIML-trained runs' names (`diml_g2`, `_eps0.5`, `_uniform`).

# %%
results = diml_study.run_models(config)
frame = diml_study.sweep_frame(results, config)
print(f"{len(results)} runs, {len(frame)} evaluated settings")

# %% [markdown]
# ## Truncation K (supplement Table 1)
#
# Rows: each base loss, trained plainly (*baseline*: DIML as test-time re-ranking only) or with DIML, then
# ranked by cosine ($K = 0$) or re-ranked in the top $K$ at $G$ = `grid_size`. The paper's columns are its
# re-ranked baselines (ResNet-50) on the dataset named by `paper_dataset`. Look for: most of the paper's
# gain is already there at $K = 10$. Re-ranking only reorders the first $K$ results, so what a metric can gain
# depends on which positions it reads. P@1 reads the first position: it can change for every $K \ge 2$, as soon
# as a better candidate can be moved up into it. RP counts how many of the first $R$ results are the query's
# class ($R$: the number of other images of that class); while $K \le R$ the re-ranked images all stay inside the
# first $R$, so that count, and RP with it, cannot change. Only at $K > R$ can re-ranking bring a right image in
# from beyond position $R$ (or push a wrong one out). MAP@R, which weighs the order inside the first $R$, can
# change for every $K \ge 2$.

# %%
truncation = diml_study.rerank_sweep_table(frame, sweep="K", paper_dataset=config.paper_dataset)
print(
    config.protocol.protocol_text(),
    f"| G = {config.grid_size}, ε = {config.epsilon:g}, metrics in %, mean ± std over seeds",
)
display(kit.without_numbers(truncation))
for sentence in diml_study.sweep_readings(
    frame, sweep="K", low=min(config.top_ks), high=config.reference_k(), paper_dataset=config.paper_dataset
):
    print("•", sentence)
figure = diml_study.sweep_figure(frame, sweep="K")
plots.save_and_show(figure, "diml_truncation", study=config.protocol.study)

# %% [markdown]
# ## Grid size G (supplement Table 2)
#
# The same models re-ranked in the top $K$ = `top_k` with grids of $G \times G$ cells. $G = 1$ is the
# cosine ranking (see above). Look for: in the paper finer grids help up to $G = 4$ and $G = 7$ adds
# little; here $G = 7$ interpolates a $4 \times 4$ map, so it cannot add information, only smoother cells.

# %%
grid_table = diml_study.rerank_sweep_table(frame, sweep="G", paper_dataset=config.paper_dataset)
print(
    config.protocol.protocol_text(),
    f"| K = {config.top_k}, ε = {config.epsilon:g}, metrics in %, mean ± std over seeds",
)
display(kit.without_numbers(grid_table))
for sentence in diml_study.sweep_readings(
    frame, sweep="G", low=min(config.grid_sizes), high=config.reference_grid(), paper_dataset=config.paper_dataset
):
    print("•", sentence)
figure = diml_study.sweep_figure(frame, sweep="G")
plots.save_and_show(figure, "diml_grid_size", study=config.protocol.study)

# %% [markdown]
# ## DIML in training
#
# The same numbers arranged by training: does training with the structural similarity (and its averaged
# loss) give a better *cosine* embedding ($K = 0$), and does re-ranking still help on top of it? The
# supplement gives no numbers for these rows (the main paper reports gains from DIML training with its
# own protocol), so the readings only state our direction.

# %%
training = diml_study.training_table(frame, top_k=config.reference_k())
print(config.protocol.protocol_text(), f"| G = {config.grid_size}, metrics in %, mean ± std over seeds")
display(kit.without_numbers(training))
for sentence in diml_study.training_readings(frame, top_k=config.reference_k()):
    print("•", sentence)

# %% [markdown]
# ## What the plan matches
#
# For a few test queries and their top cosine retrievals (blue title: same class; vermillion: another class):
# the two images side by side with the transport plan drawn as lines between the centres of grid cells
# (thicker and more opaque = more mass; the $G^2$ largest entries of $T$), and the two marginals as heat maps
# over the cells (bright = much mass). Each cell stands for a region of the backbone map ($32 \times 32$
# input pixels of a 128-px emoji at stride 32; its receptive field is larger). Look for: mass concentrated on
# the drawing rather than the white background (cross-correlation marginals), and lines that connect
# corresponding parts of two designers' drawings even where the parts sit elsewhere — and for how
# $s_{\text{struct}}$ compares with the cosine on wrong retrievals.

# %%
example_run = diml_study.example_run(results, config)
test_set = load_datasets(example_run.config)["query"]
queries = diml_study.example_query_indices(len(test_set), count=config.example_queries, seed=0)
figure = kit.explained_retrievals(
    example_run,
    test_set,
    queries,
    retrievals=config.example_retrievals,
    explain=partial(transport_explanation, grid_size=config.grid_size, options=config.transport_options()),
)
print("model:", example_run.run_dir.name)
plots.save_and_show(figure, "diml_transport_plans", study=config.protocol.study)

# %% [markdown]
# ## Cost of re-ranking
#
# Milliseconds per query spent on the structural similarities of its $K$ candidates (the cosine search
# itself is excluded), measured on the example model's test set, batched over a chunk of queries × all
# their candidates. The cost grows linearly in $K$ and roughly with $G^4$ (a $G^2 \times G^2$ plan per
# pair); timings are wall-clock on whatever machine runs the notebook (noisy on a shared one).

# %% tags=["nbval-ignore-output"]
cost_sets = kit.evaluation_sets(example_run, grid_sizes=config.cost_grid_sizes)
cost = pd.DataFrame(
    reranking.rerank_cost(
        cost_sets["query"],
        top_ks=config.cost_top_ks,
        grid_sizes=config.cost_grid_sizes,
        queries=config.cost_queries,
        options=config.transport_options(),
    )
)
display(cost.round(2))
plots.save_and_show(diml_study.cost_figure(cost), "diml_cost", study=config.protocol.study)

# %% [markdown]
# ## Exercises
#
# Each uses this notebook's own outputs; run it with the teaching preset (`make teach ONLY=diml`, the executed
# copy in `runs/teach/diml/20_diml.ipynb`), or edit the parameters cell and run all.
#
# 1. **Predict, then look.** In the truncation table, for which $K$ can re-ranking change P@1, and for which
#    can it change RP? Predict both before reading the columns, then check the $K = 10$ and $K = 100$ rows
#    against $K = 0$. *Hint:* re-ranking the top $K$ only permutes the first $K$ results. P@1 changes when a
#    different image is moved into the first position, which any $K \ge 2$ allows. RP counts the query's class
#    among the first $R$; with $K \le R$ a permutation of the first $K$ keeps the first $R$ the same set, so RP
#    cannot change until $K > R$. An emoji class has 5 to 9 images (one per design family that draws it;
#    about 7.5 on average), so $R$ is 4 to 8: $K = 10$ already exceeds $R$ for every query, and RP can move at
#    $K = 10$ as well as at $K = 100$. Which of the two moves it more, and why?
# 2. **Change one parameter.** Set `epsilon = 0.5` (ten times the paper's 0.05) and re-run the worked example
#    and the transport plans. What happens to the lines, and to $s_{\text{struct}}$ of a correct retrieval?
#    *Hint:* the marginals do not depend on $\varepsilon$; the plan blurs towards $\mu^s {\mu^t}^\top$, so
#    $s_{\text{struct}}$ tends to the marginal-weighted mean of all cell similarities.
# 3. **Read a figure.** In the transport plans, compare $s_{\text{struct}}$ with the cosine for the vermillion
#    (wrong) retrievals and the blue (right) ones. Re-ranking sorts by their sum: would it move the wrong ones
#    down? *Hint:* only the difference between candidates matters for the order; the truncation table says
#    whether it did on average (one seed: a difference, not a verdict).
