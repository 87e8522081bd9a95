"""Grids of runs: the configs a study's notebook resolves (:meth:`~dmlstudy.run.protocol.ProtocolConfig.grid`),
trained as tasks of the engine (:mod:`dmlstudy.study.engine`) or one by one, complete runs loaded, never retrained
(``resume=True``), so re-executing a notebook costs nothing for finished runs; and their results as one frame with
a row per run and as mean ± std tables."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pandas as pd

from dmlstudy import distributed
from dmlstudy.records import run_numerics
from dmlstudy.run import identity
from dmlstudy.run.checkpoint_selection import best_epoch_censored
from dmlstudy.run.data import load_datasets
from dmlstudy.run.train import RunResult, TrainConfig, is_complete, run
from dmlstudy.study import engine
from dmlstudy.study.engine import GridRunError, available_cores  # noqa: F401 - re-exported: callers import them from here
from dmlstudy.study.report import summarize


def call_in_processes(
    function: Callable[..., Any], arguments: list[tuple], *, workers: int, what: str = "evaluations"
) -> None:
    """``function(*args)`` for every tuple of ``arguments`` as tasks of the engine (:mod:`dmlstudy.study.engine`):
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
    (:func:`dmlstudy.study.engine.train_task`): complete runs are skipped, interrupted ones resume from their last
    checkpoint, and a failed run does not stop the others (all failures are reported together at the end).
    Float sums may round differently with fewer threads, so a run's metrics can differ in the last digits
    from a ``workers=1`` run of the same seed."""
    pending = list({config.run_dir: config for config in configs if not is_complete(config)}.values())
    if not pending:
        return
    for dataset in sorted({config.dataset for config in pending}):  # generate embedded data once, not per worker
        load_datasets(next(config for config in pending if config.dataset == dataset))
    submissions = [
        (
            f"run {config.run_dir}",
            engine.train_task,
            (engine.task_values(config), identity.origins_of(config)),
            engine.run_task_key(config),
        )
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
    """One row per run: variant, dataset, seed, run folder, its numerics tag (:func:`~dmlstudy.records.run_numerics`),
    metrics, the method's keyword arguments as JSON, and
    ``best_epoch_censored`` (:func:`dmlstudy.run.checkpoint_selection.best_epoch_censored`: the cap cut its epochs-to-best short)."""
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
                "run_dir": str(config.run_dir),
                "numerics": run_numerics(config.run_dir),
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
