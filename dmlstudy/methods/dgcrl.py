"""DGCRL: Normalize-Scale layer and Decorrelated Global Centralized Ranking Loss (Zheng et al., AAAI 2019).

Registered as ``dgcrl`` (the full method: centre softmax with margin, Gram–Schmidt decorrelation) and
``gcrl`` (the distance form of Eq. 2, the "slow" loss the paper accelerates, without decorrelation).

Pipeline:

* **Feature.** The backbone map is pooled twice; the global-average and the global-max vectors are each
  L2-normalised and concatenated (``B × 2C``), then projected to d by a linear layer (``projection=True``,
  the default). *Decision:* the study protocol fixes d = 128 for every method, so the projection is on by
  default; ``projection=False`` keeps the paper's raw 2C-dimensional feature (``embedding_dim`` is then
  ignored and the embedding has 2C dimensions).
* **Normalize-Scale layer** (Eq. 1): ``x̂ = α · x / ‖x‖`` with α = 128. The inference embedding is
  ``x / ‖x‖`` (the same direction, unit length: retrieval is by cosine).
* **Centres.** One unnormalised centre per training class, ``W`` (C × D), trained at ``head_lr``.
  *Decision:* initialised like a fully-connected layer's weight (uniform ±1/√D, PyTorch's ``nn.Linear``
  default), since the paper's centres are "the weight of the last fully-connected layer".
* **Loss** (Eq. 5 with the margin of Eq. 2 carried over): logits ``x̂ Wᵀ``, the margin m = 4 subtracted
  from the target logit, cross-entropy. By Eq. 8, with ‖x̂‖ = α and centre norms held fixed, the logits are
  an affine function of −½‖x̂ − w_j‖², so this softmax ranks centres by distance.
* **Decorrelation** (``decorrelation``):

  - ``paper`` (default): a gradient hook on W. Each centre's gradient ``g_i`` is projected orthogonally to
    ``w_i`` (footnote 2: the update is perpendicular to the centre, so ‖w_i‖ stays fixed to first order),
    then ``(λ/|Ω|) Σ_{j≠i} ⟨w_i, ŵ_j⟩ ŵ_j`` is added, |Ω| = C(C − 1), λ = ``decorrelation_weight`` = 0.1.
    A descent step along this term removes from ``w_i`` its components along the other centres: it pushes
    centres apart and vanishes when they are orthogonal (our reading of Eq. 13; read literally Eq. 13 adds
    the Gram–Schmidt target itself, which would *increase* correlation). λ = 0 keeps the projection.
  - ``code``: the authors' released code: ``code_weight · CE(W Wᵀ, identity labels)`` (code_weight = 0.5)
    added to the loss, and W clamped ≥ 0 after every optimizer step. *Decision:* the training loop has no
    after-step hook, so the clamp is applied in place at the start of every :meth:`DGCRL.loss` call, i.e.
    after the previous step and before W is used again; the trajectory is the same as clamping right after
    ``optimizer.step()`` (tested). W is never used between the last step and the end of training except by
    :func:`class_logits`, which uses the clamped centres. (Calling ``loss`` twice before one ``backward``
    would invalidate the first graph: the clamp is in place.)
  - ``none``: no decorrelation.

* **Distributed training** (torchrun): the centre losses are per-sample means, so DDP's gradient average
  is the global-batch gradient without gathering; the ``paper`` hook is affine in the gradient with a
  rank-independent offset, so hooking before DDP's average equals hooking after it. Pair losses on the same
  head gather the global batch first (:meth:`Method.gather`).

* **GCRL, the distance form** (Eq. 2, ``loss="distance"``): per sample the hinge
  ``max(0, m + ‖x̂_i − w_{y_i}‖ − (1/(C−1)) Σ_{j≠y_i} ‖x̂_i − w_j‖)``. *Decision:* the paper's ``max(Σ_i …)``
  is read as a per-sample hinge, averaged (not summed) over the batch so the scale does not depend on B.
* **Other losses on the same head** (``loss`` = a name of :func:`dmlstudy.losses.build_loss`, e.g.
  ``triplet``, ``lifted``): the Table 3 comparison ("replace GCRL by other losses under the same setting of
  the rest components"); the loss gets the N-S features and the centres are not built.
* **Softmax without N-S** (``normalize_scale=False``): logits ``W x`` on the unnormalised projected
  feature; with ``margin=0, decorrelation="none"`` this is the plain softmax-classifier baseline.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from dmlstudy.losses import build_loss
from dmlstudy.methods.base import EVAL_BATCH_SIZE, Method, register_method, register_variant_search_space
from dmlstudy.models import Backbone
from dmlstudy.search_space import HEAD_LR, LR, Float, LogFloat, without

DECORRELATIONS = ("paper", "code", "none")
CENTRE_LOSSES = ("softmax", "distance")
SEARCH_SPACE = {  # the centres train at head_lr
    "lr": LR,
    "head_lr": HEAD_LR,
    "method_kwargs.alpha": LogFloat(8.0, 256.0, paper=128.0),  # α of the N-S layer (the paper sweeps 1…256)
    "method_kwargs.margin": LogFloat(0.5, 16.0, paper=4.0),  # m
    "method_kwargs.decorrelation_weight": Float(0.0, 0.4, paper=0.1),  # λ (the paper's ablation range)
}
GCRL_SEARCH_SPACE = without(SEARCH_SPACE, "method_kwargs.decorrelation_weight")  # no decorrelation
SOFTMAX_SEARCH_SPACE = without(  # the study's "softmax" row: no N-S (α unused), no margin, no decorrelation
    SEARCH_SPACE, "method_kwargs.alpha", "method_kwargs.margin", "method_kwargs.decorrelation_weight"
)


def pooled_feature(feature_map: torch.Tensor) -> torch.Tensor:
    """``B × C × H × W`` → ``B × 2C``: L2-normalised global-average and global-max pooling, concatenated."""
    if feature_map.ndim != 4:
        raise ValueError(f"pooled_feature expects a B × C × H × W feature map, got shape {tuple(feature_map.shape)}")
    average = F.normalize(feature_map.mean(dim=(2, 3)), dim=1)
    maximum = F.normalize(feature_map.amax(dim=(2, 3)), dim=1)
    return torch.cat([average, maximum], dim=1)


def normalize_scale(features: torch.Tensor, *, alpha: float = 128.0) -> torch.Tensor:
    """The Normalize-Scale layer (Eq. 1): ``α · x / ‖x‖`` row-wise, so every row has norm α."""
    if alpha <= 0:
        raise ValueError(f"normalize_scale: alpha must be positive, got {alpha}")
    return alpha * F.normalize(features, dim=1)


def margin_logits(logits: torch.Tensor, labels: torch.Tensor, *, margin: float = 4.0) -> torch.Tensor:
    """``logits`` (B × C) with ``margin`` subtracted from each row's target entry ``labels[i]``."""
    if logits.ndim != 2 or labels.shape != (logits.shape[0],):
        raise ValueError(
            f"margin_logits expects B × C logits and B labels, got {tuple(logits.shape)} and {tuple(labels.shape)}"
        )
    return logits - margin * F.one_hot(labels, logits.shape[1]).to(logits.dtype)


