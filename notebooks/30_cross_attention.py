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
# # Cross-image attention for conditional embeddings (Kotovenko et al., CVPR 2023)
#
# **The paper.** Dmytro Kotovenko, Pingchuan Ma, Timo Milbich and Björn Ommer, *Cross-Image-Attention for
# Conditional Embeddings in Deep Metric Learning*, CVPR 2023
# ([CVF open access](https://openaccess.thecvf.com/content/CVPR2023/html/Kotovenko_Cross-Image-Attention_for_Conditional_Embeddings_in_Deep_Metric_Learning_CVPR_2023_paper.html);
# [doi:10.1109/CVPR52729.2023.01065](https://doi.org/10.1109/CVPR52729.2023.01065)). **This notebook executed
# by the published study**, with every table and figure:
# [`published/30_cross_attention.ipynb`](../published/30_cross_attention.ipynb).
#
# **What it shows.** The hierarchy of conditional embeddings drawn for one pair; MS against cross-attention on
# unseen test classes (the paper's Table 1); how much training signal reaches the test-time embedding; which
# similarity level $s^n$ ranks best for models trained with $N$ blocks (the paper's Figure 3); the attention
# maps of one image conditioned on another of its class and of another class; local part discovery.
#
# **Data and network.** The default study (`plans/default.yaml`) runs it on **emoji** (1,122 emoji classes
# drawn by nine design families, rendered at 128 px) with **EfficientNet-Lite0** and its ImageNet weights, its
# last stage fine-tuned on a frozen, cached stem (the `imagenet` regime): 5 paired seeds for MS and
# cross-attention, 3 for the grid of block counts. Executed without a plan, its parameters are CI-sized: a 4-conv
# network from random initialisation on 16 classes of the generated SynBirds set at 64 px, trained for seconds,
# so that the code runs end to end; those numbers mean nothing.
#
# **What it costs** on 2 CPU cores (docs/time.md): at CI size about 3 CPU-minutes; with the teaching preset
# (`make teach ONLY=cross_attention`: emoji, EfficientNet-Lite0, one seed, at most 4 epochs) about 4 minutes
# once the data is built and the stem cached; in the published study its runs are part of the 69 that
# `make study` trains in 53 minutes.
#
# **Idea.** A standard embedding $\phi(E(I_i))$ pools the feature map $E(I_i) \in \mathbb{R}^{hw\times c}$ of
# image $i$ *before* it knows which image it will be compared with. During training we do know: every pair
# of the batch enters the loss. So let the embedding of $i$ be **conditioned** on its partner $j$: the
# partner's embedding is the query of a cross-attention over $i$'s locations (Eq. 1–2),
#
# $$\mathrm{Attn}(q, E_i) = \operatorname{softmax}\!\Big(\frac{Q(\hat q)\,K(\mathrm{LN}(E_i))^\top}{\sqrt d}\Big) \in \mathbb{R}^{1\times hw},
#   \qquad \mathrm{CA}(q, E_i, E_i) = \mathrm{Attn}(q, E_i)\;V(\mathrm{LN}(E_i)),\qquad \hat q = q/\|q\|,$$
#
# with linear maps $Q: d\to d$ and $K, V: c \to d$, one head, no residual, MLP or output projection.
# Repeating it builds a **hierarchy** of conditional embeddings (Eq. 4),
#
# $$\phi^0(i) = \mathrm{Linear}\big(\mathrm{avgpool}\,E_i\big),\qquad
#   \phi^n(i\,|\,j) = \mathrm{CA}\big(\phi^{n-1}(j\,|\,i),\ E_i,\ E_i\big),\quad n = 1..N,$$
#
# and the loss is Multi-Similarity on the similarity of the last level (Eq. 5–6),
#
# $$s^n(i, j) = \cos\big(\phi^n(i\,|\,j),\ \phi^n(j\,|\,i)\big), \qquad \mathcal L = \mathrm{MS}\big(s^N\big).$$
#
# Gradients reach the encoder $E$ directly through the keys and values of every block, not only through the
# pooling of $\phi^0$. **At test time only $\phi^0$ is used**: the same network, parameters and cost as the MS
# baseline; the blocks exist only during training.
#
# **Our implementation** (`dmlstudy/methods/cross_attention.py`): all ordered pairs of a batch at once, a
# $B\times B\times d$ tensor per level with two einsums; keys and values once per image; one block shared by
# all levels (default: the paper's 27.7M parameters only fit shared blocks); one LayerNorm per block on
# $E_i$; MS with the study's settings (α = 2, β = 50, λ = 0.5, ε = 0.1), the same as the `ms` baseline.
# With $N = 0$ the method *is* the MS baseline. Options (not the paper's default): independent blocks,
# a residual $\phi^n(i|j) = \phi^{n-1}(i|j) + \mathrm{CA}(\ldots)$, and MS on $s^0$ added to the loss.
#
# Every table trains its settings under one protocol (printed above it) and reports mean ± std over seeds.
# The paper's numbers (ImageNet-pretrained ResNet-50, 224 px, d = 512, real data) are printed beside ours for
# orientation: on emoji they give the size of the effect the paper reports on photographs, not a level to reach.
# Each table ends with sentences
# computed from the numbers. One seed decides nothing: a row's R@1 varies by 0.8–2.4 points from seed to seed in
# the default study, so with one seed a sentence reports a difference, not a verdict. The defaults below are
# CI-sized (seconds, meaningless numbers); the study's plans inject real sizes.
# `protocol` is the protocol every study notebook shares (backbone, image size, d, batch, epochs, seeds, …), one
# mapping: a plan gives each notebook the same one, and the keys left out keep their CI-sized defaults.

