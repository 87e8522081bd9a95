"""Notebook 10 (CRT): the study config, the runs of every table, the tables, and the figures.

The notebook ``notebooks/10_crt.ipynb`` calls only the functions here. Run names follow the protocol:
``<dataset>-<variant>-seed<seed>``; the plain MS baseline is the variant ``ms`` and CRT with its defaults
is ``crt`` (the comparison notebook reuses both). Every other variant is named from what differs from
those defaults (:func:`crt_variant`), so two tables asking for the same configuration share one run
(e.g. K1 = 64 of the K1 sweep and "w/o shared weights" are both ``crt-shared=False``).

One module per job, every public name re-exported here (the notebook calls ``crt_study.main_table``):

* :mod:`~dmlstudy.experiments.crt.study`: the config, the paper's numbers, the variants and their run
  names, the runs, and the measurements the tables and figures are made of.
* :mod:`~dmlstudy.experiments.crt.tables`: the tables and their computed sentences.
* :mod:`~dmlstudy.experiments.crt.figures`: the figures.

``tables`` and ``figures`` import ``study`` and never each other.

Decisions (reported in the notebook):

* The K1 and K2 sweeps use separate prototype banks (``shared=False``; sharing needs K1 = K2), the other
  branch at its default 64. The paper's K1 table must have done the same: its K1 = 64 row (75.96) is its
  "w/o shared weights" result.
* The batch sweep changes P (classes per batch) at the protocol's M (images per class): N = P · M.
* Each sweep includes the paper's reference point (K = 64, λ2 = 0.9, the protocol batch, (d, D) = (128,
  1024)), so a one-value sweep already compares two settings.
* ResNet-type backbones are built with output stride 16 (a 4 × 4 grid at 64 px); ViTs get ``img_size``.
* Complexity: parameters and FLOPs (``torch.utils.flop_counter``, 2 FLOPs per multiply-add) of one image at
  the paper's 227 px; ViTs with 16-px patches cannot take 227 px and are counted at 224 px (said in the
  table).
* Paper numbers are on real data with ImageNet-pretrained backbones (MiT-B1 for the ablations, CUB); they
  orient the reader, they are not targets. SynBirds is put beside CUB and Glyphs beside Cars.
"""

from dmlstudy.experiments.crt.figures import (
    branch_tsne_figure,
    prototype_correlation_figure,
    transform_figure,
)
from dmlstudy.experiments.crt.study import (
    COMPLEXITY_OUTPUT_STRIDE,
    HIGH_DIM_DEFAULT,
    OVERRIDE_TAGS,
    PAPER_BACKBONES,
    PAPER_BASELINE_VS_CRT,
    PAPER_BATCH,
    PAPER_COMPLEXITY,
    PAPER_COMPONENTS,
    PAPER_DIMS,
    PAPER_ESD,
    PAPER_K1,
    PAPER_K2,
    PAPER_LAMBDA2,
    PAPER_MULTI_PERSPECTIVE,
    PAPER_NAME_OF_BACKBONE,
    PAPER_RHO,
    PAPER_SHARED,
    PROTOTYPE_DEFAULT,
    SILENT_OVERRIDES,
    CRTStudy,
    backbone_overrides,
    backbone_variants,
    batch_variants,
    branch_scores,
    complexity_row,
    component_variants,
    crt_defaults,
    crt_variant,
    dim_variants,
    evaluation_split,
    k_sweep_variants,
    lambda2_variants,
    ms_variant,
    split_embeddings,
)
from dmlstudy.experiments.crt.tables import (
    backbone_table,
    complexity_sentences,
    complexity_table,
    components_table,
    cost_sentence,
    dims_table,
    main_table,
    pair_table,
    paper_backbone_table,
    split_geometry_table,
    sweep_table,
)

__all__ = [
    "COMPLEXITY_OUTPUT_STRIDE",
    "CRTStudy",
    "HIGH_DIM_DEFAULT",
    "OVERRIDE_TAGS",
    "PAPER_BACKBONES",
    "PAPER_BASELINE_VS_CRT",
    "PAPER_BATCH",
    "PAPER_COMPLEXITY",
    "PAPER_COMPONENTS",
    "PAPER_DIMS",
    "PAPER_ESD",
    "PAPER_K1",
    "PAPER_K2",
    "PAPER_LAMBDA2",
    "PAPER_MULTI_PERSPECTIVE",
    "PAPER_NAME_OF_BACKBONE",
    "PAPER_RHO",
    "PAPER_SHARED",
    "PROTOTYPE_DEFAULT",
    "SILENT_OVERRIDES",
    "backbone_overrides",
    "backbone_table",
    "backbone_variants",
    "batch_variants",
    "branch_scores",
    "branch_tsne_figure",
    "complexity_row",
    "complexity_sentences",
    "complexity_table",
    "component_variants",
    "components_table",
    "cost_sentence",
    "crt_defaults",
    "crt_variant",
    "dim_variants",
    "dims_table",
    "evaluation_split",
    "k_sweep_variants",
    "lambda2_variants",
    "main_table",
    "ms_variant",
    "pair_table",
    "prototype_correlation_figure",
    "paper_backbone_table",
    "split_embeddings",
    "split_geometry_table",
    "sweep_table",
    "transform_figure",
]