def centre_softmax_loss(
    scaled: torch.Tensor, centres: torch.Tensor, labels: torch.Tensor, *, margin: float = 4.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy of the margin logits ``x̂ Wᵀ − m·onehot`` (Eq. 5 and 10 with GCRL's margin m).

    Returns ``(loss, logits)``; the logits are without the margin (for accuracy).
    """
    logits = scaled @ centres.T  # B × C
    return F.cross_entropy(margin_logits(logits, labels, margin=margin), labels), logits


def centre_distances(scaled: torch.Tensor, centres: torch.Tensor, *, eps: float = 1e-12) -> torch.Tensor:
    """Euclidean distances ``‖x̂_i − w_j‖`` (B × C) from the expansion ‖x‖² + ‖w‖² − 2⟨x, w⟩ (no B × C × D tensor)."""
    squared = scaled.pow(2).sum(1, keepdim=True) + centres.pow(2).sum(1)[None, :] - 2.0 * scaled @ centres.T
    return squared.clamp_min(eps).sqrt()


def centralized_ranking_loss(
    scaled: torch.Tensor, centres: torch.Tensor, labels: torch.Tensor, *, margin: float = 4.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """GCRL, the distance form (Eq. 2): mean over i of ``max(0, m + d_{i,y_i} − mean_{j≠y_i} d_ij)``.

    Returns ``(loss, −distances)``; the negated distances act as logits (nearest centre = predicted class).
    """
    classes = centres.shape[0]
    if classes < 2:
        raise ValueError(f"centralized_ranking_loss needs at least 2 centres, got {classes}")
    distances = centre_distances(scaled, centres)  # B × C
    target = distances.gather(1, labels[:, None]).squeeze(1)
    others = (distances.sum(1) - target) / (classes - 1)
    return F.relu(margin + target - others).mean(), -distances


def gram_schmidt_gradient(gradient: torch.Tensor, centres: torch.Tensor, *, weight: float = 0.1) -> torch.Tensor:
    """The ``paper`` decorrelation hook (our reading of Eq. 12–13, module docstring), for gradient and centres ``C × D``.

    ``g_i ← g_i − (⟨g_i, w_i⟩ / ‖w_i‖²) w_i + (λ / (C(C−1))) Σ_{j≠i} ⟨w_i, ŵ_j⟩ ŵ_j`` with λ = ``weight``.
    """
    if gradient.shape != centres.shape or centres.ndim != 2:
        raise ValueError(
            f"gram_schmidt_gradient expects matching C × D gradient and centres, got {tuple(gradient.shape)} and {tuple(centres.shape)}"
        )
    classes = centres.shape[0]
    squared_norms = centres.pow(2).sum(1, keepdim=True).clamp_min(1e-12)
    projected = gradient - (gradient * centres).sum(1, keepdim=True) / squared_norms * centres
    if classes < 2 or weight == 0:
        return projected
    unit = F.normalize(centres, dim=1)
    coupling = (centres @ unit.T).fill_diagonal_(0.0)  # C × C: ⟨w_i, ŵ_j⟩, i ≠ j
    return projected + weight / (classes * (classes - 1)) * coupling @ unit


def centre_orthogonality_loss(centres: torch.Tensor) -> torch.Tensor:
    """The ``code`` regulariser of the authors' release: ``CE(W Wᵀ, [0, 1, …, C−1])`` (rows = logits)."""
    gram = centres @ centres.T  # C × C
    return F.cross_entropy(gram, torch.arange(centres.shape[0], device=centres.device))


def mean_abs_cosine(centres: torch.Tensor) -> torch.Tensor:
    """Mean of ``|cos(w_i, w_j)|`` over ordered pairs i ≠ j (0 for fewer than 2 centres)."""
    classes = centres.shape[0]
    if classes < 2:
        return centres.new_zeros(())
    unit = F.normalize(centres, dim=1)
    cosines = (unit @ unit.T).abs()
    return (cosines.sum() - cosines.diagonal().sum()) / (classes * (classes - 1))


@register_method(
    "dgcrl",
    label="DGCRL",
    group="paper",
    paper="Zheng et al., AAAI 2019",
    summary="normalize-scale layer, centre softmax with margin, decorrelated centres",
    search_space=SEARCH_SPACE,
)
class DGCRL(Method):
    """Normalize-Scale layer + centre softmax with margin + decorrelation (see the module docstring).

    Args:
        backbone: feature-map extractor.
        embedding_dim: d of the projection (ignored when ``projection=False``).
        num_classes: training classes (one centre each).
        alpha: α of the Normalize-Scale layer (Eq. 1), 128.
        margin: m subtracted from the target logit (softmax) or added in the hinge (distance), 4.
        decorrelation: ``paper`` (Gram–Schmidt gradient hook), ``code`` (authors' regulariser + clamp ≥ 0)
            or ``none``.
        decorrelation_weight: λ of the ``paper`` hook, 0.1.
        code_weight: weight of the ``code`` regulariser, 0.5.
        loss: ``softmax`` (DGCRL), ``distance`` (GCRL, Eq. 2) or a pair loss of :mod:`dmlstudy.losses`.
        loss_kwargs: keyword arguments of that pair loss.
        projection: project the 2C-dimensional pooled feature to d.
        normalize_scale: apply the N-S layer; ``False`` feeds the unnormalised feature to the loss.
    """

    def __init__(
        self,
        backbone: Backbone,
        *,
        embedding_dim: int = 128,
        num_classes: int,
        alpha: float = 128.0,
        margin: float = 4.0,
        decorrelation: str = "paper",
        decorrelation_weight: float = 0.1,
        code_weight: float = 0.5,
        loss: str = "softmax",
        loss_kwargs: dict | None = None,
        projection: bool = True,
        normalize_scale: bool = True,
    ) -> None:
        if decorrelation not in DECORRELATIONS:
            raise ValueError(f"dgcrl: decorrelation must be one of {DECORRELATIONS}, got {decorrelation!r}")
        if alpha <= 0:
            raise ValueError(f"dgcrl: alpha must be positive, got {alpha}")
        if num_classes < 1:
            raise ValueError(f"dgcrl: num_classes must be ≥ 1, got {num_classes}")
        feature_dim = 2 * backbone.num_features
        super().__init__(backbone, embedding_dim=embedding_dim if projection else feature_dim)
        self.alpha, self.margin = float(alpha), float(margin)
        self.decorrelation, self.decorrelation_weight, self.code_weight = (
            decorrelation,
            float(decorrelation_weight),
            float(code_weight),
        )
        self.loss_name, self.normalize_scale = loss, normalize_scale
        self.projection = nn.Linear(feature_dim, embedding_dim) if projection else nn.Identity()
        self.criterion: nn.Module | None = None
        self.centres: nn.Parameter | None = None
        if loss in CENTRE_LOSSES:
            bound = 1.0 / math.sqrt(self.embedding_dim)
            self.centres = nn.Parameter(torch.empty(num_classes, self.embedding_dim).uniform_(-bound, bound))
        else:
            self.criterion = build_loss(
                loss, num_classes=num_classes, embedding_dim=self.embedding_dim, **(loss_kwargs or {})
            )

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """The projected pooled feature ``x`` (B × D), before normalisation."""
        return self.projection(pooled_feature(self.backbone(images)))

    def scaled_features(self, images: torch.Tensor) -> torch.Tensor:
        """What the loss sees: ``α x / ‖x‖`` (Eq. 1), or ``x`` itself when ``normalize_scale`` is off."""
        features = self.features(images)
        return normalize_scale(features, alpha=self.alpha) if self.normalize_scale else features

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.features(images), dim=1)

    def effective_centres(self) -> torch.Tensor:
        """The centres as the loss uses them: clamped ≥ 0 (out of place) under the ``code`` variant."""
        if self.centres is None:
            raise RuntimeError(f"dgcrl with loss={self.loss_name!r} has no class centres")
        return self.centres.clamp_min(0.0) if self.decorrelation == "code" else self.centres

    @torch.no_grad()
    def project_centres_(self) -> None:
        """The ``code`` variant's projection step: clamp W ≥ 0 in place (a no-op for the other variants)."""
        if self.centres is not None and self.decorrelation == "code":
            self.centres.clamp_(min=0.0)

    def _hooked_centres(self) -> torch.Tensor:
        """W for this forward pass; under ``paper`` an alias whose gradient passes :func:`gram_schmidt_gradient`."""
        if self.decorrelation != "paper":
            return self.centres
        alias = self.centres.view_as(self.centres)
        values = self.centres.detach()
        alias.register_hook(lambda gradient: gram_schmidt_gradient(gradient, values, weight=self.decorrelation_weight))
        return alias

    def loss(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        scaled = self.scaled_features(images)  # B × D
        if self.criterion is not None:
            embeddings, all_labels = self.gather(scaled, labels)  # pair losses need the global batch under torchrun
            value = self.criterion(embeddings, all_labels)
            return value, {self.loss_name: float(value.detach())}
        self.project_centres_()
        centres = self._hooked_centres()
        if self.loss_name == "softmax":
            value, logits = centre_softmax_loss(scaled, centres, labels, margin=self.margin)
        else:
            value, logits = centralized_ranking_loss(scaled, centres, labels, margin=self.margin)
        parts = {"gcrl" if self.loss_name == "distance" else "softmax": float(value.detach())}
        if self.decorrelation == "code":
            regulariser = centre_orthogonality_loss(centres)
            value = value + self.code_weight * regulariser
            parts["orthogonality"] = float(regulariser.detach())
        parts["centre_abs_cos"] = float(mean_abs_cosine(self.centres.detach()))
        parts["train_accuracy"] = float((logits.detach().argmax(1) == labels).float().mean())
        return value, parts

    def head_parameters(self) -> list[nn.Parameter]:
        if self.centres is not None:
            return [self.centres]
        return list(self.criterion.parameters())


register_method(
    "gcrl",
    label="GCRL (distance form)",
    group="paper",
    paper="Zheng et al., AAAI 2019 (its CRL ablation)",
    summary="DGCRL with the distance form of the centre loss and no decorrelation",
    search_space=GCRL_SEARCH_SPACE,
    loss="distance",
    decorrelation="none",
)(DGCRL)

register_variant_search_space("softmax", SOFTMAX_SEARCH_SPACE)


@torch.no_grad()
def class_logits(method: DGCRL, images: torch.Tensor) -> torch.Tensor:
    """Classification scores against the centres (no margin): ``x̂ Wᵀ`` (softmax) or ``−‖x̂ − w_j‖`` (distance)."""
    scaled = method.scaled_features(images)
    centres = method.effective_centres()
    if method.loss_name == "distance":
        return -centre_distances(scaled, centres)
    return scaled @ centres.T


@torch.no_grad()
def centre_accuracy(
    method: DGCRL,
    dataset,
    *,
    batch_size: int = EVAL_BATCH_SIZE,
    device: torch.device | str | None = None,
    num_workers: int = 0,
) -> float:
    """Share of ``dataset`` items (training classes, labels 0..C−1) whose highest :func:`class_logits` is their class.

    The paper's Fig. 3 (right) reports this on the training set.
    """
    from torch.utils.data import DataLoader

    device = device or next(method.parameters()).device
    was_training = method.training
    method.eval()
    correct = total = 0
    for images, labels in DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers):
        predicted = class_logits(method, images.to(device)).argmax(1).cpu()
        correct += int((predicted == labels).sum())
        total += len(labels)
    method.train(was_training)
    if total == 0:
        raise ValueError("centre_accuracy: the dataset is empty")
    return correct / total