# %% tags=["parameters"]
protocol: dict = {'study': 'notebook-30_cross_attention'}  # the shared protocol: ProtocolConfig fields (dmlstudy/run/protocol.py); left out: CI-sized
ablation_datasets: list = ['synbirds']  # datasets of the N × n grid, the options and the parameter table
ablation_seeds: list = [0]  # seeds of the ablations
block_counts: list = [0, 6]  # trained N, the rows of the grid (N 0: the ms run; N > 0: the cross_attention runs with N blocks)
rescoring_subset: int = 100  # test images scored all-against-all with sⁿ (0: the whole test set)
options: list = []  # extra variants: independent, residual, unconditional_loss
larger_backbone: str = 'test_resnet'  # MS without blocks on this (bigger) backbone; "" skips the table
attention_blocks: list = [2, 4, 6]  # blocks whose attention maps are drawn
attention_examples: int = 2  # image triples (x, a same class, b other class) in the attention figure
part_queries: int = 2  # query images of the local-part figure (one location each)
part_neighbours: int = 6  # most similar locations shown per query

# %%
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import display

from dmlstudy import plots
from dmlstudy.experiments import ablations, kit
from dmlstudy.experiments.papers import cross_attention as ca_study
from dmlstudy.explanations import local_parts_figure
from dmlstudy.methods.cross_attention import attention_statistics, attention_triples, feature_maps
from dmlstudy.records import seed_everything
from dmlstudy.run.data import load_datasets

config = ca_study.CrossAttentionStudy.from_namespace(globals())
ablation = config.ablation_protocol()
seed_everything(0)
readings = []  # every table's computed reading, gathered at the end
print("main protocol:    ", config.protocol.protocol_text(), "on", config.protocol.datasets)
print("ablation protocol:", ablation.protocol_text(), "on", config.ablation_datasets)

# %% [markdown]
# ## The hierarchy, drawn
#
# One pair $(i, j)$ of the batch. Level $n$ of image $i$ uses level $n-1$ of image $j$ as its query (orange,
# crossing over) and attends over its own feature map (blue: keys and values, computed once per image and
# reused by every level when the block is shared). The last level's cosine is the similarity the loss sees.

# %%
figure = ca_study.hierarchy_diagram(levels=3, embedding_dim=config.protocol.embedding_dim)
plots.save_and_show(figure, "cross_attention_hierarchy", study=config.protocol.study)
# %% [markdown]
# ## MS baseline vs cross-attention (evaluated with $s^0$)
#
# The paper's Table 1 on our data: `ms` (pooled features → linear → MS) against `cross_attention` (the same
# network trained through its tuned number of shared blocks: 5 on emoji, `plans/tuned/imagenet/emoji.yaml`; 6 in
# the paper), both evaluated with the plain embedding $\phi^0$, on the protocol's datasets (the default study:
# emoji). R@1, R@2 and NMI (k-means with k = number of test classes) as in the paper, plus the
# measured training seconds per epoch (the training-time cost of the blocks). The paper's MS row is the
# original MS paper's BN-Inception result, its own row ResNet-50: the gap it reports (+8.9 R@1 on CUB) mixes
# backbone and method; ours compares like with like.

