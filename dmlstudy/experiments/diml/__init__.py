"""The DIML notebook (``notebooks/20_diml.ipynb``): structural similarity by optimal transport, as test-time
re-ranking of plain baselines and as a training similarity, swept over the truncation K and the grid size G.

One module per job, every public name re-exported here (the notebook calls ``diml_study.sweep_frame``):

* :mod:`~dmlstudy.experiments.diml.study`: the config, the paper's numbers, the variants and their run
  names, the runs, and the measurements the tables and figures are made of.
* :mod:`~dmlstudy.experiments.diml.tables`: the tables and their computed sentences.
* :mod:`~dmlstudy.experiments.diml.figures`: the figures.

``tables`` and ``figures`` import ``study`` and never each other.

Runs come from :meth:`ProtocolConfig.grid`, so the plain Multi-Similarity baseline is the run ``ms`` and
DIML-trained Multi-Similarity is the run ``diml`` (shared with the comparison notebook). Every trained model
is evaluated once per setting: its test set is embedded at each grid size (one backbone pass), the
structural similarities of each query's top-``max K`` cosine candidates are computed once and every K
re-ranks from them (:func:`dmlstudy.reranking.reranked_retrieval_metrics`). Results are cached in the
run folder (``diml_rerank-<key>.json``), so re-executing the notebook only computes what is new.

The paper's numbers (supplement Tables 1 and 2, from ``papers.yaml``) are printed for orientation: other data
(CUB-200, Cars196, SOP), an ImageNet-pretrained ResNet-50, 7 × 7 maps and a metric convention that counts
the query in R (our R excludes it, as pytorch-metric-learning).
"""

from dmlstudy.experiments.diml.figures import (
    WORKED_SETTINGS,
    cost_figure,
    sweep_figure,
    toy_grids,
    worked_example,
)
from dmlstudy.experiments.diml.study import (
    BASE_LOSS_NAMES,
    METRICS,
    PAPER_DATASETS,
    PAPER_GRID,
    PAPER_TRUNCATION,
    DIMLStudy,
    diml_variant_name,
    example_query_indices,
    example_run,
    rerank_cost,
    rerank_sweeps,
    run_models,
    sweep_frame,
    variants,
)
from dmlstudy.experiments.diml.tables import (
    display_columns,
    rerank_sweep_table,
    sweep_readings,
    training_readings,
    training_table,
)

__all__ = [
    "BASE_LOSS_NAMES",
    "DIMLStudy",
    "METRICS",
    "PAPER_DATASETS",
    "PAPER_GRID",
    "PAPER_TRUNCATION",
    "WORKED_SETTINGS",
    "cost_figure",
    "diml_variant_name",
    "display_columns",
    "example_query_indices",
    "example_run",
    "rerank_cost",
    "rerank_sweep_table",
    "rerank_sweeps",
    "run_models",
    "sweep_figure",
    "sweep_frame",
    "sweep_readings",
    "toy_grids",
    "training_readings",
    "training_table",
    "variants",
    "worked_example",
]
