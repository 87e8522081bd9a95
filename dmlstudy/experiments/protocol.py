"""The shared protocol of every study notebook: same backbone, image size, embedding size, batch and
epochs for every method in a table, and mean ± std over seeds (the fair comparison none of the papers make).

A notebook's config dataclass subclasses :class:`ProtocolConfig`; :meth:`ProtocolConfig.train_config` turns
it into the :class:`~dmlstudy.train.TrainConfig` of one run, and :func:`run_grid` trains a list of them,
reusing complete runs (``resume=True``), so re-executing a notebook costs nothing for finished runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from dmlstudy import distributed, engine
from dmlstudy.config import TypedConfig
from dmlstudy.engine import GridRunError, available_cores  # noqa: F401 - re-exported: callers import them from here
from dmlstudy.regimes import REGIMES, regime, regime_overrides, run_prefix
from dmlstudy.search_space import merged
from dmlstudy.study import summarize
from dmlstudy.train import AUTOCAST_MODES, RunResult, TrainConfig, best_epoch_censored, is_complete, load_datasets, run


@dataclass
class ProtocolConfig(TypedConfig):
    """Fields shared by every study notebook. Defaults are CI-sized; plans inject the study's sizes."""

    study: str = "notebooks"  # runs go to <runs_root>/<study>/
    runs_root: str = ""  # default: <project>/runs
    data_root: str = ""  # default: <project>/data
    datasets: list = field(default_factory=lambda: ["synbirds"])  # embedded sets: synbirds, glyphs
    seeds: list = field(default_factory=lambda: [0])  # one run per seed; tables report mean ± std
    backbone: str = "dml_convnet"  # timm model name, the same for every method of a table
    regime: str = "scratch"  # scratch (random init) or pretrained (weights/, frozen BN, lower backbone lr, warm-up): dmlstudy/regimes.py
    image_size: int = 64  # pixels
    embedding_dim: int = 128  # d of every method
    classes_per_batch: int = 16  # P
    samples_per_class: int = 4  # M
    epochs: int = 2  # training epochs per run
    steps_per_epoch: int = 4  # 0: a full pass over the training set per epoch
    train_classes: int = 16  # 0: all training classes
    test_classes: int = 16  # 0: all test classes
    lr: float = 4e-3  # backbone/embedding learning rate
    eval_every: int = 1  # evaluate every n epochs (and after the last): the resolution of learning curves
    validation_folds: int = 0  # n ≥ 2: the training classes in n class-disjoint folds; fold 0 chooses each run's checkpoint and the test classes are read once
    patience: int = 0  # with validation folds: a run stops after this many evaluations without a better validation R@1 (epochs is the cap)
    autocast: str = "auto"  # precision of every run: auto (bf16 on CUDA, float32 on CPU), bf16 or off
    tuned: str = ""  # tuned values (plans/tuned, `make tune`; a regime tuned on its own: <tuned>/<regime>/): learning rates and hyperparameters; "" = defaults
    progress: bool = False  # tqdm bars inside the notebook
    workers: int = 1  # runs trained at once, each in its own process with cores // workers threads

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_choice("autocast", AUTOCAST_MODES)
        regime(self.regime, backbone=self.backbone)  # an unknown regime or a backbone its weights do not fit

    def protocol_text(self) -> str:
        """One line describing the protocol, printed above every table: sizes, learning rates, how each run's
        reported checkpoint was chosen."""
        sizes = "all" if not self.train_classes else f"first {self.train_classes}"
        rates = f"AdamW, tuned values of {self.tuned_folder()}" if self.tuned else f"AdamW lr {self.lr:g}"
        if self.validation_folds:
            warmup = regime_overrides(self.regime, backbone=self.backbone, epochs=self.epochs).get("warmup_epochs")
            after = " after the warm-up" if warmup else ""  # train.CheckpointSelection: warm-up epochs never count
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

    def tuned_folder(self) -> str:
        """The folder of ``<dataset>.yaml`` tuned values this protocol reads: ``<tuned>/<regime>`` when the
        regime was tuned on its own (``plans/tuned/pretrained``, written by ``make tune``), else ``tuned`` (the
        scratch regime's values, which another regime then reuses: said in every table's protocol line)."""
        from dmlstudy.paths import project_root

        own = Path(self.tuned) / self.regime
        resolved = own if own.is_absolute() else project_root() / own
        return str(own) if self.regime != "scratch" and resolved.is_dir() else self.tuned

    def tuned_values(self, *, dataset: str, name: str, method: str) -> dict[str, Any]:
        """The TrainConfig overrides ``make tune`` chose for this run's row on ``dataset`` in this regime
        (:mod:`dmlstudy.tuning`, :meth:`tuned_folder`): the row named ``name`` (a method or a shared variant such
        as ``softmax``) when it was tuned, else the row of its method (an ablation variant starts from its
        method's tuned values); {} without ``tuned``."""
        if not self.tuned:
            return {}
        from dmlstudy.paths import project_root
        from dmlstudy.tuning import tuned_file, tuned_overrides

        tuned = self.tuned_folder()
        folder = Path(tuned) if Path(tuned).is_absolute() else project_root() / tuned
        path = tuned_file(folder, dataset)
        if not path.is_file():
            raise FileNotFoundError(
                f"parameter 'tuned': {path} does not exist; run `make tune` to write it, or set tuned to '' "
                "to train with the paper defaults"
            )
        return tuned_overrides(path, dataset, name) or tuned_overrides(path, dataset, method)

    def train_config(
        self, *, dataset: str, method: str, seed: int, name: str, method_kwargs: dict | None = None, **overrides
    ) -> TrainConfig:
        """The :class:`TrainConfig` of one run of this protocol; ``name`` + seed make its run name."""
        values = dict(
            study=self.study,
            runs_root=self.runs_root,
            data_root=self.data_root,
            dataset=dataset,
            method=method,
            method_kwargs=dict(method_kwargs or {}),
            backbone=self.backbone,
            image_size=self.image_size,
            embedding_dim=self.embedding_dim,
            classes_per_batch=self.classes_per_batch,
            samples_per_class=self.samples_per_class,
            epochs=self.epochs,
            steps_per_epoch=self.steps_per_epoch,
            train_classes=self.train_classes,
            test_classes=self.test_classes,
            lr=self.lr,
            eval_every=self.eval_every,
            validation_folds=self.validation_folds,
            patience=self.patience,
            autocast=self.autocast,
            seed=seed,
            run_name=f"{run_prefix(self.regime)}{dataset}-{name}-seed{seed}",
            resume=True,
            progress=self.progress,
            **regime_overrides(self.regime, backbone=self.backbone, epochs=self.epochs),
        )
        values = merged(merged(values, self.tuned_values(dataset=dataset, name=name, method=method)), overrides)
        values["method_kwargs"] = merged(values["method_kwargs"], dict(method_kwargs or {}))  # the variant's own win
        return TrainConfig(**values)

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