# %% tags=["nbval-ignore-output"]
main_results, sentences = ablations.run_and_report(ca_study.DECLARED, "main", config)
readings += sentences

# %% [markdown]
# ## How much training signal reaches the test-time embedding?
#
# At test time only $\phi^0$ is used, but in the paper's block $\phi^0$ reaches the loss only as the
# *query* of level 1, whose output is the query of level 2, and so on: through $N$ softmaxes whose logits
# are small at initialisation (unit-norm $\hat q$, divided by $\sqrt d$). The table measures, on one training
# batch at initialisation (same seed, so the same weights), the gradient norm reaching $\phi$'s weights and
# the first convolution, for MS, the method at several $N$, and the two options that give $\phi^0$ a direct
# path to the loss (the residual, and MS on $s^0$). The backbone itself gets *more* gradient with the
# blocks (keys and values at every level), as the paper argues.

# %%
gradients = kit.initial_gradients(
    config.protocol, dataset=config.protocol.datasets[0], variants=ablations.table_rows(ca_study.DECLARED, "gradients")
)
print(config.protocol.protocol_text(), "on", config.protocol.datasets[0], "— one training batch at initialisation")
display(gradients)
readings.append(ca_study.gradient_reading(gradients))
print(readings[-1])

# %% [markdown]
# ## Does a deeper hierarchy help, and should $s^n$ ($n > 0$) be used at test time? (the paper's Figure 3)
#
# Rows: models trained with $N$ blocks ($N = 0$ is the MS run). Columns: the level $n \le N$ whose similarity
# $s^n$ ranks the test images. $n > 0$ needs its own hierarchy for *every pair*, so it is scored
# all-against-all on a seeded random subset of the test set (`rescoring_subset` images; the query excluded):
# its R@1 is higher than on the full test set (a smaller gallery), so compare within the grid. The last column
# is each model's full-test R@1 with $s^0$. The paper's caption says higher $s^n$ *degrade* retrieval, its
# text that they give a *slight improvement*; the sentence under the heat map settles it on our data.

# %%
grids = {}
for dataset, runs in ca_study.block_runs(config).items():
    grids[dataset] = ca_study.rescoring_grid(runs, subset=config.rescoring_subset, seed=0)
    print(ablation.protocol_text(), f"on {dataset}; sⁿ scored on {config.rescoring_subset or 'all'} test images")
    display(grids[dataset].round(1))
    figure = ca_study.grid_heatmap(grids[dataset], title=f"R@1 (%) of sⁿ on a test subset of {dataset}")
    plots.save_figure(figure, f"cross_attention_grid_{dataset}", study=config.protocol.study)
    plt.show()
    sentences = [f"{dataset}: {text}" for text in ca_study.grid_readings(grids[dataset])]
    readings += sentences
    print("\n".join(sentences))

# %% [markdown]
# ## Attention maps, block by block
#
# `attention_blocks` asks for blocks 2, 4 and 6, the depths the paper's maps compare. A model has only the blocks it
# was trained with: the default study's cross-attention model has 5 (its tuned number of blocks on emoji), so
# there is no block 6 to draw. The figure draws the blocks asked for that the model has, and always its last
# block, the deepest attention it learned: 2, 4 and 5 in the default study. The line printed above the figure
# names the blocks drawn.
#
# For an image $x$ of the test set we record (with forward hooks, from the ordinary forward pass) the
# attention over $x$'s locations at each block when $x$ is conditioned on image $a$ of the same class (top
# row) and on image $b$ of another class (bottom row); the middle row is their difference (red: more weight
# when conditioned on $a$). The left column shows $a$, $x$ and $b$. The paper reports that deeper blocks
# focus on fewer details and that the map of the same image changes with the conditioning image. The table
# under the figure measures both: the entropy of the attention per block ($\log T$ is uniform) and the
# total variation between the two maps.

# %%
model_run = kit.find_run(main_results, ca_study.DECLARED.method, dataset=config.protocol.datasets[0])
test_set = load_datasets(model_run.config)["query"]
triples = attention_triples(test_set.labels, config.attention_examples, seed=0)
print(ca_study.drawn_blocks(config.attention_blocks, model_run.method.num_blocks)[1])
figure = ca_study.attention_figure(model_run.method, test_set, triples, blocks=config.attention_blocks)
plots.save_and_show(figure, "cross_attention_maps", study=config.protocol.study)
plt.show()
statistics = pd.DataFrame.from_dict(attention_statistics(model_run.method, test_set, triples), orient="index")
statistics = statistics.rename_axis("block").round(3)
display(statistics)
readings.append(ca_study.attention_reading(statistics))
print(readings[-1])

