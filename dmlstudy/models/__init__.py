"""Backbones (timm models as feature-map extractors)."""
from dmlstudy.models.backbones import Backbone, build_backbone, load_backbone_checkpoint

__all__ = ["Backbone", "build_backbone", "load_backbone_checkpoint"]