def call_in_processes(
    function: Callable[..., Any], arguments: list[tuple], *, workers: int, what: str = "evaluations"
) -> None:
    """``function(*args)`` for every tuple of ``arguments`` as tasks of the engine (:mod:`dmlstudy.engine`):
    ``workers`` local worker processes with ``cores // workers`` threads each, or the cluster of
    ``DMLSTUDY_SCHEDULER``. For per-run evaluations that write their own cache files (DIML re-ranking runs one
    thread busy, so two processes halve its wall time on 2 cores). ``function`` must be importable by the
    workers (a module-level function). Every call runs; failures are reported together at the end."""
    client = engine.get_client(workers)
    submissions = [
        (
            f"{getattr(function, '__name__', 'call')}{tuple(args)!r:.120}",
            engine.call_task,
            (function, *args),
            engine.call_key(function, tuple(args), index),
        )
        for index, args in enumerate(arguments)
    ]
    engine.run_tasks(client, submissions, what=what)


def train_on_engine(configs: list[TrainConfig], *, workers: int, progress: bool = True) -> None:
    """Train the unfinished ``configs`` as idempotent engine tasks keyed by run folder
    (:func:`dmlstudy.engine.train_task`): complete runs are skipped, interrupted ones resume from their last
    checkpoint, and a failed run does not stop the others (all failures are reported together at the end).
    Float sums may round differently with fewer threads, so a run's metrics can differ in the last digits
    from a ``workers=1`` run of the same seed."""
    pending = list({config.run_dir: config for config in configs if not is_complete(config)}.values())
    if not pending:
        return
    for dataset in sorted({config.dataset for config in pending}):  # generate embedded data once, not per worker
        load_datasets(next(config for config in pending if config.dataset == dataset))
    submissions = [
        (f"run {config.run_dir}", engine.train_task, (engine.task_values(config),), engine.run_task_key(config))
        for config in pending
    ]
    engine.run_tasks(engine.get_client(workers), submissions, what="runs", progress=progress)


