"""Backbones (timm models as feature-map extractors), and the frozen-stem split of an EfficientNet."""

from dmlstudy.models.backbones import (
    RECOMMENDED_BACKBONES,
    Backbone,
    build_backbone,
    list_backbones,
    load_backbone_checkpoint,
)
from dmlstudy.models.trunk_cache import StemCachedBackbone

__all__ = [
    "RECOMMENDED_BACKBONES",
    "Backbone",
    "StemCachedBackbone",
    "build_backbone",
    "list_backbones",
    "load_backbone_checkpoint",
]
