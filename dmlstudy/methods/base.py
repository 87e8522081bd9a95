"""The shape every method has, and the method registry.

A method is an ``nn.Module`` whose ``forward(images)`` returns the inference embedding (``B × d``,
L2-normalised) and whose ``loss(images, labels)`` returns ``(loss, parts)``: the scalar to minimise and a
dict of named parts (floats) for the logs. Extra test-time scoring (DIML re-ranking, cross-attention sⁿ)
lives in separately named functions of the method's own file. The training loop knows nothing else.

A method carries what it can show about a retrieval: :meth:`Method.explain` returns the numbers of its
explanation (:class:`HeatMaps` over the images, or :class:`TransportPlans` between their grids), which
:func:`dmlstudy.explanations.explanation_figure` draws by their kind, so that the explorer and the figures need no
branch per method.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch
from torch import nn

from dmlstudy.distributed import gather_with_grad, gather_without_grad
from dmlstudy.models import Backbone
from dmlstudy.search_space import SearchSpace

# Images per forward pass when a dataset is embedded for evaluation (TrainConfig.eval_batch_size's default and
# the embedding helpers'). On CPU a 64-image batch of the study's 64 px network embeds 1.6–2.2× faster than 256
# (the activations stay in cache) and gives bit-identical embeddings (benchmarks/README.md, "Evaluation").
EVAL_BATCH_SIZE = 64

POOLINGS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "avg": lambda feature_map: feature_map.mean(dim=(2, 3)),
    "max": lambda feature_map: feature_map.amax(dim=(2, 3)),
    "avgmax": lambda feature_map: feature_map.mean(dim=(2, 3)) + feature_map.amax(dim=(2, 3)),
}


def global_pool(feature_map: torch.Tensor, pooling: str = "avg") -> torch.Tensor:
    """``B × C × H × W`` → ``B × C`` by the named pooling (``avg``, ``max``, ``avgmax``)."""
    if pooling not in POOLINGS:
        raise KeyError(f"unknown pooling {pooling!r}; valid names: {', '.join(POOLINGS)}")
    return POOLINGS[pooling](feature_map)


@dataclass(frozen=True)
class HeatMaps:
    """An explanation drawn as heat maps over the explained images: ``panels[r]`` is row r of the figure, a list of
    ``(image, heat, title)``: ``image`` the position among the explained images (0 the query, 1… its retrievals),
    ``heat`` an h × w map over that image's feature grid, scaled to [0, 1]. ``rows`` names the image each row is
    about (its titles take that image's class colour); with ``plain`` each row starts with its image alone."""

    title: str
    label: str  # what the colour of the maps shows (the colour bar's label)
    panels: list[list[tuple[int, np.ndarray, str]]]
    rows: list[int]
    plain: bool = False


@dataclass(frozen=True)
class TransportPlans:
    """An explanation drawn as transport plans between the query's G × G grid cells and each retrieval's:
    ``plans[r]`` (G² × G², row-major cells) for retrieval r + 1, ``values[r]`` the similarities it rests on."""

    title: str
    grid: int
    plans: list[np.ndarray]
    values: list[str]


Explanation = HeatMaps | TransportPlans | str  # a string says why this configuration has nothing to show


class Method(nn.Module):
    """Base class of every method: a backbone plus whatever the method adds. A method that explains its
    retrievals overrides :meth:`explain` and names the kind it draws in ``explanation_kind``."""

    explanation_kind: ClassVar[type | None] = None  # HeatMaps or TransportPlans: what explain() returns, if anything

    def __init__(self, backbone: Backbone, *, embedding_dim: int = 128) -> None:
        super().__init__()
        self.backbone = backbone
        self.embedding_dim = embedding_dim

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Inference embedding, ``B × d``, L2-normalised."""
        raise NotImplementedError

    def loss(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """Training loss and its named parts."""
        raise NotImplementedError

    @staticmethod
    def gather(embeddings: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The global batch across distributed ranks (with gradients for ``embeddings``); the identity in one
        process. Pair-based losses call it before building their similarity matrix."""
        return gather_with_grad(embeddings), gather_without_grad(labels)

    def head_parameters(self) -> list[nn.Parameter]:
        """Parameters trained at ``head_lr`` (proxies, class centres); everything else uses ``lr``."""
        return []

    def explain(self, images: torch.Tensor) -> Explanation | None:
        """What the method shows about a query ``images[0]`` and its retrievals ``images[1:]`` (the inputs the
        network sees): heat maps or transport plans, a sentence when this configuration has nothing to show, or
        None for a method that explains nothing beyond its embedding (the default)."""
        return None

    def parameter_groups(
        self, *, lr: float, head_lr: float, weight_decay: float, backbone_lr: float | None = None
    ) -> list[dict]:
        """Optimizer parameter groups: the model at ``lr``, :meth:`head_parameters` at ``head_lr``; with
        ``backbone_lr``, the backbone's parameters form their own group ``"backbone"`` at that rate (fine-tuning
        a pretrained backbone: the layers the method adds learn faster than the features they start from)."""
        head = {id(parameter) for parameter in self.head_parameters()}
        backbone = {id(parameter) for parameter in self.backbone.parameters()} if backbone_lr is not None else set()
        body = [p for p in self.parameters() if p.requires_grad and id(p) not in head and id(p) not in backbone]
        groups = [{"params": body, "lr": lr, "weight_decay": weight_decay, "name": "model"}]
        if backbone:
            groups.append(
                {
                    "params": [p for p in self.backbone.parameters() if p.requires_grad],
                    "lr": backbone_lr,
                    "weight_decay": weight_decay,
                    "name": "backbone",
                }
            )
        if head:
            groups.append(
                {
                    "params": [p for p in self.head_parameters() if p.requires_grad],
                    "lr": head_lr,
                    "weight_decay": 0.0,
                    "name": "head",
                }
            )
        return groups


MethodBuilder = Callable[..., Method]
METHODS: dict[str, MethodBuilder] = {}
GROUPS = {  # what a method is in the study's tables
    "paper": "a method of one of the four papers (a main row of the comparison)",
    "classic": "a baseline of the papers' tables (MS, and the classic losses of pytorch-metric-learning)",
}


@dataclass(frozen=True)
class MethodInfo:
    """What the study shows about a registered method: the comparison row's label, its group (:data:`GROUPS`),
    the paper it comes from, a one-line description (the notebooks' row table and the CLI's help) and its search
    space (:mod:`dmlstudy.search_space`, declared in the method's file; read by :mod:`dmlstudy.study.tuning`).
    A row that trains nothing of its own but re-ranks another row's runs at test time names that row in
    ``reranks`` (DIML's re-ranking of the MS runs: :data:`dmlstudy.rows.EXTRA_ROWS`)."""

    name: str
    label: str
    group: str
    paper: str = ""
    summary: str = ""
    search_space: SearchSpace = field(default_factory=dict, compare=False)
    reranks: str = ""  # the row whose trained runs this row re-ranks at test time ("": runs of its own)


METHOD_INFO: dict[str, MethodInfo] = {}


def register_method(
    name: str,
    *,
    label: str = "",
    group: str = "classic",
    paper: str = "",
    summary: str = "",
    search_space: SearchSpace | None = None,
    **preset,
) -> Callable[[MethodBuilder], MethodBuilder]:
    """Decorator registering a method class (or builder) under ``name``, with optional preset keyword arguments.

    ``label`` is its row in the study's tables (default: ``name``), ``group`` one of :data:`GROUPS`, ``paper`` and
    ``summary`` (default: the first line of the builder's docstring) describe it in the notebooks and the CLI;
    ``search_space`` is what :mod:`dmlstudy.study.tuning` may change (keys: TrainConfig fields or
    ``method_kwargs.<name>``), each with its paper default.
    """
    if group not in GROUPS:
        raise ValueError(f"register_method({name!r}): group must be one of {sorted(GROUPS)}, got {group!r}")

    def decorator(builder: MethodBuilder) -> MethodBuilder:
        if name in METHODS:
            raise ValueError(f"method {name!r} registered twice")
        METHODS[name] = (lambda **kwargs: builder(**{**preset, **kwargs})) if preset else builder
        first_line = (inspect.getdoc(builder) or "").split("\n")[0]
        METHOD_INFO[name] = MethodInfo(
            name=name,
            label=label or name,
            group=group,
            paper=paper,
            summary=summary or first_line,
            search_space=dict(search_space or {}),
        )
        return builder

    return decorator


def list_methods(group: str | None = None) -> list[str]:
    """Registered method names, sorted; only those of ``group`` (:data:`GROUPS`) when given."""
    if group is not None and group not in GROUPS:
        raise ValueError(f"list_methods: group must be one of {sorted(GROUPS)}, got {group!r}")
    return sorted(name for name in METHODS if group is None or METHOD_INFO[name].group == group)


def method_info(name: str) -> MethodInfo:
    """The :class:`MethodInfo` of a registered method; unknown names list the valid ones."""
    if name not in METHOD_INFO:
        raise KeyError(f"unknown method {name!r}; valid names: {', '.join(list_methods())}")
    return METHOD_INFO[name]


VARIANT_SEARCH_SPACES: dict[
    str, SearchSpace
] = {}  # shared variants of a method (dmlstudy.rows.SHARED_VARIANTS) by row name


def register_variant_search_space(row: str, space: SearchSpace) -> None:
    """Declare the search space of a named variant of a registered method (a study row such as ``softmax``, DGCRL
    with parts switched off), next to that method's code."""
    if row in VARIANT_SEARCH_SPACES or row in METHODS:
        raise ValueError(f"search space of {row!r} declared twice (or {row!r} is a registered method)")
    VARIANT_SEARCH_SPACES[row] = dict(space)


def search_space(row: str) -> SearchSpace:
    """The search space of a registered method or of a declared variant row; unknown names list the valid ones."""
    if row in VARIANT_SEARCH_SPACES:
        return VARIANT_SEARCH_SPACES[row]
    if row not in METHOD_INFO:
        valid = ", ".join([*list_methods(), *sorted(VARIANT_SEARCH_SPACES)])
        raise KeyError(f"unknown method or row {row!r}; valid names: {valid}")
    return METHOD_INFO[row].search_space


def build_method(name: str, *, backbone: Backbone, embedding_dim: int = 128, num_classes: int, **kwargs) -> Method:
    """Build a registered method around ``backbone``; unknown names list the valid ones.

    ``num_classes`` is the number of training classes (proxy/classifier methods need it; others ignore it).
    """
    if name not in METHODS:
        raise KeyError(f"unknown method {name!r}; valid names: {', '.join(list_methods())}")
    return METHODS[name](backbone=backbone, embedding_dim=embedding_dim, num_classes=num_classes, **kwargs)
