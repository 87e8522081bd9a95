"""A run's model: the registered method of its config around its backbone (:func:`build_model`), and the split
EfficientNet whose frozen stem's cached activations the ``stem_views`` runs train on (:func:`stem_backbone`)."""

from __future__ import annotations

from typing import Any, Protocol

from dmlstudy.methods import Method, build_method
from dmlstudy.models import build_backbone
from dmlstudy.models.backbones import Backbone
from dmlstudy.models.trunk_cache import StemCachedBackbone
from dmlstudy.paths import project_file
from dmlstudy.records import seed_everything


class ModelConfig(Protocol):
    """The fields of a run's config (:class:`dmlstudy.run.train.TrainConfig`, which describes them) that its model
    is built from."""

    method: str
    method_kwargs: dict
    backbone: str
    pretrained: bool
    checkpoint_path: str
    freeze_bn: bool
    conv_head: bool
    stem_views: int
    output_stride: int
    embedding_dim: int
    image_size: int
    seed: int


def _backbone_options(config: ModelConfig) -> dict[str, Any]:
    """The keyword arguments every backbone of ``config`` is built with."""
    return {
        "pretrained": config.pretrained,
        "checkpoint_path": project_file(config.checkpoint_path) if config.checkpoint_path else None,
        "freeze_bn": config.freeze_bn,
        "image_size": config.image_size,
    }


def stem_backbone(config: ModelConfig) -> StemCachedBackbone:
    options = _backbone_options(config)
    return StemCachedBackbone(config.backbone, conv_head=config.conv_head, **options)


def run_backbone(config: ModelConfig) -> Backbone:
    """The backbone a run of ``config`` trains: the split EfficientNet on cached stem activations when
    ``stem_views`` (ending with or without ``conv_head`` as the config says), else the registry's backbone."""
    if config.stem_views:
        return stem_backbone(config)
    return build_backbone(config.backbone, output_stride=config.output_stride or None, **_backbone_options(config))


def build_model(config: ModelConfig, num_classes: int) -> Method:
    """The method of ``config`` around its backbone (seeded by ``config.seed``)."""
    seed_everything(config.seed)
    backbone = run_backbone(config)
    return build_method(
        config.method,
        backbone=backbone,
        embedding_dim=config.embedding_dim,
        num_classes=num_classes,
        **config.method_kwargs,
    )
