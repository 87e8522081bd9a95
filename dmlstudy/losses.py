"""Losses: Multi-Similarity on a similarity matrix, and the classic DML losses by name.

Multi-Similarity (Wang et al., CVPR 2019) is written once, on a
similarity matrix ``S`` (B × B), so methods whose similarity is not a plain inner product (DIML's
structural similarity, cross-attention's sᴺ) reuse it. On cosine similarities it equals
pytorch-metric-learning's ``MultiSimilarityLoss`` with its ``MultiSimilarityMiner`` (tested).

The classic losses of the papers' tables come from pytorch-metric-learning; proxy/classifier losses own
parameters, which the training loop puts in the optimizer at their own learning rate (``head_lr``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from pytorch_metric_learning import losses as pml_losses
from torch import nn


def _log_one_plus_sum_exp(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Row-wise ``log(1 + Σ_{keep} exp(values))``, stable; rows with nothing kept give 0."""
    masked = values.masked_fill(~keep, float("-inf"))
    zeros = torch.zeros_like(values[:, :1])
    return torch.logsumexp(torch.cat([zeros, masked], dim=1), dim=1)


def multi_similarity_mining(
    similarity: torch.Tensor, labels: torch.Tensor, *, margin: float = 0.1
) -> tuple[torch.Tensor, torch.Tensor]:
    """The MS miner (Eq. 7–8 of Wang et al.): informative positive and negative pairs per anchor.

    A positive pair (i, p) is kept if ``S_ip − ε < max_n S_in``; a negative (i, n) if ``S_in + ε > min_p S_ip``,
    with ε = ``margin``. The diagonal is never a pair. Returns boolean masks ``(positives, negatives)``, B × B.
    """
    same = labels[:, None] == labels[None, :]
    eye = torch.eye(len(labels), dtype=torch.bool, device=labels.device)
    positive = same & ~eye
    negative = ~same
    detached = similarity.detach()
    hardest_negative = detached.masked_fill(~negative, float("-inf")).amax(dim=1, keepdim=True)
    easiest_positive = detached.masked_fill(~positive, float("inf")).amin(dim=1, keepdim=True)
    kept_positive = positive & (detached - margin < hardest_negative)
    kept_negative = negative & (detached + margin > easiest_positive)
    return kept_positive, kept_negative


def multi_similarity_loss(
    similarity: torch.Tensor,
    labels: torch.Tensor,
    *,
    alpha: float = 2.0,
    beta: float = 50.0,
    base: float = 0.5,
    margin: float = 0.1,
    mining: bool = True,
) -> torch.Tensor:
    """Multi-Similarity loss (Eq. 9 of Wang et al.) on a similarity matrix.

    Per anchor i: ``(1/α) log(1 + Σ_p exp(−α(S_ip − λ))) + (1/β) log(1 + Σ_n exp(β(S_in − λ)))`` over the mined
    pairs, averaged over all B anchors (anchors without mined pairs contribute 0), λ = ``base``.
    Defaults α = 2, β = 50, λ = 0.5, ε = 0.1 (the original paper says λ = 1; the official code uses 0.5).

    Args:
        similarity: ``B × B`` similarities (any similarity, not only cosine).
        labels: ``B`` class labels.
        mining: apply the MS miner with margin ε = ``margin``; otherwise use all pairs.
    """
    if similarity.ndim != 2 or similarity.shape[0] != similarity.shape[1] or similarity.shape[0] != labels.shape[0]:
        raise ValueError(
            f"expected a B × B similarity matrix and B labels, got {tuple(similarity.shape)} and {tuple(labels.shape)}"
        )
    if mining:
        positive, negative = multi_similarity_mining(similarity, labels, margin=margin)
    else:
        same = labels[:, None] == labels[None, :]
        positive = same & ~torch.eye(len(labels), dtype=torch.bool, device=labels.device)
        negative = ~same
    positive_term = _log_one_plus_sum_exp(-alpha * (similarity - base), positive) / alpha
    negative_term = _log_one_plus_sum_exp(beta * (similarity - base), negative) / beta
    return (positive_term + negative_term).mean()


