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
# # CRT — coded residual transform (Kan et al., NeurIPS 2022)
#
# **The paper.** Shichao Kan, Yixiong Liang, Min Li, Yigang Cen, Jianxin Wang and Zhihai He, *Coded Residual
# Transform for Generalizable Deep Metric Learning*, NeurIPS 2022
# ([arXiv:2210.04180](https://arxiv.org/abs/2210.04180); [OpenReview](https://openreview.net/forum?id=AlgbeSuE1lx)).
# **This notebook executed by the published study**, with every table and figure:
# [`published/10_crt.ipynb`](../published/10_crt.ipynb).
#
# **What it shows.** The transform drawn with the study's real sizes; the headline comparison, MS against
# +CRT on unseen test classes; the paper's ablations the plan asks for (the default study: its components);
# the geometry the paper ties to generalisation (embedding-space density, spectral decay); and what the
# prototypes look at: code heat maps on test images, the prototypes' correlations, a t-SNE of both branches.
#
# **Data and network.** The default study (`plans/default.yaml`) runs it on **emoji** (1,122 emoji classes
# drawn by nine design families, rendered at 128 px) with **EfficientNet-Lite0** and its ImageNet weights, its
# last stage fine-tuned on a frozen, cached stem (the `imagenet` regime): 5 paired seeds for MS and CRT, 3 for
# the components. Executed without a plan, its parameters are CI-sized: a 4-conv network from random
# initialisation on 16 classes of the generated SynBirds set at 64 px, trained for seconds, so that the code runs
# end to end; those numbers mean nothing.
#
# **What it costs** on 2 CPU cores (docs/time.md): at CI size about 11 CPU-minutes (its many small ablation
# runs and the parameter counts), 5 to 10 minutes of waiting; with the teaching preset (`make teach ONLY=crt`:
# emoji, EfficientNet-Lite0, one seed, at most 4 epochs) under 7 minutes once the data is built and the stem
# cached; in the published study its runs are part of the 69 that `make study` trains in 53 minutes.
#
# **Idea.** A global-pooled feature keeps one view of the image. CRT describes the backbone's feature map
# from *K* learned perspectives: each prototype $c_k$ codes every location $x_j$ of the map by how well
# they align, and collects the *residuals* $x_j - c_k$ (the relative difference between what is seen and
# the prototype, not the feature values themselves):
#
# $$a_{jk} = \log\left[1 + \exp(x_j^\top c_k)\right], \qquad
#   r_k = \sum_{j=1}^{H\times W} a_{jk}\,(x_j - c_k), \qquad
#   f = \frac{1}{K}\sum_{k=1}^{K} \Gamma_k(r_k).$$
#
# Each $\Gamma_k$ is a linear projection of its own; $f$ is L2-normalised. Two embeddings are learned on one
# backbone: branch 1 ($K_1$ prototypes, $d = 128$, the one used at test time) and branch 2 ($K_2$
# prototypes, $D = 1024$). With **shared weights** (the paper's default) both branches use one prototype
# bank and differ only in their $\Gamma$ heads. Training minimises
#
# $$L = L_{DIV} + \lambda_1\big(L_{MS}(f^1) + L_{MS}(f^2)\big) + \lambda_2 L_{CON},\qquad
#   L_{DIV} = \frac{1}{K(K-1)}\sum_{k\neq j}\frac{|c_k^\top c_j|}{\|c_k\|\,\|c_j\|},\qquad
#   L_{CON} = \operatorname{mean}_{i,j}\,\big|S^{1}_{ij} - S^{2}_{ij}\big|,$$
#
# where $S^b$ is the cosine-similarity matrix of branch $b$'s batch embeddings: the low-dimensional
# embedding must rank the batch like the high-dimensional one (*cross-CRT correlation consistency*).
# $L_{DIV}$ keeps the prototypes diverse; $L_{MS}$ is Multi-Similarity. Defaults: $\lambda_1 = 1$,
# $\lambda_2 = 0.9$, $K_1 = K_2 = 64$.
#
# **Our choices** (see `dmlstudy/methods/crt.py`): residuals are divided by $H\cdot W$ — with bias-free
# $\Gamma_k$ and L2 normalisation the embedding is exactly the paper's, only gradient scale changes;
# $L_{CON}$ is a mean, not a sum; the projections $\Gamma_k$ start at $\sqrt{K}$ times `nn.Linear`'s
# scale (the $K$ projections together are one map of fan-in $K\cdot C$; under Adam this keeps their
# relative update size that of an ordinary linear head — with `nn.Linear`'s own init CRT learned at half
# the baseline's pace here); MS is the project's (α = 2, β = 50, λ = 0.5, ε = 0.1), the same as the `ms`
# baseline. Every table below trains all its settings under one protocol (printed above it) and reports
# mean ± std over seeds. The paper's numbers (ImageNet-pretrained MiT-B1 on CUB unless said) are printed
# beside ours for orientation; each table ends with a sentence, computed from the numbers, saying whether
# the paper's direction of effect held here. On emoji the paper's CUB numbers give the size of the effect it
# reports on photographs, not a level to reach. One seed decides nothing: a row's R@1 varies by 0.8–2.4 points
# from seed to seed in the default study, so a sentence marked "(1 seed)" reports a difference, not a verdict.
#
# The defaults below are CI-sized (seconds, meaningless numbers); the study's plans inject real sizes.
# `protocol` is the protocol every study notebook shares (backbone, image size, d, batch, epochs, seeds, …), one
# mapping: a plan gives each notebook the same one, and the keys left out keep their CI-sized defaults.
# Every sweep parameter is a list; an empty list skips that table.

