"""Notebook 30 (cross-image attention): the study config, the runs, the tables and the figures beyond its
declaration (``papers/cross_attention.yaml``: the main table, the block sweep and the options, read by
:mod:`dmlstudy.experiments.ablations`).

``notebooks/30_cross_attention.ipynb`` calls the functions here and the declaration. Run names follow the protocol,
``<dataset>-<variant>-seed<seed>``: the plain MS baseline is the variant ``ms`` and the method with every
default (N = 6 shared blocks) is ``cross_attention`` (the comparison notebook reuses both). Other variants
are named from what differs from the defaults (:func:`dmlstudy.experiments.ablations.variant`), so equal configurations share runs.

One module per job, every public name re-exported here (the notebook calls ``ca_study.rescoring_grid``):

* :mod:`~dmlstudy.experiments.cross_attention.study`: the config, the paper's numbers, the variants and their run
  names, the runs, and the measurements the tables and figures are made of.
* :mod:`~dmlstudy.experiments.cross_attention.tables`: the tables and their computed sentences.
* :mod:`~dmlstudy.experiments.cross_attention.figures`: the figures.

``tables`` and ``figures`` import ``study`` and never each other.

Decisions (stated in the notebook too):

* The N = 0 row of the N × n grid is the ``ms`` run: with no blocks the method is the MS baseline (same
  parameters created in the same order, same loss on s⁰; tested in ``tests/test_cross_attention.py``).
* sⁿ re-scoring is evaluated all-against-all on a seeded random subset of the test set (``rescoring_subset``
  images; the query itself excluded), since it costs one hierarchy per pair. Its R@1 is therefore higher
  than the full test set's (a smaller gallery); compare columns within the grid, not with the main table.
* Attention maps: for an image x, the weights over x's locations when x is conditioned on image a (same
  class) and on image b (another class), blocks 2, 4, 6, and their difference — "how a map changes when
  the conditioning image changes". Maps are drawn on the test-transformed image the network saw.
* Local parts: the query location of an image is its interior feature-map cell with the largest L2 norm
  (the most activated part; border cells are left out, zero padding dominates them); each other test image
  contributes its most similar cell (cosine of backbone features
  E(I)ₓᵧ, as the paper's Sec. 4.3.2); the top images are shown as crops of two cells around that cell.
* The "larger backbone without blocks" is timm's ``test_resnet`` at output stride 16 (a 4 × 4 grid like
  ours): the paper pairs ResNet-50 + blocks (27.7M) with a ResNet-101 baseline (45.3M).
* The paper's numbers are on real data with an ImageNet-pretrained ResNet-50 at 224 px and d = 512; they
  orient the reader and are not targets. SynBirds stands beside CUB and Glyphs beside Cars. Figure 3's
  values exist only as a plot in the paper; its reading (caption vs text) is quoted instead.
"""

from dmlstudy.experiments.cross_attention.figures import (
    attention_figure,
    grid_heatmap,
    hierarchy_diagram,
    part_discovery,
)
from dmlstudy.experiments.cross_attention.study import (
    DECLARED,
    PAPER_BLOCKS,
    PAPER_FIGURE3_CAPTION,
    PAPER_FIGURE3_TEXT,
    PAPER_PARAMETERS,
    CrossAttentionStudy,
    attention_statistics,
    attention_triples,
    block_runs,
    gradient_variants,
    level_recalls,
    parameter_variants,
    rescoring_grid,
)
from dmlstudy.experiments.cross_attention.tables import (
    attention_reading,
    gradient_reading,
    grid_readings,
    parameter_table,
    parts_reading,
)

__all__ = [
    "DECLARED",
    "CrossAttentionStudy",
    "block_runs",
    "PAPER_BLOCKS",
    "PAPER_FIGURE3_CAPTION",
    "PAPER_FIGURE3_TEXT",
    "PAPER_PARAMETERS",
    "attention_figure",
    "attention_reading",
    "attention_statistics",
    "attention_triples",
    "gradient_reading",
    "gradient_variants",
    "grid_heatmap",
    "grid_readings",
    "hierarchy_diagram",
    "level_recalls",
    "parameter_table",
    "parameter_variants",
    "part_discovery",
    "parts_reading",
    "rescoring_grid",
]
