"""Backbones (timm models as feature-map extractors)."""

from dmlstudy.models.backbones import (
    RECOMMENDED_BACKBONES,
    Backbone,
    build_backbone,
    list_backbones,
    load_backbone_checkpoint,
)

__all__ = ["RECOMMENDED_BACKBONES", "Backbone", "build_backbone", "list_backbones", "load_backbone_checkpoint"]
