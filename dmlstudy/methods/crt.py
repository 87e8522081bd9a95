"""CRT: coded residual transform (Kan et al., "Coded Residual Transform for Generalizable Deep Metric
Learning", NeurIPS 2022).

The backbone's feature map ``X`` (``B × C × H × W``) is read as ``HW`` tokens ``x_j ∈ R^C``. Against ``K``
learned prototypes ``c_k`` each token is coded by ``a_jk = softplus(x_jᵀ c_k) = log(1 + exp(x_jᵀ c_k))`` and
the coded residuals are (the paper's framework equation)

    r_k = Σ_j a_jk (x_j − c_k),                 k = 1..K                     (B × K × C)
    f   = (1/K) Σ_k Γ_k(r_k),  then L2-normalised                            (B × d)

with one linear projection ``Γ_k`` per prototype (all ``K`` applied at once by one matrix product). Two branches
share the backbone: branch 1 (``K1`` prototypes, ``d`` = ``embedding_dim``, used at test time) and branch 2
(``K2`` prototypes, ``D`` = ``high_dim`` = 1024). The training loss is

    L = L_DIV + λ1 (L_MS(f¹) + L_MS(f²)) + λ2 L_CON,
    L_DIV = 1/(K(K−1)) Σ_{k≠j} |cos(c_k, c_j)|              per prototype bank, summed over banks
    L_CON = mean_{i,j} |S¹_ij − S²_ij|,  S^b = cosine-similarity matrix of branch b's batch

λ1 = 1, λ2 = 0.9, K1 = K2 = 64 (the paper's defaults). The paper writes L_CON = ‖S¹ − S²‖₁; we take the
mean over the N² entries (our decision: a sum would swamp the other terms).

Decisions where the paper is silent (each is a keyword argument):

* ``residual_norm="hw"`` (default): r_k is divided by H·W. Γ_k has no bias and f is L2-normalised, so the
  embedding equals the paper's formula exactly; only the scale of the gradients changes (a 7 × 7 grid and a
  4 × 4 grid give residuals of similar size). ``"codes"`` divides by Σ_j a_jk instead (r_k becomes the
  code-weighted mean of x_j minus c_k: the relative weight of prototypes then no longer depends on how
  strongly they fire); ``"none"`` is the formula as written.
* ``coding="softplus"`` (default) codes with the raw inner product x_jᵀc_k; ``"cosine"`` codes with
  softplus(x̂_jᵀĉ_k) on L2-normalised tokens and prototypes (codes then lie in [0.31, 1.31]). The residual
  x_j − c_k itself is always on the raw vectors.
* Prototypes start as N(0, 1/C) (so x_jᵀc_k is O(1) for unit-variance features). Γ_k starts uniform in
  ±g/√C with g = ``projection_gain``; the default (0) means g = √K. Reason: f = (1/K) Σ_k Γ_k r_k is one
  linear map of fan-in K·C, and under Adam (which moves every weight by ≈ lr) a map with √K times the
  fan-in changes its output √K times faster relative to its size than a fan-in-C layer at standard
  init; g = √K restores the relative update size of an ``nn.Linear(C, d)``. Measured (synbirds, 100
  classes, 2 × 30 steps, lr 4e-3, seed 0): R@1 6.2 % with g = 1 (``nn.Linear``'s own init per Γ_k),
  14.1 % with g = 8 = √64, MS 11.6 %; g = 1 at lr 1e-3: 6.3 %. ``projection_gain=1.0`` restores the
  per-Γ_k ``nn.Linear`` init.
* L_DIV of a bank with K = 1 is 0 (there are no pairs).
* Shared weights (``shared=True``, the paper's choice): one bank, one residual computation, two Γ heads;
  it requires K1 = K2. ``shared=False``: two banks, each with its own L_DIV.
* Multi-Similarity is the project's (``dmlstudy.losses``, α = 2, β = 50, λ = 0.5, ε = 0.1, mining on), the same
  as the ``ms`` baseline; ``ms_kwargs`` overrides it.

Ablations of the paper as switches: ``use_crt=False`` is "−CRT" (each branch is the pooled feature map
through a linear head of size d or D, L_CON kept, no prototypes, no L_DIV); "−CRT−Consistency" is the plain
``ms`` baseline; "w/o multi-perspective" is ``K1=1, K2=1``; ``shared``, ``lambda_con`` (λ2), ``K1``, ``K2``,
``embedding_dim``/``high_dim`` (d, D).

Test-time functions: :func:`branch_embeddings` (either branch), :class:`BranchEmbedder` (a module that
``dmlstudy.run.evaluation.embed`` can use for branch 2), :func:`code_maps` (a_jk on the H × W grid, for heat maps)
and :func:`prototype_correlation` (the K × K |cos| matrix). Its explanation of a retrieval
(:meth:`CRT.explain`): the code maps of the most spatially selective prototypes on the query and its
retrievals (:func:`selective_prototypes`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from dmlstudy.losses import MultiSimilarityLoss
from dmlstudy.methods.base import Explanation, HeatMaps, Method, global_pool, register_method
from dmlstudy.models import Backbone
from dmlstudy.search_space import LR, Float, LogFloat

CODINGS = ("softplus", "cosine")
RESIDUAL_NORMS = ("hw", "codes", "none")


# ----------------------------------------------------------------------------------------------
# Pure tensor functions (the equations)
# ----------------------------------------------------------------------------------------------
def feature_tokens(feature_map: torch.Tensor) -> torch.Tensor:
    """``B × C × H × W`` feature map → ``B × HW × C`` tokens x_j (row-major over the grid)."""
    if feature_map.ndim != 4:
        raise ValueError(f"feature_tokens: expected a B × C × H × W feature map, got shape {tuple(feature_map.shape)}")
    return feature_map.flatten(2).transpose(1, 2)


def prototype_codes(tokens: torch.Tensor, prototypes: torch.Tensor, *, coding: str = "softplus") -> torch.Tensor:
    """Codes a_jk = softplus(x_jᵀ c_k) (``coding="softplus"``) or softplus(x̂_jᵀ ĉ_k) (``"cosine"``).

    Args:
        tokens: ``B × N × C`` (N = H·W).
        prototypes: ``K × C``.
    Returns:
        ``B × N × K``.
    """
    if coding not in CODINGS:
        raise ValueError(f"prototype_codes: coding must be one of {CODINGS}, got {coding!r}")
    if tokens.ndim != 3 or prototypes.ndim != 2 or tokens.shape[-1] != prototypes.shape[-1]:
        raise ValueError(
            f"prototype_codes: expected tokens B × N × C and prototypes K × C, got {tuple(tokens.shape)} and {tuple(prototypes.shape)}"
        )
    if coding == "cosine":
        tokens, prototypes = F.normalize(tokens, dim=-1), F.normalize(prototypes, dim=-1)
    return F.softplus(torch.einsum("bnc,kc->bnk", tokens, prototypes))


def coded_residuals(
    tokens: torch.Tensor, prototypes: torch.Tensor, *, coding: str = "softplus", residual_norm: str = "hw"
) -> torch.Tensor:
    """Coded residuals r_k = Σ_j a_jk (x_j − c_k) (CRT's framework equation), for all k at once.

    Computed as ``Σ_j a_jk x_j − (Σ_j a_jk) c_k`` (two einsums, no N × K × C tensor).

    Args:
        tokens: ``B × N × C``.
        prototypes: ``K × C``.
        coding: see :func:`prototype_codes`.
        residual_norm: ``"hw"`` divides by N (default), ``"codes"`` by Σ_j a_jk, ``"none"`` leaves the sum.
    Returns:
        ``B × K × C``.
    """
    if residual_norm not in RESIDUAL_NORMS:
        raise ValueError(f"coded_residuals: residual_norm must be one of {RESIDUAL_NORMS}, got {residual_norm!r}")
    codes = prototype_codes(tokens, prototypes, coding=coding)  # B × N × K
    code_sums = codes.sum(dim=1)  # B × K
    residuals = torch.einsum("bnk,bnc->bkc", codes, tokens) - code_sums[..., None] * prototypes[None]  # B × K × C
    if residual_norm == "hw":
        residuals = residuals / tokens.shape[1]
    elif residual_norm == "codes":
        residuals = residuals / code_sums.clamp_min(1e-12)[..., None]
    return residuals


def project_residuals(residuals: torch.Tensor, projections: torch.Tensor) -> torch.Tensor:
    """f = (1/K) Σ_k Γ_k r_k, every Γ_k at once: ``B × K × C`` and ``K × C × d`` → ``B × d`` (not normalised)."""
    if residuals.ndim != 3 or projections.ndim != 3 or residuals.shape[1:] != projections.shape[:2]:
        raise ValueError(
            f"project_residuals: expected residuals B × K × C and projections K × C × d, got {tuple(residuals.shape)} and {tuple(projections.shape)}"
        )
    batch, count, channels = residuals.shape
    # ≡ einsum("bkc,kcd->bd"): one GEMM over the flattened (k, c) axis (≈ 20 % faster than einsum's bmm on CPU)
    return residuals.reshape(batch, count * channels) @ projections.reshape(count * channels, -1) / count


def diversity_loss(prototypes: torch.Tensor) -> torch.Tensor:
    """L_DIV = 1/(K(K−1)) Σ_{k≠j} |c_k·c_j| / (‖c_k‖ ‖c_j‖) (CRT); 0 for a single prototype."""
    count = prototypes.shape[0]
    if count < 2:
        return prototypes.sum() * 0.0
    unit = F.normalize(prototypes, dim=1)
    absolute_cosine = (unit @ unit.T).abs()  # K × K
    off_diagonal = absolute_cosine.sum() - absolute_cosine.diagonal().sum()
    return off_diagonal / (count * (count - 1))


def consistency_loss(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """L_CON = mean over the N² entries of |S¹ − S²|, S^b_ij = cos(f^b_i, f^b_j) (cross-CRT correlation consistency).

    ``first`` (N × d) and ``second`` (N × D) may differ in width; both are L2-normalised here.
    """
    if first.ndim != 2 or second.ndim != 2 or first.shape[0] != second.shape[0]:
        raise ValueError(
            f"consistency_loss: expected N × d and N × D embeddings of one batch, got {tuple(first.shape)} and {tuple(second.shape)}"
        )
    first, second = F.normalize(first, dim=1), F.normalize(second, dim=1)
    return (first @ first.T - second @ second.T).abs().mean()


# ----------------------------------------------------------------------------------------------
# Modules
# ----------------------------------------------------------------------------------------------
class PrototypeBank(nn.Module):
    """K learned prototypes; ``forward(feature_map)`` gives the coded residuals ``B × K × C``."""

    def __init__(
        self, num_prototypes: int, channels: int, *, coding: str = "softplus", residual_norm: str = "hw"
    ) -> None:
        super().__init__()
        if num_prototypes < 1:
            raise ValueError(f"PrototypeBank: num_prototypes must be ≥ 1, got {num_prototypes}")
        if coding not in CODINGS or residual_norm not in RESIDUAL_NORMS:
            raise ValueError(
                f"PrototypeBank: coding must be one of {CODINGS} and residual_norm one of {RESIDUAL_NORMS}, got {coding!r}, {residual_norm!r}"
            )
        self.coding, self.residual_norm = coding, residual_norm
        self.prototypes = nn.Parameter(torch.randn(num_prototypes, channels) / math.sqrt(channels))

    @property
    def num_prototypes(self) -> int:
        return self.prototypes.shape[0]

    def forward(self, feature_map: torch.Tensor) -> torch.Tensor:
        return coded_residuals(
            feature_tokens(feature_map), self.prototypes, coding=self.coding, residual_norm=self.residual_norm
        )

    def codes(self, feature_map: torch.Tensor) -> torch.Tensor:
        """a_jk on the grid: ``B × K × H × W``."""
        batch, _, height, width = feature_map.shape
        codes = prototype_codes(feature_tokens(feature_map), self.prototypes, coding=self.coding)  # B × HW × K
        return codes.transpose(1, 2).reshape(batch, -1, height, width)


class ResidualProjection(nn.Module):
    """The K projections Γ_k: C → d as one ``K × C × d`` weight (no bias); ``forward`` = :func:`project_residuals`."""

    def __init__(self, num_prototypes: int, channels: int, out_dim: int, *, gain: float = 1.0) -> None:
        super().__init__()
        bound = gain / math.sqrt(channels)
        self.weight = nn.Parameter(torch.empty(num_prototypes, channels, out_dim).uniform_(-bound, bound))

    def forward(self, residuals: torch.Tensor) -> torch.Tensor:
        return project_residuals(residuals, self.weight)


class CRT(Method):
    """Coded residual transform with two branches and the cross-branch consistency loss.

    Args:
        backbone: feature-map extractor (needs a spatial grid; 4 × 4 at 64 px for ``dml_convnet``).
        embedding_dim: d of branch 1, the test-time embedding (128).
        num_classes: unused (CRT has no proxies); accepted for the registry's uniform signature.
        K1: prototypes of branch 1 (64).
        K2: prototypes of branch 2 (64).
        high_dim: D, the width of branch 2 (1024).
        shared: one prototype bank for both branches (default; requires K1 = K2); ``False``: two banks.
        use_crt: ``False`` is the paper's "−CRT" ablation: pooled features + linear heads (d and D), L_CON kept.
        lambda_ms: λ1, the weight of L_MS(f¹) + L_MS(f²) (1.0).
        lambda_con: λ2, the weight of L_CON (0.9).
        coding: ``"softplus"`` (default, raw inner products) or ``"cosine"``; see the module docstring.
        residual_norm: ``"hw"`` (default), ``"codes"`` or ``"none"``; see the module docstring.
        pooling: pooling of the "−CRT" heads (``avg``, as the ``ms`` baseline).
        ms_kwargs: keyword arguments of :class:`dmlstudy.losses.MultiSimilarityLoss` (project defaults).
        projection_gain: Γ_k initialisation bound × √C; 0 (default) = √K per branch, 1.0 = ``nn.Linear``'s.
    """

    explanation_kind = HeatMaps

    def __init__(
        self,
        backbone: Backbone,
        *,
        embedding_dim: int = 128,
        num_classes: int = 0,
        K1: int = 64,
        K2: int = 64,
        high_dim: int = 1024,
        shared: bool = True,
        use_crt: bool = True,
        lambda_ms: float = 1.0,
        lambda_con: float = 0.9,
        coding: str = "softplus",
        residual_norm: str = "hw",
        pooling: str = "avg",
        ms_kwargs: dict | None = None,
        projection_gain: float = 0.0,
    ) -> None:
        super().__init__(backbone, embedding_dim=embedding_dim)
        if min(K1, K2) < 1 or min(embedding_dim, high_dim) < 1:
            raise ValueError(
                f"CRT: K1, K2, embedding_dim and high_dim must be ≥ 1, got K1={K1}, K2={K2}, d={embedding_dim}, D={high_dim}"
            )
        if use_crt and shared and K1 != K2:
            raise ValueError(
                f"CRT: shared=True needs K1 == K2 (one prototype bank), got K1={K1}, K2={K2}; pass shared=False for two banks"
            )
        self.K1, self.K2, self.high_dim = K1, K2, high_dim
        self.shared, self.use_crt, self.pooling = shared, use_crt, pooling
        self.lambda_ms, self.lambda_con = float(lambda_ms), float(lambda_con)
        channels = backbone.num_features
        self.branch_dims = (embedding_dim, high_dim)
        if use_crt:
            bank_sizes = (K1,) if shared else (K1, K2)
            self.banks = nn.ModuleList(
                PrototypeBank(size, channels, coding=coding, residual_norm=residual_norm) for size in bank_sizes
            )
            gains = [projection_gain or math.sqrt(K) for K in (K1, K2)]  # 0: √K (see the module docstring)
            self.heads = nn.ModuleList(
                [
                    ResidualProjection(K1, channels, embedding_dim, gain=gains[0]),
                    ResidualProjection(K2, channels, high_dim, gain=gains[1]),
                ]
            )
        else:
            self.banks = nn.ModuleList()
            self.heads = nn.ModuleList([nn.Linear(channels, embedding_dim), nn.Linear(channels, high_dim)])
        self.criterion = MultiSimilarityLoss(**(ms_kwargs or {}))

    def bank(self, branch: int) -> PrototypeBank:
        """The prototype bank of branch 1 or 2 (the same object when shared)."""
        _check_branch(branch)
        if not self.use_crt:
            raise ValueError("CRT(use_crt=False) is the '−CRT' ablation: it has no prototypes")
        return self.banks[0] if self.shared else self.banks[branch - 1]

    def _raw_branches(self, feature_map: torch.Tensor, branches: tuple[int, ...]) -> list[torch.Tensor]:
        """Unnormalised embeddings of the requested branches; one residual computation per bank used."""
        if not self.use_crt:
            pooled = global_pool(feature_map, self.pooling)
            return [self.heads[b - 1](pooled) for b in branches]
        residuals = {}  # bank index → B × K × C
        outputs = []
        for branch in branches:
            index = 0 if self.shared else branch - 1
            if index not in residuals:
                residuals[index] = self.banks[index](feature_map)
            outputs.append(self.heads[branch - 1](residuals[index]))
        return outputs

    def embed_branches(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """L2-normalised embeddings of both branches, ``(B × d, B × D)``, from one backbone pass."""
        first, second = self._raw_branches(self.backbone(images), (1, 2))
        return F.normalize(first, dim=1), F.normalize(second, dim=1)

    def embed_branch(self, images: torch.Tensor, branch: int = 1) -> torch.Tensor:
        """L2-normalised embedding of one branch (1: ``B × d``, the test-time one; 2: ``B × D``)."""
        _check_branch(branch)
        (raw,) = self._raw_branches(self.backbone(images), (branch,))
        return F.normalize(raw, dim=1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.embed_branch(images, 1)

    def loss(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """L = L_DIV + λ1 (L_MS(f¹) + L_MS(f²)) + λ2 L_CON; parts ``div``, ``ms1``, ``ms2``, ``con``.

        Under distributed training both branches are gathered to the global batch (:meth:`Method.gather`)
        before the similarity matrices of L_MS and L_CON are built.
        """
        first, second = self.embed_branches(images)
        first, all_labels = self.gather(first, labels)
        second, _ = self.gather(second, labels)
        labels = all_labels
        ms_first, ms_second = self.criterion(first, labels), self.criterion(second, labels)
        consistency = consistency_loss(first, second)
        diversity = sum((diversity_loss(bank.prototypes) for bank in self.banks), start=first.new_zeros(()))
        total = diversity + self.lambda_ms * (ms_first + ms_second) + self.lambda_con * consistency
        parts = {"div": diversity, "ms1": ms_first, "ms2": ms_second, "con": consistency}
        return total, {name: float(value.detach()) for name, value in parts.items()}

    def explain(self, images: torch.Tensor, *, prototypes: int = 6, branch: int = 1) -> Explanation:
        """The code maps a_jk of the ``prototypes`` most spatially selective prototypes of ``branch``
        (:func:`selective_prototypes`) on every image, each map min–max scaled (where a prototype fires, not how
        strongly); the title gives its mean code."""
        if not self.use_crt:
            return "CRT without the transform (use_crt=False): no prototypes to show"
        maps = code_maps(self, images, branch=branch)  # B × K × h × w
        chosen = selective_prototypes(maps, min(prototypes, maps.shape[1]))
        panels = [
            [(row, _unit_range(maps[row, k]), f"c_{k} (ā={float(maps[row, k].mean()):.2f})") for k in chosen]
            for row in range(len(images))
        ]
        return HeatMaps(
            title=f"CRT code maps a_jk of the {len(chosen)} most spatially selective prototypes (branch {branch})",
            label="code a_jk, min–max scaled per map",
            panels=panels,
            rows=list(range(len(images))),
            plain=True,
        )


def _check_branch(branch: int) -> None:
    if branch not in (1, 2):
        raise ValueError(f"branch must be 1 (d, test time) or 2 (D), got {branch!r}")


register_method(
    "crt",
    label="CRT",
    group="paper",
    paper="Kan et al., NeurIPS 2022",
    summary="coded residual transform, two branches, consistency loss",
    search_space={  # CRT has no head parameters: prototypes and Γ train at lr
        "lr": LR,
        "method_kwargs.lambda_ms": LogFloat(0.25, 4.0, paper=1.0),  # λ1
        "method_kwargs.lambda_con": Float(0.0, 1.0, paper=0.9),  # λ2 (the paper's ablation range)
    },
)(CRT)


# ----------------------------------------------------------------------------------------------
# Test-time functions
# ----------------------------------------------------------------------------------------------
def _as_crt(method: nn.Module) -> CRT:
    if not isinstance(method, CRT):
        raise TypeError(f"expected a CRT method (build_method('crt', ...)), got {type(method).__name__}")
    return method


@torch.no_grad()
def branch_embeddings(method: CRT, images: torch.Tensor, *, branch: int = 2) -> torch.Tensor:
    """L2-normalised embeddings of ``branch`` (1: d, 2: D) for a batch of images, in eval mode."""
    method = _as_crt(method)
    was_training = method.training
    method.eval()
    try:
        return method.embed_branch(images, branch)
    finally:
        method.train(was_training)


class BranchEmbedder(nn.Module):
    """A view of a trained CRT whose ``forward`` returns one branch (e.g. for ``dmlstudy.run.evaluation.embed``)."""

    def __init__(self, method: CRT, branch: int = 2) -> None:
        super().__init__()
        _check_branch(branch)
        self.method, self.branch = _as_crt(method), branch

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.method.embed_branch(images, self.branch)


@torch.no_grad()
def code_maps(method: CRT, images: torch.Tensor, *, branch: int = 1) -> torch.Tensor:
    """Codes a_jk = softplus(x_jᵀ c_k) of ``branch``'s prototypes on the backbone grid: ``B × K × H × W``.

    (The paper's correlation heat maps; upsample to the image size to overlay them.) Eval mode.
    """
    method = _as_crt(method)
    was_training = method.training
    method.eval()
    try:
        return method.bank(branch).codes(method.backbone(images))
    finally:
        method.train(was_training)


@torch.no_grad()
def prototype_correlation(method: CRT, *, branch: int = 1) -> torch.Tensor:
    """|cos(c_k, c_j)| between the prototypes of ``branch``: ``K × K`` (ones on the diagonal)."""
    unit = F.normalize(_as_crt(method).bank(branch).prototypes, dim=1)
    return (unit @ unit.T).abs()


def selective_prototypes(maps: torch.Tensor, count: int) -> list[int]:
    """The ``count`` prototypes whose code maps (``B × K × H × W``) vary most over the grid (coefficient of
    variation, averaged over the images)."""
    flat = maps.flatten(2)  # B × K × HW
    variation = (flat.std(dim=2) / flat.mean(dim=2).clamp_min(1e-12)).mean(dim=0)
    return variation.argsort(descending=True)[:count].tolist()


def _unit_range(heat: torch.Tensor):
    """``heat`` min–max scaled to [0, 1], as a numpy array."""
    return ((heat - heat.min()) / (heat.max() - heat.min()).clamp_min(1e-12)).cpu().numpy()
