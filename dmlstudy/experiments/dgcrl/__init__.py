"""Notebook 40 (DGCRL): the study config, the runs of every table, the tables, readings and figures.

``notebooks/40_dgcrl.ipynb`` calls only the functions here. Run names follow the protocol,
``<dataset>-<variant>-seed<seed>``: the MS baseline is ``ms``, DGCRL with every default is ``dgcrl`` (the
comparison notebook reuses both). Other variants are named by :data:`NAMED_VARIANTS` or, for sweeps, from
what differs from the defaults (:func:`dgcrl_variant`), so one configuration asked for by two tables is one
run (α = 128, λ = 0.1 and the ``paper`` decorrelation are all the ``dgcrl`` run).

One module per job, every public name re-exported here (the notebook calls ``dgcrl_study.main_table``):

* :mod:`~dmlstudy.experiments.dgcrl.study`: the config, the paper's numbers, the variants and their run
  names, the runs, and the measurements the tables and figures are made of.
* :mod:`~dmlstudy.experiments.dgcrl.tables`: the tables and their computed sentences.
* :mod:`~dmlstudy.experiments.dgcrl.figures`: the figures.

``tables`` and ``figures`` import ``study`` and never each other.

Decisions (stated in the notebook too):

* The "softmax without N-S" baseline is ``dgcrl`` with ``normalize_scale=False, margin=0,
  decorrelation="none"``: the plain softmax classifier on the same pooled, projected feature.
* The loss comparison (paper Table 3: "the same setting of the rest components") keeps DGCRL's head
  (avg ‖ max pooling → projection → N-S) and swaps the loss: ``triplet-ns``, ``lifted-ns`` (pair losses of
  pytorch-metric-learning on that head; they normalise the embeddings, so α plays no role for them),
  ``gcrl`` (Eq. 2) and ``dgcrl``. "Epochs to best" is the first epoch with the run's highest test R@1
  (evaluated every epoch), capped by the protocol's epoch count.
* Seconds per epoch come from two sources: each run's own records (noisy on a shared machine: runs happen
  at different times) and :func:`step_seconds`, which times the training step of every loss side by side
  in one process, interleaved, and multiplies by the steps of one full pass.
* Recall@K up to K = 32 (the paper's tables) is recomputed from each run's stored test embeddings, so the
  runs keep the dataset's standard K list and stay shareable with other notebooks.
* Training accuracy (paper Fig. 3, right) is measured with the centres on ``accuracy_items`` training
  images (evenly spaced, test-time transforms).
* Paper numbers are ImageNet-pretrained ResNet-50 on CUB / Cars; they orient, they are not targets.
  SynBirds stands beside CUB and Glyphs beside Cars.
"""

from dmlstudy.experiments.dgcrl.figures import (
    alpha_figure,
    loss_curves,
    toy_figure,
    tsne_figure,
)
from dmlstudy.experiments.dgcrl.study import (
    CLOCKS,
    KWARG_TAGS,
    NAMED_VARIANTS,
    PAPER_ALPHA,
    PAPER_KS,
    PAPER_LAMBDA,
    PAPER_LOSSES,
    PAPER_SPEEDUP_OVER_TRIPLET,
    PAPER_TABLE1,
    VARIANT_LABELS,
    DGCRLStudy,
    alpha_means,
    alpha_runs,
    alpha_variants,
    best_epoch,
    centre_correlation,
    decorrelation_variants,
    dgcrl_defaults,
    dgcrl_variant,
    distance_softmax_gap,
    lambda_variants,
    loss_frame,
    loss_variants,
    named_variants,
    recall_at,
    run_rows,
    step_seconds,
    steps_per_epoch,
    toy_decorrelation,
    train_classes_of,
    training_accuracy,
    training_subset,
)
from dmlstudy.experiments.dgcrl.tables import (
    COLUMN_DECIMALS,
    MAIN_METRICS,
    alpha_sentence,
    decorrelation_table,
    lambda_table,
    loss_sentence,
    loss_table,
    main_sentence,
    main_table,
    recall_table,
)

__all__ = [
    "CLOCKS",
    "COLUMN_DECIMALS",
    "DGCRLStudy",
    "KWARG_TAGS",
    "MAIN_METRICS",
    "NAMED_VARIANTS",
    "PAPER_ALPHA",
    "PAPER_KS",
    "PAPER_LAMBDA",
    "PAPER_LOSSES",
    "PAPER_SPEEDUP_OVER_TRIPLET",
    "PAPER_TABLE1",
    "VARIANT_LABELS",
    "alpha_figure",
    "alpha_means",
    "alpha_runs",
    "alpha_sentence",
    "alpha_variants",
    "best_epoch",
    "centre_correlation",
    "decorrelation_table",
    "decorrelation_variants",
    "dgcrl_defaults",
    "dgcrl_variant",
    "distance_softmax_gap",
    "lambda_table",
    "lambda_variants",
    "loss_curves",
    "loss_frame",
    "loss_sentence",
    "loss_table",
    "loss_variants",
    "main_sentence",
    "main_table",
    "named_variants",
    "recall_at",
    "recall_table",
    "run_rows",
    "step_seconds",
    "steps_per_epoch",
    "toy_decorrelation",
    "toy_figure",
    "train_classes_of",
    "training_accuracy",
    "training_subset",
    "tsne_figure",
]