# %% tags=["parameters"]
protocol: dict = {'study': 'notebook-10_crt'}  # the shared protocol: ProtocolConfig fields (dmlstudy/run/protocol.py); left out: CI-sized
ablation_datasets: list = ['synbirds']  # datasets of the ablation tables
ablation_seeds: list = [0]  # seeds of the ablation tables
components: bool = True  # full / −CRT / −CRT−Consistency table
multi_perspective: bool = True  # K1 and K2 both 1 against the default 64
shared_ablation: bool = True  # shared prototype bank against two banks
k1_values: list = [1]  # K1 sweep (separate banks, K2 at 64); 64 is always added
k2_values: list = [1]  # K2 sweep (separate banks, K1 at 64); 64 is always added
lambda2_values: list = [0.0]  # λ2 sweep; 0.9 (the default run) is always added
batch_sizes: list = [32]  # total batch N (P·M) at the protocol M; its N added
dim_pairs: list = [[32, 64]]  # (d, D) scored on both branches; (128, 1024) added
backbones: list = ['test_vit']  # MS vs +CRT per backbone; the protocol's added
complexity_backbones: list = ['test_resnet', 'test_vit']  # whole backbones counted after the protocol's
complexity_image_size: int = 227  # pixels of the params/FLOPs count (227 as in the paper)
geometry_splits: list = ['test']  # ESD/ρ on these splits (test, train)
geometry_drop_first: list = [0, 1]  # ρ with these many singular values dropped
heatmap_prototypes: int = 8  # prototypes shown in the code heat maps
tsne_classes: int = 5  # test classes in the t-SNE plots

# %%
from IPython.display import display

from dmlstudy import plots
from dmlstudy.experiments import ablations, kit
from dmlstudy.experiments.papers import crt
from dmlstudy.records import seed_everything
from dmlstudy.run.data import load_datasets

config = crt.CRTStudy.from_namespace(globals())
ablation = config.ablation_protocol()
seed_everything(0)
readings = []  # every table's computed one-line reading, gathered at the end
print("main protocol:    ", config.protocol.protocol_text(), "on", config.protocol.datasets)
print("ablation protocol:", ablation.protocol_text(), "on", config.ablation_datasets)

# %% [markdown]
# ## The transform, annotated
#
# The diagram is drawn from the CRT that the protocol's runs start from, built as they build it, so the sizes
# are the real ones: in the default study EfficientNet-Lite0's last stage gives a $320 \times 4 \times 4$ map at
# 128 px ($C = 320$ channels: the runs leave out EfficientNet's $1 \times 1$ `conv_head`, which would widen it to
# 1,280), so $H\cdot W = 16$ tokens; each is coded against every prototype (orange); the coded residuals $r_k$ go
# through per-prototype projections into the two branches (green); the three losses are in red. `untrained` is
# kept for the prototype correlations below: its prototypes are the ones a run starts from.

