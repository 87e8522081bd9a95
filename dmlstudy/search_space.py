"""Search spaces as data: what a method declares it may be tuned over.

A search space maps a *key* to a primitive. A key is a :class:`~dmlstudy.run.train.TrainConfig` field (``lr``,
``head_lr``, ``weight_decay``) or a dotted path into ``method_kwargs`` (``method_kwargs.alpha``,
``method_kwargs.loss_kwargs.margin`` for a Baseline loss). Every primitive carries ``paper``, the value the
study uses untuned (the paper's default; for the learning rates, the protocol's 4e-3 / 1e-2): it is the first
trial of every search, so a search can only improve on the published setting as measured on validation classes.

Spaces are declared next to each method's code (``register_method(..., search_space=...)``) and are plain
data: :mod:`dmlstudy.study.tuning` turns them into Optuna suggestions, and nothing here imports Optuna.

Decision: the learning rates span 1e-4 … 1e-2 (log) for a 64-px convnet trained from scratch with AdamW
(:data:`LR`); the heads (proxies, class centres) 1e-3 … 1e-1 (:data:`HEAD_LR`), since classifier layers
usually train 2–10× faster than the backbone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def _check_range(kind: str, low: float, high: float, paper: float) -> None:
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"{kind}: expected finite low < high, got low={low!r}, high={high!r}")
    if not low <= paper <= high:
        raise ValueError(f"{kind}: the paper value {paper!r} lies outside [{low!r}, {high!r}]")


@dataclass(frozen=True)
class LogFloat:
    """A float drawn on a log scale in ``[low, high]`` (both > 0): learning rates, scales, temperatures."""

    low: float
    high: float
    paper: float

    def __post_init__(self) -> None:
        if self.low <= 0:
            raise ValueError(f"LogFloat: low must be > 0, got {self.low!r}")
        _check_range("LogFloat", self.low, self.high, self.paper)


@dataclass(frozen=True)
class Float:
    """A float drawn uniformly in ``[low, high]``: margins, loss weights."""

    low: float
    high: float
    paper: float

    def __post_init__(self) -> None:
        _check_range("Float", self.low, self.high, self.paper)


@dataclass(frozen=True)
class Int:
    """An integer in ``[low, high]`` (both included): block counts, grid sizes."""

    low: int
    high: int
    paper: int

    def __post_init__(self) -> None:
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (self.low, self.high, self.paper)):
            raise TypeError(
                f"Int: low, high and paper must be integers, got {self.low!r}, {self.high!r}, {self.paper!r}"
            )
        _check_range("Int", self.low, self.high, self.paper)


@dataclass(frozen=True)
class Choice:
    """One of a few values (str, int, float or bool)."""

    choices: tuple
    paper: Any

    def __post_init__(self) -> None:
        if len(self.choices) < 2 or self.paper not in self.choices:
            raise ValueError(
                f"Choice: expected ≥ 2 choices including the paper value, got {self.choices!r}, {self.paper!r}"
            )


Parameter = LogFloat | Float | Int | Choice
SearchSpace = Mapping[str, Parameter]
METHOD_KWARGS = "method_kwargs"

LR = LogFloat(1e-4, 1e-2, paper=4e-3)  # backbone and embedding (TrainConfig.lr)
HEAD_LR = LogFloat(1e-3, 1e-1, paper=1e-2)  # proxies / class centres (TrainConfig.head_lr)


def paper_values(space: SearchSpace) -> dict[str, Any]:
    """The paper default of every key: the parameters of trial 0."""
    return {key: parameter.paper for key, parameter in space.items()}


def nested(values: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted keys → nested TrainConfig overrides: ``{"method_kwargs.loss_kwargs.margin": 0.3, "lr": 1e-3}`` →
    ``{"method_kwargs": {"loss_kwargs": {"margin": 0.3}}, "lr": 1e-3}``."""
    result: dict[str, Any] = {}
    for key, value in values.items():
        *parents, leaf = key.split(".")
        node = result
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return result


def flattened(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The inverse of :func:`nested`: nested overrides → dotted keys (``{"a": {"b": 1}}`` → ``{"a.b": 1}``)."""
    result: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        result.update(flattened(value, f"{name}.") if isinstance(value, Mapping) else {name: value})
    return result


def merged(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``overrides``, recursively for nested mappings (``method_kwargs`` and below)."""
    result = dict(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            result[key] = merged(result[key], value)
        else:
            result[key] = value
    return result


def without(space: SearchSpace, *keys: str) -> dict[str, Parameter]:
    """``space`` with ``keys`` removed (a variant that switches those parts off); unknown keys are an error."""
    missing = sorted(set(keys) - set(space))
    if missing:
        raise KeyError(f"without: {missing} are not keys of the space {sorted(space)}")
    return {key: parameter for key, parameter in space.items() if key not in keys}
