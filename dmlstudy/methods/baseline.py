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
from dmlstudy.search_space import HEAD_LR, LR, Float, LogFloat


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
PROXY_LOSSES = ("proxynca", "proxyanchor", "normsoftmax", "softtriple", "arcface", "cosface")  # trained at head_lr
LOSS_SEARCH_SPACES = {  # each loss's own hyperparameters, paper values = the defaults of dmlstudy.losses
    "ms": {"alpha": LogFloat(0.5, 8.0, paper=2.0), "beta": LogFloat(10.0, 80.0, paper=50.0),
           "base": Float(0.3, 0.8, paper=0.5), "margin": Float(0.0, 0.3, paper=0.1)},  # α, β, λ, ε (Wang et al.)
    "contrastive": {"pos_margin": Float(0.0, 0.3, paper=0.0), "neg_margin": Float(0.3, 1.5, paper=1.0)},
    "triplet": {"margin": LogFloat(0.01, 0.5, paper=0.2)},
    "margin": {"margin": Float(0.05, 0.5, paper=0.2), "beta": Float(0.6, 1.6, paper=1.2)},
    "lifted": {"pos_margin": Float(0.0, 0.3, paper=0.0), "neg_margin": Float(0.3, 1.5, paper=1.0)},
    "npairs": {},  # no hyperparameter of its own
    "proxynca": {"softmax_scale": LogFloat(1.0, 32.0, paper=1.0)},
    "proxyanchor": {"margin": Float(0.0, 0.3, paper=0.1), "alpha": LogFloat(8.0, 64.0, paper=32.0)},
    "normsoftmax": {"temperature": LogFloat(0.01, 0.2, paper=0.05)},
    "softtriple": {"la": LogFloat(5.0, 40.0, paper=20.0), "gamma": LogFloat(0.03, 0.3, paper=0.1),
                   "margin": Float(0.0, 0.05, paper=0.01)},
    "arcface": {"margin": Float(10.0, 45.0, paper=28.6), "scale": LogFloat(16.0, 128.0, paper=64.0)},  # degrees
    "cosface": {"margin": Float(0.1, 0.5, paper=0.35), "scale": LogFloat(16.0, 128.0, paper=64.0)},
}  # fmt: skip


def baseline_search_space(loss: str) -> dict:
    """The learning rate(s) and ``loss``'s own hyperparameters (under ``method_kwargs.loss_kwargs``)."""
    space = {"lr": LR, **({"head_lr": HEAD_LR} if loss in PROXY_LOSSES else {})}
    return space | {f"method_kwargs.loss_kwargs.{name}": value for name, value in LOSS_SEARCH_SPACES[loss].items()}


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
        search_space=baseline_search_space(_loss),
        loss=_loss,
    )(Baseline)