# %%
untrained = crt.untrained_model(config.protocol)
figure = crt.transform_figure(untrained, image_size=config.protocol.image_size)
plots.save_and_show(figure, "crt_transform", study=config.protocol.study)
# %% [markdown]
# ## MS baseline vs +CRT
#
# The headline comparison: the plain MS baseline (`ms`: pooled features → FC → MS) and CRT with every
# default (`crt`), same backbone, batch, epochs and seeds, on the protocol's datasets (the default study: emoji,
# EfficientNet-Lite0 with its ImageNet weights, its last stage fine-tuned at 128 px). The paper's MiT-B1 numbers
# (CUB, Cars) show the size of the effect it reports on photographs with a larger backbone.

# %%
main_results, sentences = ablations.run_and_report(crt.DECLARED, "main", config)
readings += sentences

# %% [markdown]
# ## Ablations
#
# The paper's ablation tables, CPU-sized: run on `ablation_datasets` with `ablation_seeds` (often one
# seed: then a difference of a point or two is not evidence). Settings that coincide share one run.
#
# ### Components
#
# *Full* is CRT; *−CRT* keeps two branches and $L_{CON}$ but replaces the transform by pooled features
# and FC heads ($d$ and $D$); *−CRT−Consistency* is the plain MS baseline. The paper gains 1.98 points
# from the transform and 1.72 from the two-branch consistency.

# %%
readings += ablations.run_and_report(crt.DECLARED, "components", config)[1]

# %% [markdown]
# ### Multi-perspective transform
#
# *w/o* uses a single prototype per branch ($K_1 = K_2 = 1$): one perspective, one coded residual.

# %%
readings += ablations.run_and_report(crt.DECLARED, "multi_perspective", config)[1]

# %% [markdown]
# ### Shared weights between the branches
#
# Sharing one prototype bank computes the coded residuals once; the paper found no loss in accuracy
# (75.95 vs 75.96), so it keeps sharing for its lower cost. The cost sentence (seconds per epoch,
# parameters) comes from the runs' records.

# %%
readings += ablations.run_and_report(crt.DECLARED, "shared", config)[1]

# %% [markdown]
# ### Number of prototypes: $K_1$ (branch 1) and $K_2$ (branch 2)
#
# One branch's $K$ varies while the other stays at 64, with separate banks (sharing requires
# $K_1 = K_2$; the paper's $K_1$ table must have done the same — its $K_1 = 64$ row equals its
# "w/o shared weights" result). The paper finds $K_1$ nearly irrelevant (a 0.5-point spread) and
# $K_2$ = 64 best.

# %%
for sweep in ("K1", "K2"):
    readings += ablations.run_and_report(crt.DECLARED, sweep, config)[1]

# %% [markdown]
# ### Weight of the consistency loss, $\lambda_2$
#
# $\lambda_2 = 0$ trains two independent branches on one backbone; the paper's R@1 rises by almost 3
# points up to $\lambda_2 = 0.9$.

# %%
readings += ablations.run_and_report(crt.DECLARED, "λ2", config)[1]

# %% [markdown]
# ### Batch size
#
# $N = P \cdot M$ with the protocol's $M$ images per class; $L_{CON}$ compares $N \times N$ similarity
# matrices, so it sees more structure in larger batches. The paper's best is $N = 80$, with 32 the worst.
# With a full pass per epoch, a larger batch also means fewer steps.

# %%
readings += ablations.run_and_report(crt.DECLARED, "N", config)[1]

# %% [markdown]
# ### Embedding sizes $(d, D)$, scored on both branches
#
# Each run is evaluated twice: with branch 1 ($d$, the test-time embedding) and with branch 2 ($D$). In the
# paper the high-dimensional branch 2 is usually (4 of 5 pairs) slightly better, and a larger $d$ helps
# branch 1.

# %%
if config.dim_pairs:
    variants = crt.dim_variants(config.dim_pairs, ablation)
    results = kit.run_variants(ablation, ablations.grid(variants), datasets=config.ablation_datasets)
    table, sentences = crt.dims_table(results, variants)
    readings += kit.report(ablation, table, sentences, title="(d, D) on both branches")

# %% [markdown]
# ### Backbones
#
# MS vs +CRT on several timm backbones, all randomly initialised at 64 px with a 4 × 4 grid (ResNets at
# output stride 16, ViTs with `img_size` = 64): a check that CRT runs on other architectures, made at CI size
# and in the embedded study (the default study leaves `backbones` empty). The paper's table (pretrained
# backbones, 227 px) follows ours.

