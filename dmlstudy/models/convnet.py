"""A small CPU-friendly CNN, registered with timm as ``dml_convnet``.

Chosen by measurement as the default backbone of the embedded study (benchmarks/bench_backbones.py):
at 64 px it yields a 4 × 4 × 128 feature map (the spatial methods need a grid) and trains at
≈ 800 images/s on 2 CPU cores, against ≈ 460 for timm's ``test_resnet`` at output stride 16 and ≈ 90 for
``resnet10t``. Four 3 × 3 conv-BN-ReLU stages, each halving the resolution (total stride 16).
"""

from __future__ import annotations

import torch
from timm.models import register_model
from torch import nn


class DMLConvNet(nn.Module):
    """Four conv-BN-ReLU stages of stride 2; timm's interface (``forward_features``, ``num_features``)."""

    def __init__(
        self,
        *,
        widths: tuple[int, ...] = (32, 64, 128, 128),
        in_chans: int = 3,
        num_classes: int = 0,
        global_pool: str = "avg",
        **_: object,
    ) -> None:
        super().__init__()
        stages: list[nn.Module] = []
        channels = in_chans
        for width in widths:
            stages += [
                nn.Conv2d(channels, width, 3, stride=2, padding=1, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(inplace=True),
            ]
            channels = width
        self.features = nn.Sequential(*stages)
        self.num_features = channels
        self.global_pool = global_pool
        self.num_classes = num_classes
        self.head = nn.Linear(channels, num_classes) if num_classes > 0 else nn.Identity()

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        return self.features(images)  # B × C × H/16 × W/16

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.forward_features(images)
        if self.global_pool:
            features = features.mean((2, 3))
        return self.head(features)


@register_model
def dml_convnet(pretrained: bool = False, **kwargs) -> DMLConvNet:
    """The default backbone of the embedded study (no pretrained weights exist for it)."""
    if pretrained:
        raise ValueError("dml_convnet has no pretrained weights; use pretrained=False or a checkpoint_path")
    return DMLConvNet(**kwargs)