class MultiSimilarityLoss(nn.Module):
    """Multi-Similarity loss on the cosine similarities of a batch of embeddings (see :func:`multi_similarity_loss`)."""

    def __init__(
        self, *, alpha: float = 2.0, beta: float = 50.0, base: float = 0.5, margin: float = 0.1, mining: bool = True
    ) -> None:
        super().__init__()
        self.alpha, self.beta, self.base, self.margin, self.mining = alpha, beta, base, margin, mining

    def from_similarity(self, similarity: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return multi_similarity_loss(
            similarity, labels, alpha=self.alpha, beta=self.beta, base=self.base, margin=self.margin, mining=self.mining
        )

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        normalized = F.normalize(embeddings, dim=1)
        return self.from_similarity(normalized @ normalized.T, labels)


LossFactory = Callable[..., nn.Module]
LOSSES: dict[str, LossFactory] = {}


def register_loss(name: str) -> Callable[[LossFactory], LossFactory]:
    """Decorator: ``@register_loss("triplet") def f(*, num_classes, embedding_dim, **kw) -> nn.Module``."""

    def decorator(factory: LossFactory) -> LossFactory:
        LOSSES[name] = factory
        return factory

    return decorator


def list_losses() -> list[str]:
    return sorted(LOSSES)


def build_loss(name: str, *, num_classes: int, embedding_dim: int, **kwargs) -> nn.Module:
    """A loss module ``loss(embeddings, labels) -> scalar`` by name; unknown names list the valid ones."""
    if name not in LOSSES:
        raise KeyError(f"unknown loss {name!r}; valid names: {', '.join(list_losses())}")
    return LOSSES[name](num_classes=num_classes, embedding_dim=embedding_dim, **kwargs)


@register_loss("ms")
def _multi_similarity(*, num_classes: int, embedding_dim: int, **kwargs) -> nn.Module:
    return MultiSimilarityLoss(**kwargs)


def _pair_loss(cls: type, **defaults) -> LossFactory:
    def factory(*, num_classes: int, embedding_dim: int, **kwargs) -> nn.Module:
        return cls(**{**defaults, **kwargs})

    return factory


def _proxy_loss(cls: type, **defaults) -> LossFactory:
    def factory(*, num_classes: int, embedding_dim: int, **kwargs) -> nn.Module:
        return cls(num_classes=num_classes, embedding_size=embedding_dim, **{**defaults, **kwargs})

    return factory


# pytorch-metric-learning's defaults, except Triplet's margin: 0.2 as in the DML benchmark codebases
# (pml's default 0.05 is tuned for its own benchmarks). pml's ProxyNCA keeps the positive proxy in the
# denominator (the original paper excludes it); tables that use it say so.
register_loss("contrastive")(_pair_loss(pml_losses.ContrastiveLoss))
register_loss("triplet")(_pair_loss(pml_losses.TripletMarginLoss, margin=0.2))
register_loss("margin")(_pair_loss(pml_losses.MarginLoss, margin=0.2, beta=1.2))
register_loss("lifted")(_pair_loss(pml_losses.LiftedStructureLoss))
register_loss("npairs")(_pair_loss(pml_losses.NPairsLoss))
register_loss("proxynca")(_proxy_loss(pml_losses.ProxyNCALoss))
register_loss("proxyanchor")(_proxy_loss(pml_losses.ProxyAnchorLoss))
register_loss("normsoftmax")(_proxy_loss(pml_losses.NormalizedSoftmaxLoss))
register_loss("softtriple")(_proxy_loss(pml_losses.SoftTripleLoss))
register_loss("arcface")(_proxy_loss(pml_losses.ArcFaceLoss))
register_loss("cosface")(_proxy_loss(pml_losses.CosFaceLoss))