# %%
if config.backbones:
    variants = crt.backbone_variants(config.backbones, ablation)
    grid = {name: spec for pair in variants.values() for name, spec in pair.values()}
    results = kit.run_variants(ablation, grid, datasets=config.ablation_datasets)
    table, sentences = crt.backbone_table(results, variants)
    readings += kit.report(ablation, table, sentences, title="MS vs +CRT per backbone (R@1 %)")
    print("paper (R@1 % of MS / +CRT, pretrained, 227 px):")
    print(kit.paper_frame("crt", "BACKBONES").to_string(index=False))

# %% [markdown]
# ### Parameters and FLOPs
#
# Counted for one image at the paper's 227 px (`torch.utils.flop_counter`, 2 FLOPs per multiply-add).
# The paper's table counts backbones only; we add the MS head and CRT's heads: at test time CRT keeps
# one bank ($K \cdot C$) and the branch-1 projections ($K \cdot C \cdot d$); training adds branch 2
# ($K \cdot C \cdot D$). With one full projection per prototype the heads grow with the backbone's width $C$
# (column `C`). The first row is the protocol's backbone as its runs train it (the default study:
# EfficientNet-Lite0 without `conv_head`, $C = 320$); `complexity_backbones` adds others, whole.

# %%
ours, paper, sentences = crt.complexity_table(
    config.complexity_backbones,
    image_size=config.complexity_image_size,
    embedding_dim=config.protocol.embedding_dim,
    protocol=config.protocol,
)
print(f"ours, {config.complexity_image_size} px, d = {config.protocol.embedding_dim}:")
display(ours)
print("paper (backbones only, 227 px):")
display(paper)
for sentence in sentences:
    print("→", sentence)
readings += [f"Complexity — {sentence}" for sentence in sentences]

# %% [markdown]
# ## Generalisation: embedding-space density and spectral decay
#
# *ESD* $= \pi_{intra}/\pi_{inter}$ (cosine distances; higher = classes less over-compressed) and spectral
# decay $\rho = KL(\mathcal{U}\,\|\,\tilde s)$ of the normalised singular values (lower = a flatter
# spectrum, more directions used). Roth et al. tie high density and low decay to better transfer to unseen
# classes; the paper reports CRT raising ESD and lowering ρ on all four datasets. Computed from the main
# runs' branch-1 embeddings, per split and per `drop_first` (how many leading singular values are dropped;
# the paper does not say).

# %%
table, sentences = crt.split_geometry_table(
    main_results, splits=config.geometry_splits, drop_first=config.geometry_drop_first
)
readings += kit.report(config.protocol, table, sentences, title="ESD and spectral decay")
for dataset in config.protocol.datasets:
    embeddings = {
        variant: result.embeddings["embeddings"]
        for variant, result in main_results
        if result.config.dataset == dataset and result.config.seed == config.protocol.seeds[0]
    }
    figure = plots.spectrum(
        embeddings,
        drop_first=config.geometry_drop_first[-1] if config.geometry_drop_first else 0,
        title=f"{dataset} test spectrum, seed {config.protocol.seeds[0]}",
    )
    plots.save_figure(figure, f"crt_spectrum_{dataset}", study=config.protocol.study)

# %% [markdown]
# ## What the prototypes look at
#
# **Code heat maps.** $a_{jk} = \mathrm{softplus}(x_j^\top c_k)$ on the backbone grid for the 8 most
# spatially selective prototypes of the trained `crt` run, upsampled to the image and overlaid (each map
# scaled to its own range), on two test images of two different emoji. Look for prototypes that fire on the
# drawing, others on the white background or the corners, and whether a prototype fires on comparable parts of
# both images — the paper shows prototypes responding to different local or global views. The grid
# is 4 × 4 (EfficientNet-Lite0 at 128 px: each cell covers 32 × 32 input pixels), so the maps are coarse.

