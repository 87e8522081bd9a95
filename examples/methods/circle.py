"""Circle loss (Sun et al., CVPR 2020) on the global embedding: the example of docs/adding_a_method.md."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pytorch_metric_learning.losses import CircleLoss
from torch import nn

from dmlstudy.methods.base import Method, global_pool, register_method
from dmlstudy.models import Backbone
from dmlstudy.search_space import LR, Float, LogFloat


@register_method(
    "circle",
    label="Circle loss",
    group="classic",
    paper="Sun et al., CVPR 2020",
    search_space={
        "lr": LR,  # every row tunes its learning rate
        "method_kwargs.margin": Float(0.1, 0.5, paper=0.4),  # m, the paper's value for fine-grained retrieval
        "method_kwargs.gamma": LogFloat(16.0, 256.0, paper=80.0),  # γ
    },
)
class Circle(Method):
    """Pooled features → linear → L2-norm, trained with the Circle loss (pytorch-metric-learning).

    Args:
        backbone: the feature-map extractor (``B × C × H × W``), built by the trainer.
        embedding_dim: d, from the run's ``embedding_dim``.
        num_classes: training classes, passed to every method (proxy losses need it; unused here).
        margin: m of Eq. 8 of Sun et al. (the relaxation of the decision boundary).
        gamma: γ of Eq. 8 (the scale of the similarities).
    """

    def __init__(
        self,
        backbone: Backbone,
        *,
        embedding_dim: int = 128,
        num_classes: int,
        margin: float = 0.4,
        gamma: float = 80.0,
    ) -> None:
        super().__init__(backbone, embedding_dim=embedding_dim)
        self.embedding = nn.Linear(backbone.num_features, embedding_dim)
        self.criterion = CircleLoss(m=margin, gamma=gamma)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """The inference embedding, ``B × d``, L2-normalised."""
        return F.normalize(self.embedding(global_pool(self.backbone(images))), dim=1)

    def loss(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The Circle loss over every pair of the global batch, and its one named part."""
        embeddings, labels = self.gather(self(images), labels)  # all ranks' pairs under torchrun
        value = self.criterion(embeddings, labels)
        return value, {"circle": value.detach()}
