"""The baseline: pooled feature map → linear embedding → L2 normalisation, trained with a named loss.

Registered once per loss: ``ms`` (our Multi-Similarity, the baseline of CRT, DIML and cross-attention)
and the classic losses of the papers' tables through pytorch-metric-learning (``triplet``, ``margin``, …).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dmlstudy.losses import build_loss
from dmlstudy.methods.base import Method, global_pool, register_method
from dmlstudy.models import Backbone


class Baseline(Method):
    """``f(x) = normalize(W · pool(E(x)))``.

    Args:
        backbone: feature-map extractor ``E``.
        embedding_dim: d (128 throughout the study).
        num_classes: training classes (for proxy losses).
        loss: a name from :func:`dmlstudy.losses.list_losses`.
        loss_kwargs: keyword arguments of that loss (defaults in :mod:`dmlstudy.losses`).
        pooling: ``avg`` (default), ``max`` or ``avgmax``.
    """

    def __init__(
        self,
        backbone: Backbone,
        *,
        embedding_dim: int = 128,
        num_classes: int,
        loss: str = "ms",
        loss_kwargs: dict | None = None,
        pooling: str = "avg",
    ) -> None:
        super().__init__(backbone, embedding_dim=embedding_dim)
        self.pooling = pooling
        self.loss_name = loss
        self.embedding = nn.Linear(backbone.num_features, embedding_dim)
        self.criterion = build_loss(loss, num_classes=num_classes, embedding_dim=embedding_dim, **(loss_kwargs or {}))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.embedding(global_pool(self.backbone(images), self.pooling)), dim=1)

    def loss(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss and its one named part, kept as a detached tensor (no host sync or graph break in the step;
        the training loop converts the epoch's sums to floats once)."""
        embeddings, labels = self.gather(self(images), labels)
        value = self.criterion(embeddings, labels)
        return value, {self.loss_name: value.detach()}

    def head_parameters(self) -> list[nn.Parameter]:
        return list(self.criterion.parameters())


BASELINE_LOSSES = (
    "ms",
    "contrastive",
    "triplet",
    "margin",
    "lifted",
    "npairs",
    "proxynca",
    "proxyanchor",
    "normsoftmax",
    "softtriple",
    "arcface",
    "cosface",
)
BASELINE_LABELS = {
    "ms": "MS baseline",
    "lifted": "lifted structure",
    "npairs": "N-pairs",
    "proxynca": "ProxyNCA",
    "proxyanchor": "Proxy-Anchor",
    "normsoftmax": "normalized softmax",
    "softtriple": "SoftTriple",
    "arcface": "ArcFace",
    "cosface": "CosFace",
}
for _loss in BASELINE_LOSSES:
    register_method(
        _loss,
        label=BASELINE_LABELS.get(_loss, _loss),
        group="classic",
        paper="the baseline of CRT, DIML and cross-attention" if _loss == "ms" else "the papers' comparison tables",
        summary=(
            "pooled features → linear → L2-norm, Multi-Similarity loss"
            if _loss == "ms"
            else f"the {BASELINE_LABELS.get(_loss, _loss)} loss (pytorch-metric-learning) on the baseline architecture"
        ),
        loss=_loss,
    )(Baseline)