# %%
reference = kit.find_run(main_results, crt.DECLARED.method, dataset=config.protocol.datasets[0])
test_set = load_datasets(reference.config)["query"]
figure = kit.explained_retrievals(
    reference,
    test_set,
    [0],
    retrievals=1,
    explain=lambda method, images: method.explain(images, prototypes=config.heatmap_prototypes),
)
plots.save_and_show(figure, "crt_heatmaps", study=config.protocol.study)
# %% [markdown]
# **Prototype correlations.** $|\cos(c_k, c_j)|$ between the prototypes of the trained `crt` run (left) and of
# the same CRT before training (middle), the diagonal greyed out (it is 1 by definition) and both maps on one
# colour scale fitted to their off-diagonal; on the right, the histogram of the off-diagonal values of each.
#
# Why the trained bank can reach orthogonality: $K = 64$ prototypes live in $C = 320$ dimensions, and since
# $K \le C$ there is room for 64 mutually orthogonal directions, so $L_{DIV}$'s minimum, 0, is attainable
# exactly. Random prototypes start near it already: two random directions in $C$ dimensions have
# $|\cos| \approx \sqrt{2/(\pi C)} \approx 0.045$ (the dashed line). $L_{DIV}$ is a mean of $|\cos|$, whose
# gradient on each pair does not shrink as the cosine shrinks (its size does not depend on how close to 0 the
# pair is, only its sign does), and AdamW scales each step by the gradient's running size, so the
# prototypes keep being pushed until the cosines sit at 0 within the step size. The retrieval losses leave room
# for it: 64 orthogonal directions fill only a fifth of the 320 dimensions, so a bank can be exactly orthogonal
# and still point where MS and $L_{CON}$ need it, and the two objectives hardly compete. So expect the trained
# histogram to be a spike at 0 (the title's off-diagonal mean 0.000) and the trained map uniformly dark, against
# the untrained spread around 0.045. With $K > C$ (more prototypes than dimensions) exact orthogonality is
# impossible and the off-diagonal could not reach 0.

# %%
figure = crt.prototype_correlation_figure(reference.method, untrained=untrained)
plots.save_and_show(figure, "crt_prototype_correlation", study=config.protocol.study)
# %% [markdown]
# **t-SNE of the two branches.** Test embeddings of the first classes from branch 2 ($D$) and branch 1
# ($d$). $L_{CON}$ asks both to rank the batch alike, so the two maps should show similar cluster
# structure. (Exact t-SNE for up to 1,000 points: scikit-learn's Barnes-Hut was ~10× slower here.)

# %%
figure = crt.branch_tsne_figure(reference, classes=config.tsne_classes)
plots.save_and_show(figure, "crt_tsne", study=config.protocol.study)
# %% [markdown]
# ## Readings
#
# Every table's computed sentence, in one place.

# %%
for reading in readings:
    print("•", reading)

# %% [markdown]
# ## Exercises
#
# Each uses this notebook's own outputs; run it with the teaching preset (`make teach ONLY=crt`, the executed
# copy in `runs/teach/crt/10_crt.ipynb`), or edit the parameters cell and run all.
#
# 1. **Predict, then look.** $L_{DIV}$ pushes $|\cos(c_k, c_j)|$ towards 0. Before reading the prototype
#    correlations: will the trained run's off-diagonal mean be far below that of the untrained CRT (the model
#    drawn in the first figure, `untrained`)? Write down both numbers you expect, then read them in the titles
#    of the figure's two maps and in its histogram. *Hint:* random prototypes in $C$ dimensions are already
#    nearly orthogonal, $|\cos| \approx \sqrt{2/(\pi C)}$: about 0.045 for the $C$ = 320 channels of
#    EfficientNet-Lite0's last stage (`crt.random_prototype_cosine(320)`). Compare the trained value with that, to
#    the third decimal, and say whether it could reach 0 if $K$ were larger than $C$.
# 2. **Change one parameter.** Set `lambda2_values = [0.0]` (two branches trained without the consistency
#    loss) and re-run the $\lambda_2$ table. Is R@1 at $\lambda_2 = 0$ lower than at 0.9, as in the paper
#    (almost 3 points)? *Hint:* with one seed a difference of 2 points is within the spread of one row over
#    seeds (MS: 54.3 ± 0.6 R@1 over 5 seeds in the published study); the paper's claim needs paired seeds
#    (`ablation_seeds = [0, 1, 2]`, and `results/claims.md` for how a verdict is read).
# 3. **Read a figure.** In the code heat maps, find a prototype that fires on the drawing in both test images
#    and one that fires on the white background. Does the mean code ā in a title tell you which prototypes
#    matter for the embedding? *Hint:* each map is min–max scaled on its own, so a bright spot says *where* a prototype
#    fires, not how strongly; ā gives the strength, and $r_k$ weights each residual by $a_{jk}$.
