"""Cross-image attention for conditional embeddings (Kotovenko et al., CVPR 2023).

Training conditions the embedding of image i on the image j it is compared with, through a hierarchy of
cross-attention blocks (Eq. 1–4 of the paper); the Multi-Similarity loss is applied to the similarity of
the last level (Eq. 5–6, Algorithm 1). At test time only the plain embedding φ⁰ is used, so inference
costs exactly what the MS baseline costs.

* φ⁰(i) = Linear(C → d) of the global average pool of E(I_i) (L2-normalised for retrieval).
* CA(q, k, v) = softmax(Q(q̂) K(LN(k))ᵀ / √d) V(LN(v)), q̂ = q/‖q‖ (Eq. 2 with the normalisations of
  Sec. 4); one head, Q: d → d, K, V: C → d; no residual, no MLP, no output projection.
* φⁿ(i|j) = CA(φⁿ⁻¹(j|i), E_i, E_i) (Eq. 4) for every ordered pair of the batch at once: a B × B × d tensor.
* sⁿ(i, j) = cos(φⁿ(i|j), φⁿ(j|i)) (Eq. 5); the loss is MS on sᴺ (Eq. 6).

Decisions where the paper is silent:

* One LayerNorm per block, applied to E_i before both K and V (keys and values are the same tensor E_i,
  as in Perceiver IO's cross-attention, which the paper cites for its blocks). The linear maps have biases.
* Shared weights across blocks by default (``shared_blocks``): the paper's 27.7M parameters for ResNet-50
  + 6 blocks only fit one shared block. With shared weights K(LN(E_i)) and V(LN(E_i)) are computed once per
  image for the whole hierarchy; with independent blocks once per image and block.
* Q(q̂)·k is computed as q̂·(Wᵀk) + b·k: identical to projecting every query, but Wᵀk is computed once per
  image location (B·T vectors) instead of projecting all B² conditioning vectors.
* ``residual`` (an option, off by default) adds the image's own previous level: φⁿ(i|j) = φⁿ⁻¹(i|j) +
  CA(φⁿ⁻¹(j|i), E_i, E_i). A residual on the query φⁿ⁻¹(j|i) instead would put image j's embedding into
  image i's representation, so we do not use that form.
* MS parameters are those of the study's ``ms`` baseline (α = 2, β = 50, λ = 0.5, ε = 0.1) so the two are
  compared at equal loss settings; ``loss_kwargs`` overrides them.
* With ``num_blocks = 0`` the method is the MS baseline: the same parameters, created in the same order
  (so the same initial weights for a seed), and the same loss on s⁰.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dmlstudy import metrics as metric_functions
from dmlstudy.losses import multi_similarity_loss
from dmlstudy.methods.base import EVAL_BATCH_SIZE, Explanation, HeatMaps, Method, global_pool, register_method
from dmlstudy.models import Backbone
from dmlstudy.search_space import LR, Int


def feature_tokens(feature_map: torch.Tensor) -> torch.Tensor:
    """``B × C × H × W`` → ``B × T × C`` local encodings, T = H·W (row-major, as ``flatten`` orders them)."""
    if feature_map.ndim != 4:
        raise ValueError(f"cross-attention: expected a feature map B × C × H × W, got shape {tuple(feature_map.shape)}")
    return feature_map.flatten(2).transpose(1, 2)


@dataclass
class AttentionMemory:
    """What a block needs from one set of images, computed once per image (not per pair).

    ``folded_keys`` = K(LN(E))·W_Q (``X × T × d``), ``key_bias`` = K(LN(E))·b_Q (``X × T``) and
    ``values`` = V(LN(E)) (``X × T × d``), so that Q(q̂)·K(LN(E))ᵀ = q̂·folded_keysᵀ + key_bias.
    """

    folded_keys: torch.Tensor
    key_bias: torch.Tensor
    values: torch.Tensor

    def select(self, rows: slice) -> AttentionMemory:
        return AttentionMemory(self.folded_keys[rows], self.key_bias[rows], self.values[rows])


class AttentionWeights(nn.Module):
    """Eq. 1: softmax over locations of Q(q̂)·K(LN(E))ᵀ / √d, for ``X × Y`` conditioning vectors at once.

    Q(q̂)·k = (q·Wᵀk)/‖q‖ + b·k: the conditioning vectors are used as they are and the ``X × Y × T`` logits
    are divided by their norms, which gives q̂ without normalising (and back-propagating through) a
    ``X × Y × d`` tensor. A module of its own so that :class:`AttentionRecorder` can read the weights with
    a forward hook.
    """

    def __init__(self, embedding_dim: int) -> None:
        super().__init__()
        self.scale = embedding_dim**-0.5

    def forward(self, conditioning: torch.Tensor, folded_keys: torch.Tensor, key_bias: torch.Tensor) -> torch.Tensor:
        """``conditioning`` X × Y × d (q, not normalised), ``folded_keys`` X × T × d, ``key_bias`` X × T →
        weights X × Y × T."""
        norms = torch.linalg.vector_norm(conditioning, dim=-1).clamp_min(1e-12)  # X × Y, as F.normalize
        logits = torch.einsum("xyd,xtd->xyt", conditioning, folded_keys) / norms[..., None] + key_bias[:, None, :]
        return torch.softmax(logits * self.scale, dim=-1)


class CrossAttentionBlock(nn.Module):
    """One cross-attention block CA(q, k, v) = softmax(Q(q̂) K(LN(k))ᵀ / √d) V(LN(v)) (Eq. 2).

    Args:
        feature_dim: C, channels of the backbone feature map (keys and values).
        embedding_dim: d, size of queries and outputs.
    """

    def __init__(self, feature_dim: int, embedding_dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(feature_dim)
        self.query = nn.Linear(embedding_dim, embedding_dim)
        self.key = nn.Linear(feature_dim, embedding_dim)
        self.value = nn.Linear(feature_dim, embedding_dim)
        self.attention = AttentionWeights(embedding_dim)

    def memory(self, tokens: torch.Tensor) -> AttentionMemory:
        """Keys (folded with Q) and values of ``tokens`` (``X × T × C``), once per image."""
        normalized = self.norm(tokens)
        keys = self.key(normalized)  # X × T × d
        return AttentionMemory(keys @ self.query.weight, keys @ self.query.bias, self.value(normalized))

    def forward(self, conditioning: torch.Tensor, memory: AttentionMemory) -> torch.Tensor:
        """``conditioning`` X × Y × d (entry [x, y] conditions image x) → ``X × Y × d`` attended values of image x."""
        weights = self.attention(conditioning, memory.folded_keys, memory.key_bias)
        return torch.einsum("xyt,xtd->xyd", weights, memory.values)


@register_method(
    "cross_attention",
    label="cross-attention",
    group="paper",
    paper="Kotovenko et al., CVPR 2023",
    summary="MS on the similarity of cross-image-conditioned embeddings; plain embedding at test time",
    search_space={  # the blocks train at lr with the rest (no separate parameter group)
        "lr": LR,
        "method_kwargs.num_blocks": Int(1, 6, paper=6),  # N
    },
)
class CrossAttention(Method):
    """MS baseline plus a training-time hierarchy of cross-attention blocks (Algorithm 1 of the paper).

    Args:
        backbone: the encoder E (feature map ``B × C × H × W``).
        embedding_dim: d, the size of φ⁰ and of every φⁿ (the paper: 512; the study: 128).
        num_classes: unused (the method has no proxies); accepted for the common constructor.
        num_blocks: N, the number of cross-attention levels (the paper: 6). 0 gives the MS baseline.
        shared_blocks: one block applied N times (default, as the paper's parameter count implies) or N
            independent blocks.
        residual: φⁿ(i|j) = φⁿ⁻¹(i|j) + CA(…) instead of CA(…) alone (option; off in the paper).
        unconditional_loss: add MS on s⁰ to the loss on sᴺ (option).
        loss_kwargs: keyword arguments of :func:`dmlstudy.losses.multi_similarity_loss`.
    """

    explanation_kind = HeatMaps

    def __init__(
        self,
        backbone: Backbone,
        *,
        embedding_dim: int = 128,
        num_classes: int = 0,
        num_blocks: int = 6,
        shared_blocks: bool = True,
        residual: bool = False,
        unconditional_loss: bool = False,
        loss_kwargs: dict | None = None,
    ) -> None:
        super().__init__(backbone, embedding_dim=embedding_dim)
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 0:
            raise ValueError(f"cross_attention: num_blocks must be an integer ≥ 0, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.shared_blocks = bool(shared_blocks)
        self.residual = bool(residual)
        self.unconditional_loss = bool(unconditional_loss)
        self.loss_kwargs = dict(loss_kwargs or {})
        self.embedding = nn.Linear(backbone.num_features, embedding_dim)  # φ, created first as in the baseline
        distinct = (1 if num_blocks else 0) if self.shared_blocks else num_blocks
        self.blocks = nn.ModuleList(CrossAttentionBlock(backbone.num_features, embedding_dim) for _ in range(distinct))

    # --- the unconditional embedding (inference) ---------------------------------------------------------
    def unconditional(self, feature_map: torch.Tensor) -> torch.Tensor:
        """φ⁰ = Linear(avgpool(E)), ``B × d``, not normalised."""
        return self.embedding(global_pool(feature_map, "avg"))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Inference embedding: normalised φ⁰ (no attention, no extra cost)."""
        return F.normalize(self.unconditional(self.backbone(images)), dim=1)

    # --- the hierarchy of conditional embeddings ---------------------------------------------------------
    def block(self, level: int) -> CrossAttentionBlock:
        """The block that computes level ``level`` (1 ≤ level ≤ N)."""
        if not 1 <= level <= self.num_blocks:
            raise ValueError(f"cross_attention: level must be in 1..{self.num_blocks}, got {level}")
        return self.blocks[0 if self.shared_blocks else level - 1]

    def memories(self, feature_map: torch.Tensor) -> list[AttentionMemory]:
        """Keys/values of every distinct block for a set of images (one entry when blocks are shared)."""
        tokens = feature_tokens(feature_map)
        return [block.memory(tokens) for block in self.blocks]

    def _memory(self, memories: list[AttentionMemory], level: int) -> AttentionMemory:
        return memories[0 if self.shared_blocks else level - 1]

    def _next_level(
        self, level: int, conditioning: torch.Tensor, memory: AttentionMemory, previous: torch.Tensor
    ) -> torch.Tensor:
        """φⁿ of the images of ``memory`` given their conditioning vectors φⁿ⁻¹(j|i) (Eq. 4)."""
        attended = self.block(level)(conditioning, memory)
        return previous + attended if self.residual else attended

    def _check_levels(self, num_levels: int | None) -> int:
        num_levels = self.num_blocks if num_levels is None else num_levels
        if not 0 <= num_levels <= self.num_blocks:
            raise ValueError(
                f"cross_attention: levels must be in 0..{self.num_blocks} (the trained N), got {num_levels}"
            )
        return num_levels

    def conditional_embeddings(self, feature_map: torch.Tensor, *, num_levels: int | None = None) -> list[torch.Tensor]:
        """[φ⁰, φ¹, …, φⁿ] for every ordered pair of a batch (Algorithm 1), each ``B × B × d`` with entry
        [i, j] = φⁿ(i|j); φ⁰ is broadcast over j. Two einsums per level; keys/values once per image."""
        count = self._check_levels(num_levels)
        size = feature_map.shape[0]
        memories = self.memories(feature_map) if count else []
        levels = [self.unconditional(feature_map)[:, None, :].expand(size, size, -1)]
        for level in range(1, count + 1):
            previous = levels[-1]
            # entry [i, j] is conditioned on φⁿ⁻¹(j|i) = previous[j, i]
            levels.append(self._next_level(level, previous.transpose(0, 1), self._memory(memories, level), previous))
        return levels

    def loss(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """MS on sᴺ (Eq. 6), plus MS on s⁰ when ``unconditional_loss``.

        Under distributed training the feature maps of all ranks are gathered first (:meth:`Method.gather`),
        so the pairs span the global batch as in one process.
        """
        maps, labels = self.gather(self.backbone(images), labels)
        levels = self.conditional_embeddings(maps)
        final = multi_similarity_loss(pair_similarity(levels[-1]), labels, **self.loss_kwargs)
        parts = {f"ms_s{self.num_blocks}": float(final.detach())}
        if self.unconditional_loss and self.num_blocks:
            unconditional = multi_similarity_loss(pair_similarity(levels[0]), labels, **self.loss_kwargs)
            parts["ms_s0"] = float(unconditional.detach())
            final = final + unconditional
        return final, parts

    @torch.no_grad()
    def explain(self, images: torch.Tensor, *, level: int | None = None) -> Explanation:
        """The attention of block ``level`` (default the last) for each retrieval r: over the query's locations
        when the query is conditioned on r, and over r's when r is conditioned on the query; one pass of the
        hierarchy over the batch, read with forward hooks (:class:`AttentionRecorder`), each map divided by its
        largest weight."""
        if not self.num_blocks:
            return "cross-attention with N = 0 blocks: no attention to show"
        level = level or self.num_blocks
        feature_map, maps = recorded_attention(self, images, num_levels=level)
        weights = maps[level - 1]  # X × X × T: [i, j] = image i's locations, conditioned on image j
        height, width = feature_map.shape[-2:]

        def scaled(image: int, other: int) -> np.ndarray:
            heat = weights[image, other].reshape(height, width).float().numpy()
            return heat / (float(heat.max()) or 1.0)

        retrievals = range(1, len(images))
        return HeatMaps(
            title=f"attention of block {level}: where an image looks when conditioned on the other",
            label="attention weight / its maximum",
            panels=[[(0, scaled(0, r), f"query | #{r}"), (r, scaled(r, 0), f"#{r} | query")] for r in retrievals],
            rows=list(retrievals),
        )


def pair_similarity(level: torch.Tensor) -> torch.Tensor:
    """sⁿ(i, j) = cos(φⁿ(i|j), φⁿ(j|i)) (Eq. 5) from a ``B × B × d`` level; symmetric ``B × B``."""
    unit = F.normalize(level, dim=-1)
    return torch.einsum("ijd,jid->ij", unit, unit)


def cross_conditional_embeddings(
    method: CrossAttention,
    query_maps: torch.Tensor,
    candidate_maps: torch.Tensor,
    *,
    num_levels: int | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The hierarchy between two sets of images: per level ``(own, other)`` with ``own[q, g] = φⁿ(q|g)``
    (``Q × G × d``) and ``other[g, q] = φⁿ(g|q)`` (``G × Q × d``). Level 0 first.

    The same blocks as :meth:`CrossAttention.conditional_embeddings`; used for test-time scoring, where queries
    and candidates differ and the queries can be processed in chunks.
    """
    count = method._check_levels(num_levels)
    return _cross_levels(method, _side(method, query_maps, count), _side(method, candidate_maps, count), count)


def _side(method: CrossAttention, feature_map: torch.Tensor, count: int) -> tuple[torch.Tensor, list[AttentionMemory]]:
    return method.unconditional(feature_map), (method.memories(feature_map) if count else [])


def _cross_levels(
    method: CrossAttention, queries: tuple, candidates: tuple, count: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    (query_phi, query_memories), (candidate_phi, candidate_memories) = queries, candidates
    own = query_phi[:, None, :].expand(-1, len(candidate_phi), -1)  # Q × G × d
    other = candidate_phi[:, None, :].expand(-1, len(query_phi), -1)  # G × Q × d
    levels = [(own, other)]
    for level in range(1, count + 1):
        own, other = (
            method._next_level(level, other.transpose(0, 1), method._memory(query_memories, level), own),
            method._next_level(level, own.transpose(0, 1), method._memory(candidate_memories, level), other),
        )
        levels.append((own, other))
    return levels


def cross_similarity(own: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """sⁿ(q, g) = cos(φⁿ(q|g), φⁿ(g|q)) from ``own`` (Q × G × d) and ``other`` (G × Q × d) → ``Q × G``."""
    return torch.einsum("qgd,gqd->qg", F.normalize(own, dim=-1), F.normalize(other, dim=-1))


@torch.no_grad()
def conditional_similarities(
    method: CrossAttention,
    query_maps: torch.Tensor,
    candidate_maps: torch.Tensor | None = None,
    *,
    levels: Sequence[int] | None = None,
    chunk_size: int = 64,
) -> dict[int, torch.Tensor]:
    """Test-time scores sⁿ (queries × candidates) for each ``n`` in ``levels`` (default 0..N).

    Quadratic in the number of images (every pair has its own embeddings): meant for subsets. Queries are
    processed ``chunk_size`` at a time; candidates default to the queries (all against all, the diagonal
    included). Returns ``{n: Q × G tensor}`` on the maps' device.
    """
    if not isinstance(method, CrossAttention):
        raise TypeError(f"conditional_similarities: expected a CrossAttention method, got {type(method).__name__}")
    candidate_maps = query_maps if candidate_maps is None else candidate_maps
    levels = list(range(method.num_blocks + 1)) if levels is None else [int(n) for n in levels]
    count = method._check_levels(max(levels)) if levels else 0
    if min(levels, default=0) < 0:
        raise ValueError(f"conditional_similarities: levels must be ≥ 0, got {levels}")
    candidates = _side(method, candidate_maps, count)
    chunks: dict[int, list[torch.Tensor]] = {n: [] for n in levels}
    for start in range(0, len(query_maps), chunk_size):
        queries = _side(method, query_maps[start : start + chunk_size], count)
        computed = _cross_levels(method, queries, candidates, count)
        for n in levels:
            chunks[n].append(cross_similarity(*computed[n]))
    return {n: torch.cat(parts) for n, parts in chunks.items()}


@torch.no_grad()
def feature_maps(
    method: Method, dataset, *, batch_size: int = EVAL_BATCH_SIZE, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Backbone feature maps ``N × C × H × W`` of a dataset (eval mode, dataset order), on ``device``."""
    was_training = method.training
    method.eval()
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=False)
    maps = torch.cat([method.backbone(images.to(device)) for images, _ in loader])
    method.train(was_training)
    return maps


def subset_indices(labels: np.ndarray, size: int, *, seed: int = 0) -> np.ndarray:
    """A seeded random subset of ``size`` indices (all when ``size`` ≤ 0 or ≥ N), sorted."""
    count = len(labels)
    if size <= 0 or size >= count:
        return np.arange(count)
    return np.sort(np.random.default_rng(seed).choice(count, size=size, replace=False))


def conditional_retrieval(
    method: CrossAttention,
    maps: torch.Tensor,
    labels: np.ndarray,
    *,
    levels: Sequence[int] | None = None,
    ks: Sequence[int] = (1, 2),
    chunk_size: int = 64,
) -> dict[int, dict[str, float]]:
    """Retrieval metrics (R@K, RP, MAP@R) of sⁿ, all against all within ``maps`` (self excluded), per level.

    Level 0 ranks by the cosine of φ⁰, exactly like the standard evaluation restricted to these images.
    """
    labels = np.asarray(labels)
    similarities = conditional_similarities(method, maps, levels=levels, chunk_size=chunk_size)
    results = {}
    for n, similarity in similarities.items():
        scores = similarity.float().cpu().clone()
        scores.fill_diagonal_(float("-inf"))
        neighbours = torch.argsort(scores, dim=1, descending=True, stable=True)[:, :-1].numpy()
        results[n] = metric_functions.retrieval_metrics_from_neighbors(neighbours, labels, ks=ks)
    return results


class AttentionRecorder:
    """Records the attention weights (Eq. 1) of every cross-attention call with forward hooks.

    Use as a context manager around any computation of the method; ``maps`` holds one ``X × Y × T`` tensor
    (detached, on the CPU) per call, in call order. For :meth:`CrossAttention.conditional_embeddings` call
    n − 1 is level n, and entry [i, j, t] is the weight of location t of image i when conditioned on
    φⁿ⁻¹(j|i). Nothing is computed twice: the hooks read the weights the forward pass computes anyway.
    """

    def __init__(self, method: CrossAttention) -> None:
        self.method = method
        self.maps: list[torch.Tensor] = []
        self._handles: list = []

    def _hook(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        self.maps.append(output.detach().cpu())

    def __enter__(self) -> AttentionRecorder:
        self.maps = []
        self._handles = [
            m.register_forward_hook(self._hook) for m in self.method.modules() if isinstance(m, AttentionWeights)
        ]
        return self

    def __exit__(self, *exc_info) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


@torch.no_grad()
def recorded_attention(
    method: CrossAttention, images: torch.Tensor, *, num_levels: int | None = None
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The backbone feature maps of ``images`` (eval mode) and the attention weights of every level of their
    hierarchy, as :class:`AttentionRecorder` holds them (level n at index n − 1, each ``B × B × T``)."""
    was_training = method.training
    method.eval()
    with AttentionRecorder(method) as recorder:
        maps = method.backbone(images)
        method.conditional_embeddings(maps, num_levels=num_levels)
    method.train(was_training)
    return maps, recorder.maps


def attention_triples(labels: np.ndarray, count: int, *, seed: int = 0) -> list[tuple[int, int, int]]:
    """``count`` seeded triples (x, a, b): a from x's class, b from another class."""
    rng = np.random.default_rng(seed)
    labels = np.asarray(labels)
    triples = []
    for x in rng.permutation(len(labels)):
        same = np.flatnonzero((labels == labels[x]) & (np.arange(len(labels)) != x))
        other = np.flatnonzero(labels != labels[x])
        if len(same) and len(other):
            triples.append((int(x), int(rng.choice(same)), int(rng.choice(other))))
        if len(triples) == count:
            break
    return triples


def attention_statistics(method: CrossAttention, dataset, triples: Sequence[tuple[int, int, int]]) -> dict:
    """Per block n (from 1): the mean entropy of the attention over all pairs of each triple (nats; uniform is
    log T) and the mean total-variation distance between x's maps conditioned on a and on b, over triples
    (x, a, b) of ``dataset`` indices — the numbers behind the paper's "deeper blocks focus on fewer details"."""
    device = next(method.parameters()).device
    statistics: dict[int, dict[str, list[float]]] = {}
    for triple in triples:
        _, levels = recorded_attention(method, torch.stack([dataset[i][0] for i in triple]).to(device))
        for level, weights in enumerate(levels, start=1):
            entropy = -(weights * weights.clamp_min(1e-12).log()).sum(-1)
            values = statistics.setdefault(level, {"entropy": [], "TV(x|a, x|b)": []})
            values["entropy"].append(float(entropy.mean()))
            values["TV(x|a, x|b)"].append(0.5 * float((weights[0, 1] - weights[0, 2]).abs().sum()))
    return {level: {key: float(np.mean(v)) for key, v in values.items()} for level, values in statistics.items()}
