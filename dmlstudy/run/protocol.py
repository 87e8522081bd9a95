"""The shared protocol of every study notebook: same backbone, image size, embedding size, batch and
epochs for every method in a table, and mean ± std over seeds (the fair comparison none of the papers make).

A study notebook's config dataclass holds one :class:`ProtocolConfig` in its field ``protocol``, which the
notebook's ``parameters`` cell and a plan's entry give as one mapping (``protocol: *protocol`` in a plan: keys left
out keep the CI-sized defaults); :func:`resolve_run` (through
:meth:`ProtocolConfig.train_config` and :meth:`ProtocolConfig.grid`) turns it into the
:class:`~dmlstudy.run.train.TrainConfig` of one run — the one place where the plan's values, the regime, the tuned
values and a variant's own settings meet, each value's origin recorded in the run's ``config.yaml``. It sits
beside the settings it resolves (:mod:`dmlstudy.run.settings`), below its users: the study's grids of runs
(:mod:`dmlstudy.study.grids`), the tuning driver and the CLI.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dmlstudy.config import load_yaml
from dmlstudy.paths import project_file, project_root
from dmlstudy.run import identity
from dmlstudy.run.regimes import REGIMES, regime_overrides, run_prefix
from dmlstudy.run.settings import StudySettings
from dmlstudy.run.train import TrainConfig
from dmlstudy.run.tuned import list_rows, tuned_file, tuned_overrides
from dmlstudy.search_space import flattened, merged


@dataclass
class ProtocolConfig(StudySettings):
    """The protocol every study notebook shares, its parameter ``protocol``: the
    :class:`~dmlstudy.run.settings.StudySettings` every run of a table shares (declared there) and the study's own
    fields below. Defaults are CI-sized; plans inject the study's sizes. Each field's comment is its description."""

    study: str = "notebooks"  # runs go to <runs_root>/<study>/
    seeds: list = field(default_factory=lambda: [0])  # one run per seed; tables report mean ± std
    steps_per_epoch: int = 4
    tuned: str = ""  # tuned values (plans/tuned, `make tune`; a regime tuned on its own: <tuned>/<regime>/): learning rates and hyperparameters; empty: none
    tuned_dataset: str = ""  # read every dataset's tuned values from this dataset's file (a perturbation of a tuned dataset); empty: each its own
    progress: bool = False  # tqdm bars inside the notebook

    def protocol_text(self) -> str:
        """One line describing the protocol, printed above every table: sizes, learning rates, how each run's
        reported checkpoint was chosen."""
        sizes = "all" if not self.train_classes else f"first {self.train_classes}"
        rates = f"AdamW, tuned values of {self.tuned_folder()}" if self.tuned else f"AdamW lr {self.lr:g}"
        if self.tuned and self.tuned_dataset:
            rates += f" (those of {self.tuned_dataset} for every dataset)"
        untuned = self.untuned_rows()
        if untuned:
            listed = ", ".join(f"{row} ({', '.join(datasets)})" for row, datasets in untuned.items())
            rates += f"; untuned rows (lr {self.lr:g}, paper defaults): {listed}"
        if self.validation_folds:
            warmup = regime_overrides(self.regime, backbone=self.backbone, epochs=self.epochs).get("warmup_epochs")
            after = (
                " after the warm-up" if warmup else ""
            )  # checkpoint_selection.CheckpointSelection: warm-up epochs never count
            schedule = (
                f"up to {self.epochs} epochs × {self.steps_per_epoch or 'full'} steps"
                + (
                    f", stopped after {self.patience} evaluations{after} without a better validation R@1"
                    if self.patience
                    else ""
                )
                + f"; checkpoint: best validation R@1{after} on fold 0 of {self.validation_folds} class-disjoint "
                "folds of the training classes (the test classes read once, by that checkpoint)"
            )
        else:
            schedule = f"{self.epochs} epochs × {self.steps_per_epoch or 'full'} steps; checkpoint: the last epoch"
        return (
            f"backbone {self.backbone} ({REGIMES[self.regime].summary}), {self.image_size} px, d = {self.embedding_dim}, batch "
            f"{self.classes_per_batch}×{self.samples_per_class}, {rates}, {sizes} train classes, {schedule}, "
            f"paired seeds {self.seeds}"
        )

    def with_seeds(self, seeds: Iterable[int]) -> ProtocolConfig:
        """This protocol with other seeds (an ablation's, the classic baselines', a further look's)."""
        return dataclasses.replace(self, seeds=list(seeds))

    def tuned_folder(self) -> str:
        """The folder of ``<dataset>.yaml`` tuned values this protocol reads: ``<tuned>/<regime>`` when the
        regime was tuned on its own (``plans/tuned/pretrained``, written by ``make tune``), else ``tuned`` (the
        scratch regime's values, which another regime then reuses: said in every table's protocol line)."""
        own = Path(self.tuned) / self.regime
        resolved = own if own.is_absolute() else project_root() / own
        return str(own) if self.regime != "scratch" and resolved.is_dir() else self.tuned

    def tuned_path(self, dataset: str) -> Path:
        """The tuned-values file of ``dataset`` as this protocol names it (``plans/tuned/glyphs.yaml``): the
        ``tuned: <file>`` origin of the values read from it."""
        return tuned_file(self.tuned_folder(), self.tuned_dataset or dataset)

    def tuned_values(self, *, dataset: str, name: str, method: str) -> dict[str, Any]:
        """The TrainConfig overrides ``make tune`` chose for this run's row on ``dataset`` in this regime
        (:mod:`dmlstudy.run.tuned`, :meth:`tuned_folder`): the row named ``name`` (a method or a shared variant such
        as ``softmax``) when it was tuned, else the row of its method (an ablation variant starts from its
        method's tuned values); {} without ``tuned``.

        A row the file lacks gets {} too (it trains at the protocol's ``lr`` with its paper defaults), but not
        silently: an :class:`UntunedRowWarning` once per row and regime, naming the file and how to tune it,
        and the row listed in :meth:`protocol_text` (:meth:`untuned_rows`)."""
        if not self.tuned:
            return {}
        shown = self.tuned_path(dataset)
        path = shown if shown.is_absolute() else project_root() / shown
        if not path.is_file():
            raise FileNotFoundError(
                f"parameter 'tuned': {path} does not exist; run `make tune` to write it, or set tuned to '' "
                "to train with the paper defaults"
            )
        source = self.tuned_dataset or dataset
        values = tuned_overrides(path, source, name) or tuned_overrides(path, source, method)
        if not values:
            row = name if name in list_rows() else method  # an ablation variant's values are its method's
            UNTUNED_ROWS.setdefault(str(shown), set()).add(row)
            if (self.regime, str(path.parent), row) not in _WARNED:
                _WARNED.add((self.regime, str(path.parent), row))
                warnings.warn(
                    f"row {row!r} has no tuned values in {shown} ({self.regime} regime): its runs train at the "
                    f"protocol's lr {self.lr:g} with the paper defaults. Tune it with `make tune` (plans/tune.yaml "
                    "tunes the rows of plans/default.yaml's comparison) or `dmlstudy tune PLAN` with the row in the "
                    "plan's rows",
                    UntunedRowWarning,
                    stacklevel=2,
                )
        return values

    def untuned_rows(self) -> dict[str, list[str]]:
        """``{row: [datasets]}``: the rows resolved so far (:meth:`tuned_values`) that this protocol's tuned-values
        files lack, on its datasets."""
        if not self.tuned:
            return {}
        untuned: dict[str, list[str]] = {}
        for dataset in self.datasets:
            for row in sorted(UNTUNED_ROWS.get(str(self.tuned_path(dataset)), ())):
                untuned.setdefault(row, []).append(dataset)
        return untuned

    def train_config(
        self, *, dataset: str, method: str, seed: int, name: str, method_kwargs: dict | None = None, **overrides
    ) -> TrainConfig:
        """The :class:`TrainConfig` of one run of this protocol (:func:`resolve_run`; it carries the origins of
        its values into the run's ``config.yaml``); ``name`` + seed make its run name."""
        resolved = resolve_run(
            self, dataset=dataset, method=method, seed=seed, name=name, method_kwargs=method_kwargs, **overrides
        )
        return resolved.config

    def grid(
        self, variants: Mapping[str, Mapping[str, Any]], *, datasets: Iterable[str] | None = None
    ) -> list[tuple[str, TrainConfig]]:
        """``(variant, config)`` for every variant × dataset × seed; a variant maps to ``train_config`` kwargs
        (``method``, ``method_kwargs`` and any TrainConfig override)."""
        configs = []
        for dataset in datasets or self.datasets:
            for variant, spec in variants.items():
                for seed in self.seeds:
                    configs.append((variant, self.train_config(dataset=dataset, seed=seed, name=variant, **dict(spec))))
        return configs


PROTOCOL_BLOCK = "protocol"  # the top-level key of a study plan holding its protocol (``protocol: &protocol``)


def plan_protocol(plan: str | Path) -> dict[str, Any]:
    """The ``protocol:`` block of the study plan ``plan`` (``plans/default.yaml``): the mapping of
    :class:`ProtocolConfig` fields its study notebooks share, the one place a study's protocol is written. A
    tuning plan and the study's one-run notebook read it from there instead of repeating it."""
    path = project_file(plan)
    if not path.is_file():
        raise FileNotFoundError(f"study plan {plan} not found (expected a plan with a '{PROTOCOL_BLOCK}:' block)")
    plan_values = load_yaml(path.read_text())
    values = plan_values.get(PROTOCOL_BLOCK) if isinstance(plan_values, dict) else None
    if not isinstance(values, dict):
        raise ValueError(f"{plan}: expected a '{PROTOCOL_BLOCK}:' mapping of ProtocolConfig fields, got {values!r}")
    unknown = sorted(set(values) - set(ProtocolConfig.field_names()))
    if unknown:
        raise ValueError(
            f"{plan}: its {PROTOCOL_BLOCK} has unknown keys {unknown}; valid: {ProtocolConfig.field_names()}"
        )
    return values


class UntunedRowWarning(UserWarning):
    """A row of a tuned study has no tuned values in its tuned-values file."""


UNTUNED_ROWS: dict[str, set[str]] = {}  # tuned-values file (as a protocol names it) → rows resolved that it lacks
_WARNED: set[tuple[str, str, str]] = set()  # (regime, tuned-values folder, row) already warned about
DEFAULT, PROTOCOL, VARIANT = "default", "protocol", "variant"  # origins of a run's values (resolve_run)


@dataclass(frozen=True)
class ResolvedRun:
    """A run's configuration and where each of its values came from: ``origins`` maps every TrainConfig field
    and every dotted ``method_kwargs`` key to ``default``, ``protocol``, ``regime: <name>``, ``tuned: <file>`` or
    ``variant`` (:func:`resolve_run`)."""

    config: TrainConfig
    origins: dict[str, str]


def resolve_run(
    protocol: ProtocolConfig,
    *,
    dataset: str,
    method: str,
    seed: int,
    name: str,
    method_kwargs: Mapping[str, Any] | None = None,
    **overrides: Any,
) -> ResolvedRun:
    """The :class:`TrainConfig` of the run ``name`` (a variant: a method with its own ``method_kwargs`` and
    TrainConfig ``overrides``) on ``dataset`` with ``seed`` under ``protocol``, and each value's origin. Later
    layers win; mappings (``method_kwargs``) merge key by key (:func:`dmlstudy.search_space.merged`):

    1. ``default``: :class:`TrainConfig`'s defaults;
    2. ``protocol``: the fields :class:`ProtocolConfig` shares with TrainConfig by name (the plan's or the
       notebook's values), and the run's ``dataset``, ``seed``, ``run_name``
       (``<regime prefix><dataset>-<name>-seed<seed>``) and ``resume=True``; ``variant``: ``method`` and
       ``method_kwargs``;
    3. ``regime: <name>``: the regime's overrides (:func:`dmlstudy.run.regimes.regime_overrides`);
    4. ``tuned: <file>``: the row's tuned values (:meth:`ProtocolConfig.tuned_values`);
    5. ``variant``: ``overrides``, then ``method_kwargs`` once more, so that the variant's own keyword
       arguments win over tuned ones and its other keys keep their tuned values.

    The config carries the origins (:func:`dmlstudy.run.identity.with_origins`): its run writes them as comments of
    ``config.yaml``, outside the configuration and its identity hash."""
    method_kwargs = dict(method_kwargs or {})
    shared = set(ProtocolConfig.field_names()) & set(TrainConfig.field_names())
    run_values = {key: getattr(protocol, key) for key in sorted(shared)} | {
        "dataset": dataset,
        "seed": seed,
        "run_name": f"{run_prefix(protocol.regime)}{dataset}-{name}-seed{seed}",
        "resume": True,
    }
    variant = {"method": method, **({"method_kwargs": method_kwargs} if method_kwargs else {})}
    layers = [
        (PROTOCOL, run_values),
        (VARIANT, variant),
        (
            f"regime: {protocol.regime}",
            regime_overrides(protocol.regime, backbone=protocol.backbone, epochs=protocol.epochs),
        ),
        (f"tuned: {protocol.tuned_path(dataset)}", protocol.tuned_values(dataset=dataset, name=name, method=method)),
        (VARIANT, overrides),
        (VARIANT, {"method_kwargs": method_kwargs} if method_kwargs else {}),
    ]
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for origin, layer in layers:
        values = merged(values, layer)
        for key, value in layer.items():
            if not isinstance(value, Mapping):
                origins[key] = origin
            elif value:  # a mapping's keys get their own origins; the mapping, its latest contributor's
                origins |= {key: origin, **dict.fromkeys(flattened(value, f"{key}."), origin)}
    config = TrainConfig(**values)
    recorded = set(values) | set(flattened(values))  # a key whose mapping a later layer replaced is gone
    ordered = {}
    for field_name in TrainConfig.field_names():
        ordered[field_name] = origins.get(field_name, DEFAULT)
        ordered |= {
            key: origin for key, origin in origins.items() if key.startswith(f"{field_name}.") and key in recorded
        }
    return ResolvedRun(identity.with_origins(config, ordered), ordered)
