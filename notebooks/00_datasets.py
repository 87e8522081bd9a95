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
# # A tour of the study's datasets
#
# **This notebook executed by the published study**, with its tables and figures:
# [`published/00_datasets.ipynb`](../published/00_datasets.ipynb). Executed without a plan it tours the two
# generated sets at CI size (a minute to build them); the default study's plan shows emoji.
#
# The default study runs on **emoji**: real, fine-grained images drawn by nine independent design families,
# fetched from npm (pinned package versions, integrity checked) and rendered at 128 px by
# `dmlstudy data generate emoji`. A class is one emoji (dozens of smiling faces, hands, clocks, animals); its
# images are the designers' drawings of it, so a query asks for the same emoji in another designer's style.
# The images are built on your machine and never committed; every figure that shows them carries the sets'
# attribution, and the card below lists each set's licence (`docs/datasets/emoji.md` says what was dropped:
# skin tones, flags, gendered variants).
#
# The embedded study runs on two datasets the package **generates itself**, offline and byte-identically from a
# seed. All three are written in the CUB-200-2011 on-disk layout (`images.txt`, `image_class_labels.txt`, `classes.txt`,
# `train_test_split.txt`, `images/<class>/<file>`) and read back by the same reader as CUB.
#
# * **SynBirds-200** (`synbirds`) mimics what makes CUB hard: 200 bird-like classes defined by *part
#   attributes* (head, crest, beak, wings, tail, body pattern, colours) on one shared body plan; sibling
#   classes differ in only one or two parts; pose, scale, rotation, flip, colour cast, background clutter and
#   occlusion vary independently of the class. Classes 1–100 train, 101–200 test (zero-shot).
# * **Glyphs** (`glyphs`) plays the second benchmark column: characters rendered from the fonts that ship
#   inside matplotlib; an instance is a font × a random affine/elastic distortion with noise. The first half
#   of the characters train, the second half test. Flipping changes a glyph's identity, so training does not
#   flip these images.
#
# The generated sets are built on first use under `data/` (about a minute each) and never committed.

# %% tags=["parameters"]
data_root: str = ''  # default: <project>/data
datasets: list = ['synbirds', 'glyphs']  # sets to show: synbirds, glyphs, emoji (built by `dmlstudy data generate emoji`)
classes_shown: int = 6  # classes per example grid
images_per_class: int = 8  # images per class in the grids
knn_sizes: list = [32]  # pixel sizes for the raw-pixel kNN baseline
knn_classes: int = 20  # 0: all test classes in the raw-pixel kNN; n: the first n (CI-sized)
seed: int = 0  # which images are shown

# %%
from IPython.display import display

from dmlstudy.experiments.datasets import (
    DatasetTour,
    class_definition_table,
    emoji_card,
    example_grid,
    load_splits,
    nearest_classes_figure,
    pixel_knn_table,
    summary_table,
)
from dmlstudy.records import seed_everything

tour = DatasetTour.from_namespace(globals())
seed_everything(tour.seed)
summary_table(tour)

# %% [markdown]
# ## The emoji card
#
# One row per design family: the npm package and version the images come from, the licence of its drawings
# (what governs the images; from `EMOJI_SOURCES`, as in `docs/datasets/emoji.md`) and the licence its package
# metadata declares, which differ for fxemoji (drawings CC BY 4.0, code Apache-2.0), its attribution and how
# many images it gave (a class needs at least 5 designs). `THIRD_PARTY_NOTICES.md` has the full notices.

# %%
if "emoji" in tour.datasets:
    from dmlstudy.data.emoji_sources import EMOJI_SOURCES

    card = emoji_card(tour).rename(columns={"licence": "package metadata"})
    drawings = {source.package: source.credit.licence.name for source in EMOJI_SOURCES}
    card.insert(2, "licence of the drawings", card["package"].map(drawings))
    display(card)

# %% [markdown]
# ## Examples
#
# One row per class, random images of it. Look for what stays fixed within a row (the emoji, whoever drew it;
# a SynBirds class's part attributes; a glyph's character) and what does not (the designer's style, line and
# palette; pose, colour cast, clutter; font, distortion).

# %%
for name in tour.datasets:
    test = load_splits(tour, name)["test"]
    figure = example_grid(
        test, classes=list(range(tour.classes_shown)), images_per_class=tour.images_per_class, seed=tour.seed
    )
    figure.suptitle(f"{name}: first {tour.classes_shown} test classes", y=1.02)

# %% [markdown]
# ## What defines a SynBirds class, and its nearest classes
#
# Every class is a combination of part attributes. Below, the first test class and the three classes
# nearest to it by attributes; **bold** marks the parts in which a neighbour differs. Telling these apart is
# the fine-grained problem: most of the bird is identical, one part is not.

# %%
if "synbirds" in tour.datasets:
    display(class_definition_table(tour, class_index=100))
    nearest_classes_figure(tour, class_index=100)

# %% [markdown]
# ## How hard is it? Raw-pixel nearest neighbours
#
# Each test image is a query against all other test images, by cosine similarity of the raw pixels (self
# excluded). This is the floor any learned embedding must beat: nuisance variation dominates pixel
# distances, so Recall@1 is low. (With `knn_classes = 0` every test class is used: 561 on emoji, 100 on the
# generated sets.)

# %%
pixel_knn_table(tour)
