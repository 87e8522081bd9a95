"""DIML, the method: a metric trained on the structural similarity of grids of local embeddings, matched by
entropic optimal transport.

Zhao, Rao, Lu, Zhou: "Towards Interpretable Deep Metric Learning with Structural Matching", ICCV 2021
(and its supplementary material). Every image gets, next to its global embedding z̄ (the model's normal
embedding), a G × G grid of local embeddings ẑ_i (:func:`embed_feature_map`), and two images are compared by
how well their grids can be matched: the structural similarity ``s_struct = Σ_ij T_ij S_ij`` (Eq. 6) of the
entropic transport plan T between their cells (Eq. 4, supplement Eq. A.1–A.3), computed in
:mod:`dmlstudy.structural.transport`.

In training (supplement A.3) the plan is computed without gradient and the base loss sees the averaged
similarity or distance (:class:`DIML`). At test time (supplement A.2) the cosine top-K candidates of each query
are re-ranked by ``cos + s_struct`` (:mod:`dmlstudy.structural.reranking`, on the grid embeddings of
:func:`embed_grid_dataset`); this works on *any* model with a ``backbone`` and a linear ``embedding`` layer
(the plain baseline included: its embedding layer is applied per cell). The same holds for its explanation of a
retrieval, the transport plan between the query's grid and each retrieval's (:func:`transport_explanation`,
:meth:`DIML.explain`).

Decisions where the paper leaves room (all stated again where they act; those of the
transport itself are in :mod:`dmlstudy.structural.transport`):

* Grid: adaptive average pooling of the backbone map to G × G, after a bilinear upsampling to the
  smallest multiple of G when the map side is not divisible by G (our 64-px ``dml_convnet`` map is 4 × 4,
  so G = 7 upsamples to 7 × 7). The local embeddings use the model's own embedding layer.
* Margin (Wu et al.) on ``D = ½(‖z̄_s − z̄_t‖ + Σ T_ij ‖ẑ_s,i − ẑ_t,j‖)`` uses the plan of the cosine cost
  (the same plan as for the similarity), all triplets of the batch and fixed β = 1.2, margin 0.2, as our
  ``margin`` baseline (pytorch-metric-learning's ``MarginLoss`` defaults); it is written here on a
  distance matrix because pml losses cannot take one (they compute distances from embeddings).
* ProxyNCA with grid proxies (supplement A.9–A.10; never released by the authors): per class a G × G
  grid of proxies ρ_c; the global proxy is their mean η_c = GAP(ρ_c). Distances are squared Euclidean
  between L2-normalised vectors as in pml's ``ProxyNCALoss`` (so ``d_struct = Σ T_ij ‖ẑ_i − ρ̂_c,j‖² =
  2 − 2 s_struct``), the positive proxy stays in the softmax denominator (pml's convention, not the
  original paper's), softmax scale 1; the plan for (image, class) uses marginals from ⟨ẑ_i, η̂_c⟩ and
  ⟨ρ̂_c,j, z̄⟩.
* ``structural_weight`` w generalises the paper's average: ``s = (1 − w) cos + w s_struct`` (w = ½ is
  the paper; w = 0 is exactly the base loss).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dmlstudy.data.loading import evaluation_batches
from dmlstudy.losses import multi_similarity_loss
from dmlstudy.methods.base import EVAL_BATCH_SIZE, Explanation, Method, TransportPlans, global_pool, register_method
from dmlstudy.models import Backbone
from dmlstudy.search_space import LR, Float, LogFloat
from dmlstudy.structural.transport import DEFAULT_EPSILON, TransportOptions, pairwise_structural_similarity

DEFAULT_GRID_SIZE = 4
_DISTANCE_FLOOR = 1e-8  # sqrt(max(·, floor)): finite gradients for identical vectors
BASE_LOSSES = ("ms", "margin", "proxynca")


# --------------------------------------------------------------------------------------------------
# grid embeddings


def grid_pool(feature_map: torch.Tensor, grid_size: int) -> torch.Tensor:
    """``B × C × H × W`` → ``B × C × G × G`` by adaptive average pooling; a side not divisible by G is first
    bilinearly upsampled to the smallest multiple of G (as the authors' code; ROI Align over the whole map
    amounts to the same bilinear pooling)."""
    if feature_map.ndim != 4:
        raise ValueError(f"grid_pool: expected a B × C × H × W feature map, got shape {tuple(feature_map.shape)}")
    if not isinstance(grid_size, int) or grid_size < 1:
        raise ValueError(f"grid_pool: grid_size must be a positive integer, got {grid_size!r}")
    height, width = feature_map.shape[-2:]
    if height % grid_size or width % grid_size:
        size = (math.ceil(height / grid_size) * grid_size, math.ceil(width / grid_size) * grid_size)
        feature_map = F.interpolate(feature_map, size=size, mode="bilinear", align_corners=False)
    return F.adaptive_avg_pool2d(feature_map, grid_size)


def _embedding_layer(method: nn.Module) -> tuple[nn.Module, nn.Linear, str]:
    backbone, embedding = getattr(method, "backbone", None), getattr(method, "embedding", None)
    if backbone is None or not isinstance(embedding, nn.Linear):
        raise TypeError(
            f"DIML grid embeddings need a method with a `backbone` and a linear `embedding` layer "
            f"(the baseline and DIML have them); got {type(method).__name__}"
        )
    return backbone, embedding, getattr(method, "pooling", "avg")


def embed_feature_map(
    method: nn.Module, feature_map: torch.Tensor, *, grid_sizes: Sequence[int] = (DEFAULT_GRID_SIZE,)
) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """Global embedding ``B × d`` (the model's own: its pooling then its embedding layer) and, per G, the
    local embeddings ``B × G² × d`` (the same embedding layer on each grid cell), all L2-normalised.

    Cells are in row-major order: cell ``r · G + c`` is row r, column c of the grid.
    """
    _, embedding, pooling = _embedding_layer(method)
    global_ = F.normalize(embedding(global_pool(feature_map, pooling)), dim=-1)
    local = {}
    for grid_size in grid_sizes:
        cells = grid_pool(feature_map, grid_size).flatten(2).transpose(1, 2)  # B × G² × C
        local[grid_size] = F.normalize(embedding(cells), dim=-1)
    return global_, local


def grid_embeddings(
    method: nn.Module, images: torch.Tensor, *, grid_size: int = DEFAULT_GRID_SIZE
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(global B × d, local B × G² × d)`` of a batch of images, both L2-normalised (see :func:`embed_feature_map`)."""
    backbone, _, _ = _embedding_layer(method)
    global_, local = embed_feature_map(method, backbone(images), grid_sizes=(grid_size,))
    return global_, local[grid_size]


@dataclass
class GridEmbeddings:
    """A dataset's global embeddings ``N × d`` and local embeddings ``N × G² × d`` per G (float32 arrays)."""

    global_: np.ndarray
    local: dict[int, np.ndarray]
    labels: np.ndarray


@torch.no_grad()
def transport_explanation(
    method: nn.Module,
    images: torch.Tensor,
    *,
    grid_size: int = DEFAULT_GRID_SIZE,
    options: TransportOptions | None = None,
) -> TransportPlans:
    """The transport plan between the G × G cells of a query ``images[0]`` and those of each retrieval
    ``images[1:]``, with the cosine of their global embeddings and their structural similarity (Eq. 6), for any
    method with a ``backbone`` and a linear ``embedding`` layer (the plain baseline re-ranked by DIML too)."""
    was_training = method.training
    method.eval()
    global_, local = grid_embeddings(method, images, grid_size=grid_size)
    method.train(was_training)
    plans, values = [], []
    for retrieval in range(1, len(images)):
        value, _, transport = pairwise_structural_similarity(
            local[[0]], global_[[0]], local[[retrieval]], global_[[retrieval]], options=options
        )
        plans.append(transport.plan[0, 0].float().cpu().numpy())  # G² × G²
        values.append(f"cos {float(global_[0] @ global_[retrieval]):.2f}, s_struct {value.item():.2f}")
    return TransportPlans(
        title="DIML transport plans: lines = largest entries of T (width ∝ mass); the marginals μ_s, μ_t beside",
        grid=grid_size,
        plans=plans,
        values=values,
    )


@torch.no_grad()
def embed_grid_dataset(
    method: nn.Module,
    dataset,
    *,
    grid_sizes: Sequence[int] = (DEFAULT_GRID_SIZE,),
    batch_size: int = EVAL_BATCH_SIZE,
    device: torch.device | str = "cpu",
    channels_last: bool = False,
) -> GridEmbeddings:
    """Global and local embeddings of every image of ``dataset`` (in order), one backbone pass per batch, as float32
    arrays. They are computed under whatever autocast the caller holds (a run's are at the precision of its test
    embeddings: :func:`dmlstudy.experiments.kit.evaluation_sets`); ``channels_last`` as in
    :func:`dmlstudy.data.loading.evaluation_batches`."""
    backbone, _, _ = _embedding_layer(method)
    was_training = method.training
    method.eval()
    globals_, locals_ = [], {g: [] for g in grid_sizes}
    batches = evaluation_batches(
        dataset, np.arange(len(dataset)), batch_size=batch_size, device=device, channels_last=channels_last
    )
    for images in batches:
        global_, local = embed_feature_map(method, backbone(images), grid_sizes=grid_sizes)
        globals_.append(global_.float().cpu())
        for g in grid_sizes:
            locals_[g].append(local[g].float().cpu())
    method.train(was_training)
    return GridEmbeddings(
        torch.cat(globals_).numpy(), {g: torch.cat(v).numpy() for g, v in locals_.items()}, np.asarray(dataset.labels)
    )


# --------------------------------------------------------------------------------------------------
# base losses on similarity / distance matrices


def margin_loss_from_distances(
    distances: torch.Tensor, labels: torch.Tensor, *, margin: float = 0.2, beta: float = 1.2
) -> torch.Tensor:
    """Margin loss (Wu et al., ICCV 2017; supplement Eq. A.4) on a ``B × B`` distance matrix, over all triplets.

    Equals pytorch-metric-learning's ``MarginLoss`` (fixed β, ``triplets_per_anchor="all"``): every triplet
    (a, p, n) contributes ``[D_ap − β + m]_+ + [β − D_an + m]_+``, and the sum is divided by the number of
    positive terms. Written per pair instead of per triplet: a positive pair appears in |N_a| triplets and
    a negative pair in |P_a|, so no triplet list is built.
    """
    if distances.ndim != 2 or distances.shape[0] != distances.shape[1] or distances.shape[0] != labels.shape[0]:
        raise ValueError(
            f"margin_loss_from_distances: expected a B × B distance matrix and B labels, got {tuple(distances.shape)} and {tuple(labels.shape)}"
        )
    same = labels[:, None] == labels[None, :]
    positive = same & ~torch.eye(len(labels), dtype=torch.bool, device=labels.device)
    negative = ~same
    positives_per_anchor = positive.sum(dim=1, keepdim=True).to(distances.dtype)  # |P_a|
    negatives_per_anchor = negative.sum(dim=1, keepdim=True).to(distances.dtype)  # |N_a|
    zero = torch.zeros((), dtype=distances.dtype, device=distances.device)
    positive_loss = torch.where(positive, F.relu(distances - beta + margin), zero)
    negative_loss = torch.where(negative, F.relu(beta - distances + margin), zero)
    total = (negatives_per_anchor * positive_loss).sum() + (positives_per_anchor * negative_loss).sum()
    active = (negatives_per_anchor * (positive_loss > 0)).sum() + (positives_per_anchor * (negative_loss > 0)).sum()
    return total / active if active > 0 else total * 0.0


def proxy_nca_loss_from_distances(
    distances: torch.Tensor, labels: torch.Tensor, *, softmax_scale: float = 1.0
) -> torch.Tensor:
    """ProxyNCA (Movshovitz-Attias et al.; supplement Eq. A.9) on ``B × C`` image–proxy distances:
    ``−log softmax(−scale · d)_y`` averaged over the batch. The positive proxy stays in the denominator, as in
    pytorch-metric-learning's ``ProxyNCALoss`` (the original paper excludes it)."""
    if distances.ndim != 2 or distances.shape[0] != labels.shape[0]:
        raise ValueError(
            f"proxy_nca_loss_from_distances: expected B × C distances and B labels, got {tuple(distances.shape)} and {tuple(labels.shape)}"
        )
    return F.cross_entropy(-softmax_scale * distances, labels)


def _euclidean_from_cosine(similarity: torch.Tensor) -> torch.Tensor:
    """‖x − y‖ = sqrt(2 − 2⟨x, y⟩) for unit vectors, floored so identical vectors keep finite gradients."""
    return torch.sqrt((2.0 - 2.0 * similarity).clamp_min(_DISTANCE_FLOOR))


# --------------------------------------------------------------------------------------------------
# the method


@register_method(
    "diml",
    label="DIML-trained MS",
    group="paper",
    paper="Zhao et al., ICCV 2021 (training use)",
    summary="MS on ½(cos + s_struct) during training, cosine at test time",
    search_space={
        "lr": LR,
        "method_kwargs.epsilon": LogFloat(0.01, 0.2, paper=DEFAULT_EPSILON),  # ε of the Sinkhorn kernel
        "method_kwargs.structural_weight": Float(0.1, 0.9, paper=0.5),  # weight of s_struct (½ in the paper)
    },
)
class DIML(Method):
    """Baseline architecture (``normalize(W · pool(E(x)))``) trained with DIML's structural similarity.

    The embedding layer W is also applied to each cell of the G × G grid of the backbone map (local
    embeddings). Inference uses the global embedding only; re-ranking is :func:`dmlstudy.structural.reranking.diml_rerank`.

    Args:
        backbone: feature-map extractor E.
        embedding_dim: d.
        num_classes: training classes (the grid proxies of ``proxynca``).
        base_loss: ``ms`` (default; supplement Eq. A.6–A.8), ``margin`` (A.4–A.5) or ``proxynca`` (A.9–A.10).
        loss_kwargs: keyword arguments of the base loss — ms: alpha, beta, base, margin, mining
            (:func:`dmlstudy.losses.multi_similarity_loss` defaults); margin: margin, beta; proxynca: softmax_scale.
        grid_size: G (4).
        structural_weight: w of ``(1 − w)·global + w·structural`` (½ in the paper; 0 = the base loss alone).
        epsilon, uniform_marginals, max_iterations, tolerance, log_domain: the transport (:class:`TransportOptions`).
        pooling: global pooling of the map (``avg``, as the grid cells).
    """

    explanation_kind = TransportPlans

    def __init__(
        self,
        backbone: Backbone,
        *,
        embedding_dim: int = 128,
        num_classes: int,
        base_loss: str = "ms",
        loss_kwargs: dict | None = None,
        grid_size: int = DEFAULT_GRID_SIZE,
        structural_weight: float = 0.5,
        epsilon: float = DEFAULT_EPSILON,
        uniform_marginals: bool = False,
        max_iterations: int = 100,
        tolerance: float = 1e-3,
        log_domain: bool | None = None,
        pooling: str = "avg",
    ) -> None:
        super().__init__(backbone, embedding_dim=embedding_dim)
        if base_loss not in BASE_LOSSES:
            raise ValueError(f"DIML: unknown base_loss {base_loss!r}; valid: {', '.join(BASE_LOSSES)}")
        if not 0.0 <= structural_weight <= 1.0:
            raise ValueError(f"DIML: structural_weight must lie in [0, 1], got {structural_weight!r}")
        if not isinstance(grid_size, int) or grid_size < 1:
            raise ValueError(f"DIML: grid_size must be a positive integer, got {grid_size!r}")
        self.base_loss, self.grid_size, self.structural_weight, self.pooling = (
            base_loss,
            grid_size,
            float(structural_weight),
            pooling,
        )
        self.loss_kwargs = dict(loss_kwargs or {})
        allowed = {
            "ms": {"alpha", "beta", "base", "margin", "mining"},
            "margin": {"margin", "beta"},
            "proxynca": {"softmax_scale"},
        }[base_loss]
        if set(self.loss_kwargs) - allowed:
            raise ValueError(
                f"DIML: loss_kwargs {sorted(set(self.loss_kwargs) - allowed)} not accepted by base_loss {base_loss!r}; allowed: {sorted(allowed)}"
            )
        self.options = TransportOptions(
            epsilon=epsilon,
            uniform_marginals=uniform_marginals,
            max_iterations=max_iterations,
            tolerance=tolerance,
            log_domain=log_domain,
        )
        self.embedding = nn.Linear(backbone.num_features, embedding_dim)
        self.proxies: nn.Parameter | None = None
        if base_loss == "proxynca":
            self.proxies = nn.Parameter(
                torch.randn(num_classes, grid_size * grid_size, embedding_dim)
            )  # C × G² × d (pml's normal init)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.embedding(global_pool(self.backbone(images), self.pooling)), dim=1)

    def embed(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(global B × d, local B × G² × d)``, both L2-normalised."""
        global_, local = embed_feature_map(self, self.backbone(images), grid_sizes=(self.grid_size,))
        return global_, local[self.grid_size]

    def explain(self, images: torch.Tensor) -> Explanation:
        """The transport plans of its own grid and transport between the query and each retrieval
        (:func:`transport_explanation`)."""
        return transport_explanation(self, images, grid_size=self.grid_size, options=self.options)

    def loss(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        global_, local = self.embed(images)
        w = self.structural_weight
        if self.base_loss == "proxynca":
            return self._proxy_nca(global_, local, labels)
        cosine = global_ @ global_.T  # B × B
        structural, cells, transport = pairwise_structural_similarity(local, global_, options=self.options)
        if self.base_loss == "ms":
            value = multi_similarity_loss((1 - w) * cosine + w * structural, labels, **self.loss_kwargs)
        else:  # margin: D = ½(‖z̄_s − z̄_t‖ + Σ T_ij ‖ẑ_s,i − ẑ_t,j‖)
            structural_distance = (transport.plan * _euclidean_from_cosine(cells)).sum(dim=(-2, -1))
            value = margin_loss_from_distances(
                (1 - w) * _euclidean_from_cosine(cosine) + w * structural_distance, labels, **self.loss_kwargs
            )
        off_diagonal = ~torch.eye(len(labels), dtype=torch.bool, device=labels.device)
        return value, {
            self.base_loss: float(value.detach()),
            "s_struct": float(structural.detach()[off_diagonal].mean()) if off_diagonal.any() else 0.0,
            "sinkhorn_iterations": float(transport.pair_iterations.float().mean()),
        }

    def _proxy_nca(
        self, global_: torch.Tensor, local: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """ProxyNCA with grid proxies: d ← (1 − w) d(ψ, η_c) + w d_struct(z, ρ_c), squared Euclidean on unit vectors."""
        cells = F.normalize(self.proxies, dim=-1)  # C × G² × d
        global_proxies = F.normalize(self.proxies.mean(dim=1), dim=-1)  # η_c = GAP(ρ_c)
        global_distance = 2.0 - 2.0 * global_ @ global_proxies.T  # B × C
        structural, _, transport = pairwise_structural_similarity(
            local, global_, cells, global_proxies, options=self.options
        )
        distance = (1 - self.structural_weight) * global_distance + self.structural_weight * (2.0 - 2.0 * structural)
        value = proxy_nca_loss_from_distances(distance, labels, **self.loss_kwargs)
        return value, {
            "proxynca": float(value.detach()),
            "s_struct": float(structural.detach().mean()),
            "sinkhorn_iterations": float(transport.pair_iterations.float().mean()),
        }

    def head_parameters(self) -> list[nn.Parameter]:
        return [self.proxies] if self.proxies is not None else []