# %% [markdown]
# ## Local part discovery (the paper's Figure 5)
#
# The encoder never sees part labels, yet its local features may come to describe parts. For the most
# activated interior location of a query image (orange outline; border cells are left out because zero
# padding dominates them), every other test image contributes its most similar
# location (cosine of backbone features); the most similar ones are shown as crops of two grid cells, framed
# blue when the image is of the query's class and vermillion otherwise. The table compares the share of blue with
# chance.

# %%
maps = feature_maps(model_run.method, test_set, device=kit.device_of(model_run.method))  # N × C × H × W
figure, parts = local_parts_figure(maps, test_set, queries=config.part_queries, neighbours=config.part_neighbours)
plots.save_and_show(figure, "cross_attention_parts", study=config.protocol.study)
plt.show()
display(parts)
readings.append(ca_study.parts_reading(parts))
print(readings[-1])

# %% [markdown]
# ## Parameters: the blocks vs a bigger backbone (the paper's Sec. 4.1.2)
#
# Are the gains just extra parameters? The paper's ResNet-50 + 6 blocks (27.7M) beats an MS ResNet-101
# (45.3M). Here: MS, MS + blocks, and MS on a larger backbone without blocks (`larger_backbone`). The blocks
# count only at training time; at inference the cross-attention model has exactly the baseline's parameters.

# %%
if ablations.enabled(ca_study.DECLARED, "parameters", config):
    parameter_results = ablations.run_table(ca_study.DECLARED, "parameters", config)
    table, sentences = ca_study.parameter_table(parameter_results, config)
    readings += sentences
    print(ablation.protocol_text(), "on", config.ablation_datasets)
    display(table)
    print("\n".join(sentences))
else:
    print("larger_backbone is empty: table skipped")

# %% [markdown]
# ## Options (not in the paper's default)
#
# Independent blocks (N × the block parameters), a residual on the image's own previous level, and MS on
# $s^0$ added to the loss, each against the default at $N = 6$, evaluated with $s^0$ as always. The last two
# give $\phi^0$ the direct path to the loss that the gradient table above shows missing. Skipped when
# `options` is empty.

# %%
if config.options:
    readings += ablations.run_and_report(ca_study.DECLARED, "options", config)[1]
else:
    print("options is empty: table skipped")

# %% [markdown]
# ## Readings
#
# Every sentence above, computed from this run's numbers. The training-time overhead per step at batch 32,
# 64 and 128 is measured separately in `benchmarks/bench_cross_attention.py`
# (`benchmarks/results_cross_attention.md`).

# %%
print("\n".join(f"- {text}" for text in readings))

# %% [markdown]
# ## Exercises
#
# Each uses this notebook's own outputs; run it with the teaching preset (`make teach ONLY=cross_attention`,
# the executed copy in `runs/teach/cross_attention/30_cross_attention.ipynb`), or edit the parameters cell and
# run all.
#
# 1. **Predict, then look.** The blocks are used only in training. Before reading the main table: will the
#    cross-attention model have more parameters than MS at test time, and will its seconds per epoch be
#    higher? *Hint:* at test time only $\phi^0$ is computed (pooling and one linear layer, as in MS); in
#    training every level is a $B \times B \times d$ tensor, one per pair of the batch.
# 2. **Change one parameter.** Set `block_counts = [0, 2, 6]` and re-run the grid of levels. Within one row
#    (one trained model), does $s^n$ with $n > 0$ rank better than $s^0$? *Hint:* the grid scores a subset of
#    `rescoring_subset` test images, so compare within the grid, not with the full-test R@1 of the last column;
#    one seed gives differences, not verdicts.
# 3. **Read a figure.** In the attention maps, how different is the map of image $x$ conditioned on $a$ (same
#    class) from the map conditioned on $b$ (another class)? Read the middle row's max $|\Delta|$ and the
#    total variation in the statistics table. *Hint:* a max $|\Delta|$ near 0 means the conditioning image
#    barely moves where $x$ looks; the paper's claim is that it moves.