def run_grid(configs: list[tuple[str, TrainConfig]], *, workers: int = 1) -> list[tuple[str, RunResult]]:
    """Train every config (complete runs are loaded, not retrained) and load the results in order.

    With ``workers > 1``, or when ``DMLSTUDY_SCHEDULER`` names a cluster, the unfinished runs are trained first
    as tasks of the engine (:func:`train_on_engine`); with ``workers = 1`` and no scheduler (and under
    torchrun) they train here, one after the other, in this process."""
    train_grid(configs, workers=workers)
    return [(variant, run(config)) for variant, config in configs]


def train_grid(configs: list[tuple[str, TrainConfig]], *, workers: int = 1) -> None:
    """The training half of :func:`run_grid`, nothing loaded: with ``workers > 1`` or a scheduler, the
    unfinished runs trained as engine tasks (all at once, however many grids ``configs`` joins); otherwise
    nothing, and :func:`run_grid` trains them one by one when it loads them."""
    if workers < 1:
        raise ValueError(f"workers must be ≥ 1, got {workers}")
    if (workers > 1 or engine.scheduler_address()) and not distributed.launched_by_torchrun():
        train_on_engine([config for _, config in configs], workers=workers)


def results_frame(results: list[tuple[str, RunResult]]) -> pd.DataFrame:
    """One row per run: variant, dataset, seed, metrics, the method's keyword arguments as JSON, and
    ``best_epoch_censored`` (:func:`dmlstudy.train.best_epoch_censored`: the cap cut its epochs-to-best short)."""
    rows = []
    for variant, result in results:
        config = result.config
        rows.append(
            {
                "variant": variant,
                "dataset": config.dataset,
                "method": config.method,
                "seed": config.seed,
                "method_kwargs": json.dumps(config.method_kwargs, sort_keys=True),
                **result.metrics,
                "best_epoch_censored": best_epoch_censored(result.history, config.patience, config.warmup_epochs),
            }
        )
    return pd.DataFrame(rows)


def mean_std_table(
    frame: pd.DataFrame, *, metrics: list[str], by: tuple[str, ...] = ("dataset", "variant")
) -> pd.DataFrame:
    """Mean ± std over seeds per (dataset, variant), in the order the variants were run."""
    return summarize(frame, by=list(by), metrics=metrics)


def with_paper_column(
    table: pd.DataFrame, paper: Mapping[str, Any], *, key: str = "variant", label: str = "paper"
) -> pd.DataFrame:
    """Add the paper's reported number per variant (for orientation only: other data, backbone and budget)."""
    table = table.copy()
    table[label] = [paper.get(value, "–") for value in table[key]]
    return table
