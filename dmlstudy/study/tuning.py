"""Per-row hyperparameter tuning with Optuna on validation classes, on the Dask engine.

One driver (this process) asks Optuna for trials (``study.ask()``), submits each trial's run as an engine task
(:func:`dmlstudy.study.engine.train_task`), reports every evaluated epoch to the pruner as the run writes it, and
tells the result when the task ends (``study.tell()``). Only the driver touches the storage, so Optuna's
journal file (the default, ``<runs_root>/<study>/tuning/<name>.journal``) is safe on one machine and on a
cluster's shared filesystem; an RDB URL (``storage="postgresql://…"``) is the alternative.

``dmlstudy tune plans/tune.yaml`` (:func:`run_tune_plan`, configured by :class:`TuneConfig`) tunes every
*row* of the study — a registered method or a shared variant (``softmax``: DGCRL with parts switched off) —
on every dataset, and writes the chosen values to ``plans/tuned/<dataset>.yaml`` (:mod:`dmlstudy.run.tuned`: the
file's format, written here and read by the study). A plan's rows are names, ``registry`` (every tunable row)
or a study plan (``plans/default.yaml``: the rows its comparison shows, :func:`plan_rows`), so a method added to
the study's comparison is tuned without editing the tuning plan.

Decisions:

* **Search spaces** are data declared next to each method's code (:mod:`dmlstudy.search_space`,
  :func:`dmlstudy.methods.search_space`); :func:`suggest` turns one into Optuna suggestions. Every row gets the
  same sampler (TPE, seeded with ``sampler_seed``, ``startup_trials`` random trials first) and the same number
  of trials; trial 0 is the row's paper defaults (enqueued when the study is created).
* **Regime**: every trial starts and trains as the plan's ``regime`` says (:mod:`dmlstudy.run.regimes`). ``make
  tune`` tunes every row in both of the study's regimes with the same budget: ``plans/tune.yaml`` from scratch
  (``plans/tuned/<dataset>.yaml``), ``plans/tune_pretrained.yaml`` pretrained (``plans/tuned/pretrained/``), and
  each regime of the study reads its own (:meth:`dmlstudy.run.protocol.ProtocolConfig.tuned_folder`).
* **Objective**: the trial run's best validation R@1 (``val_R@1`` of ``metrics.json``): the training classes
  are split into class-disjoint folds, one is held out as validation classes, and the trial never loads the
  test split (``final_test=False``). Each trial trains until validation R@1 has not improved for ``patience``
  evaluations, up to ``epochs``.
* **Pruning**: the median rule by default (:data:`PRUNERS`): a trial whose validation R@1 at an evaluated epoch
  is below the median of earlier trials at that epoch stops (Optuna's rule compares the trial's best value so
  far). A pretrained trial's warm-up epochs are evaluated but not reported: the warm-up state is neither
  chosen nor counted by the run (:class:`dmlstudy.run.checkpoint_selection.CheckpointSelection`), so it does not shield a trial
  from pruning either (2026-11-26; replaying the pretrained searches' journals under both rules,
  ``benchmarks/pruner_replay.py``, finds no decision that changes, so ``plans/tuned/pretrained/`` stands).
  Chosen over successive halving because the budget
  is ~10 trials per row: halving needs several trials per rung before it promotes anyone, and with early
  stopping the trials have no common length to halve; the median rule needs only ``startup`` finished trials
  and compares at equal epochs. ``halving`` (Optuna's SuccessiveHalvingPruner) and ``none`` are available.
* **Trials are runs**: a trial's run folder is named by a digest of its overrides (``<name>-<digest>``), so a
  trial with the same parameters reuses (resumes, or just loads) the same run.
* **Intermediate values** reach the driver through the run's ``history.csv`` (written after every epoch on the
  shared runs root), which the driver reads every ``poll_seconds``: the task needs no channel back to the
  driver, and the storage is written by the driver alone. A pruned trial is told ``PRUNED`` at once, its
  task cancelled, and the run stops at its next training step with its last epoch checkpoint
  (:func:`dmlstudy.study.engine.stop_tasks`); an interrupted driver stops its running trials the same way.
* **Resuming**: re-running :func:`tune` with the same name continues the study: finished trials (complete,
  pruned, failed) count towards ``n_trials`` and are never repeated; a trial left running by an interrupted
  driver is marked failed and its parameters are queued again, so it resumes its run folder from the last
  checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import pandas as pd

from dmlstudy import search_space as search
from dmlstudy.config import load_yaml
from dmlstudy.methods import method_info, search_space
from dmlstudy.paths import project_file, project_root
from dmlstudy.rows import BASELINE, SHARED_VARIANTS, trained_row
from dmlstudy.run import identity
from dmlstudy.run.data import load_datasets
from dmlstudy.run.protocol import PROTOCOL, VARIANT, ProtocolConfig, plan_protocol, resolve_run
from dmlstudy.run.regimes import REGIMES
from dmlstudy.run.settings import StudySettings
from dmlstudy.run.train import TrainConfig
from dmlstudy.run.tuned import OBJECTIVE, RowResult, list_rows, tuned_file, write_tuned
from dmlstudy.study import engine
from dmlstudy.study.plan import load_plan

SearchSpace = Callable[[optuna.trial.BaseTrial], dict[str, Any]]
INTERRUPTED = "interrupted_trials"  # study user attribute: numbers of trials failed because the driver stopped
FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)


def journal_path(base: TrainConfig, name: str) -> Path:
    return base.run_dir.parent / "tuning" / f"{name}.journal"


def open_storage(storage: str, base: TrainConfig, name: str):
    """``""``: a journal file under the study's runs folder; otherwise an RDB URL (``sqlite:///…``,
    ``postgresql://…``) or a path ending in ``.journal``."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    if storage and "://" in storage:
        return storage
    path = Path(storage) if storage else journal_path(base, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(str(path)))


TRIAL = "trial"  # origin of the values a trial draws (its row's spec and search-space values) and of its run name


def trial_config(base: TrainConfig, overrides: dict[str, Any], name: str) -> TrainConfig:
    """The run of a trial: ``base`` with the overrides, named by their digest (same parameters, same run). It
    carries ``base``'s origins (:meth:`TuneConfig.base_config`), each overridden value's origin ``trial``."""
    unknown = sorted(set(overrides) - set(TrainConfig.field_names()))
    if unknown:
        raise KeyError(
            f"search space returned unknown TrainConfig fields {unknown}; valid: {TrainConfig.field_names()}"
        )
    digest = hashlib.sha1(json.dumps(overrides, sort_keys=True, default=str).encode()).hexdigest()[:10]
    config = TrainConfig(
        **{**base.to_dict(), **overrides, "run_name": f"{name}-{digest}", "resume": True, "progress": False}
    )
    replaced = tuple(f"{key}." for key in overrides)  # a mapping the trial gives replaces the base's
    origins = {key: origin for key, origin in identity.origins_of(base).items() if not key.startswith(replaced)}
    origins |= dict.fromkeys(
        [*overrides, *search.flattened(overrides.get("method_kwargs") or {}, "method_kwargs.")], TRIAL
    )
    return identity.with_origins(config, origins | {"run_name": TRIAL})


def _recover_interrupted(study: optuna.Study) -> None:
    """Trials still RUNNING when a driver opens the study were left by an interrupted driver (there is only
    one): fail them and queue their parameters again."""
    stale = [trial for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))]
    if not stale:
        return
    study.set_user_attr(INTERRUPTED, sorted({*study.user_attrs.get(INTERRUPTED, []), *(t.number for t in stale)}))
    for trial in stale:
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
        study.enqueue_trial(trial.params)


def finished_trials(study: optuna.Study) -> int:
    """Trials that count towards ``n_trials``: complete, pruned or failed, except those failed by an interruption."""
    interrupted = set(study.user_attrs.get(INTERRUPTED, []))
    return sum(1 for t in study.get_trials(deepcopy=False, states=FINISHED) if t.number not in interrupted)


def _epoch_values(run_dir: Path, objective: str, warmup_epochs: int = 0) -> list[tuple[int, float]]:
    """``(epoch, value)`` of every evaluated epoch after the first ``warmup_epochs`` in a run's history so far
    (none while it is being written): what the pruner is told."""
    try:
        history = pd.read_csv(run_dir / "history.csv")
    except (FileNotFoundError, pd.errors.EmptyDataError, pd.errors.ParserError):
        return []
    if objective not in history:
        return []
    return [
        (int(epoch), float(value))
        for epoch, value in zip(history["epoch"], history[objective])
        if epoch > warmup_epochs and not math.isnan(value)
    ]


def _objective_value(metrics: dict[str, float], objective: str) -> float:
    if objective not in metrics:
        raise KeyError(
            f"the trial's metrics.json has no {objective!r} (a run without validation_folds has no val_R@1); "
            f"keys: {sorted(metrics)}"
        )
    return float(metrics[objective])


def tune(
    base: TrainConfig,
    space: SearchSpace,
    *,
    name: str,
    n_trials: int,
    workers: int = 1,
    storage: str = "",
    objective: str = OBJECTIVE,
    direction: str = "maximize",
    sampler: optuna.samplers.BaseSampler | None = None,
    pruner: optuna.pruners.BasePruner | None = None,
    poll_seconds: float = 1.0,
    on_trial: Callable[[optuna.Study, optuna.trial.FrozenTrial], None] | None = None,
    enqueue: list[dict[str, Any]] | None = None,
) -> optuna.Study:
    """Run (or continue) the Optuna study ``name`` until ``n_trials`` trials have finished, ``workers`` trials
    at a time on the engine (see the module docstring). ``on_trial(study, trial)`` is called after each tell;
    ``enqueue`` lists parameter sets tried first when the study is new (the paper defaults)."""
    if n_trials < 1 or workers < 1:
        raise ValueError(f"tune: n_trials and workers must be ≥ 1, got {n_trials} and {workers}")
    study = optuna.create_study(
        study_name=name,
        storage=open_storage(storage, base, name),
        direction=direction,
        sampler=sampler,
        pruner=pruner,
        load_if_exists=True,
    )
    _recover_interrupted(study)
    if not study.trials:
        for params in enqueue or []:
            study.enqueue_trial(params)
    load_datasets(base)  # generate an embedded dataset here once, not in every worker at the same time
    client = engine.get_client(workers)
    slots = max(1, sum(info.get("nthreads", 1) for info in client.scheduler_info()["workers"].values()))
    in_flight: dict[Any, tuple[optuna.trial.Trial, TrainConfig]] = {}
    reported: dict[int, int] = {}  # trial number -> last epoch reported

    def tell(trial, state, value=None):
        frozen = study.tell(trial, value, state=state) if value is not None else study.tell(trial, state=state)
        if on_trial is not None:
            on_trial(study, frozen)

    try:
        while True:
            while finished_trials(study) + len(in_flight) < n_trials and len(in_flight) < slots:
                trial = study.ask()
                try:
                    config = trial_config(base, space(trial), name)
                except Exception:  # a bad search space: the trial fails, the error reaches the caller
                    study.tell(trial, state=optuna.trial.TrialState.FAIL)
                    raise
                trial.set_user_attr("run_dir", str(config.run_dir))
                future = client.submit(
                    engine.train_task,
                    engine.task_values(config),
                    identity.origins_of(config),
                    key=engine.run_task_key(config),
                    pure=False,
                )
                in_flight[future] = (trial, config)
            if not in_flight:
                return study
            done = {future for future in in_flight if future.done()}
            if not done:
                time.sleep(poll_seconds)
            for future in list(in_flight):
                trial, config = in_flight[future]
                if future in done:
                    del in_flight[future]
                    if future.status == "finished":
                        tell(trial, optuna.trial.TrialState.COMPLETE, _objective_value(future.result(), objective))
                    else:
                        trial.set_user_attr("error", engine.failure_line(future))
                        tell(trial, optuna.trial.TrialState.FAIL)
                    future.release()
                    continue
                for epoch, value in _epoch_values(config.run_dir, objective, config.warmup_epochs):
                    if epoch > reported.get(trial.number, 0):
                        trial.report(value, epoch)
                        reported[trial.number] = epoch
                if reported.get(trial.number) and trial.should_prune():
                    del in_flight[future]
                    engine.stop_tasks(client, [future])
                    tell(trial, optuna.trial.TrialState.PRUNED)
    finally:
        engine.stop_tasks(
            client, list(in_flight)
        )  # interrupted: its trials stay RUNNING in storage, recovered next time


# ----------------------------------------------------------------------------------------------
# Rows and their declared search spaces
# ----------------------------------------------------------------------------------------------
def row_spec(row: str) -> dict[str, Any]:
    """The TrainConfig overrides that make ``row``: ``{"method": row}`` for a registered method, or a shared
    variant's spec (:data:`dmlstudy.rows.SHARED_VARIANTS`, e.g. ``softmax``)."""
    if row in SHARED_VARIANTS:
        return dict(SHARED_VARIANTS[row])
    method_info(row)  # unknown names list the valid ones
    return {"method": row}


REGISTRY_ROWS = "registry"  # a tuning plan's rows: every tunable row (list_rows)
COMPARISON_ROWS = ("methods", "classic_methods")  # the parameters of a study plan's comparison entry that list rows


def comparison_rows(plan: str | Path) -> list[str]:
    """The rows a study plan's comparison shows: every entry's ``methods`` and ``classic_methods``
    (:class:`dmlstudy.experiments.compare.CompareStudy`), in order; a re-ranked row stands for the row whose runs
    it re-ranks (:func:`~dmlstudy.rows.trained_row`: ``diml_rerank`` for ``ms``)."""
    rows = [
        trained_row(name)
        for entry in load_plan(project_file(plan))
        for key in COMPARISON_ROWS
        for name in entry.parameters.get(key) or []
    ]
    if not rows:
        raise ValueError(f"{plan}: no entry of this study plan lists rows ({' or '.join(COMPARISON_ROWS)})")
    return rows


def plan_rows(rows: list | str) -> list[str]:
    """A tuning plan's ``rows`` as row names, in order, each once: a row name stays; ``registry`` is every
    tunable row (:func:`list_rows`); a study plan (``plans/default.yaml``) is the rows its comparison shows
    (:func:`comparison_rows`)."""
    names: list[str] = []
    for item in [rows] if isinstance(rows, str) else rows:
        if item == REGISTRY_ROWS:
            names += list_rows()
        elif isinstance(item, str) and item.endswith((".yaml", ".yml")):
            names += comparison_rows(item)
        else:
            names.append(item)
    return list(dict.fromkeys(names))


def suggest(trial: optuna.trial.BaseTrial, space: search.SearchSpace) -> dict[str, Any]:
    """One value per key of a declared space, drawn by ``trial`` (the Optuna parameter name is the key)."""
    values: dict[str, Any] = {}
    for key, parameter in space.items():
        if isinstance(parameter, search.LogFloat):
            values[key] = trial.suggest_float(key, parameter.low, parameter.high, log=True)
        elif isinstance(parameter, search.Float):
            values[key] = trial.suggest_float(key, parameter.low, parameter.high)
        elif isinstance(parameter, search.Int):
            values[key] = trial.suggest_int(key, parameter.low, parameter.high)
        elif isinstance(parameter, search.Choice):
            values[key] = trial.suggest_categorical(key, list(parameter.choices))
        else:
            raise TypeError(f"search space key {key!r}: unknown primitive {parameter!r}")
    return values


def row_sampler(row: str) -> SearchSpace:
    """``row``'s declared space as a function ``trial -> TrainConfig overrides`` (the row's spec included)."""
    space, spec = search_space(row), row_spec(row)
    return lambda trial: search.merged(spec, search.nested(suggest(trial, space)))


# ----------------------------------------------------------------------------------------------
# dmlstudy tune PLAN
# ----------------------------------------------------------------------------------------------
PRUNERS: dict[str, Callable[[TuneConfig], optuna.pruners.BasePruner]] = {
    "median": lambda config: optuna.pruners.MedianPruner(
        n_startup_trials=config.startup_trials, n_warmup_steps=config.prune_after
    ),
    "halving": lambda config: optuna.pruners.SuccessiveHalvingPruner(min_resource=max(1, config.prune_after)),
    "none": lambda config: optuna.pruners.NopPruner(),
}


@dataclass
class TuneConfig(StudySettings):
    """A tuning plan (``plans/tune.yaml``): which rows, on which datasets, how many trials, and the trial runs'
    protocol (the study's sizes; validation classes only). The protocol is the study's, read from the study plan
    named in ``protocol`` (its ``protocol:`` block, :func:`load_tune_config`); a value the tuning plan gives
    itself overrides it. ``origins`` says where each value came from.

    The protocol's fields are :class:`~dmlstudy.run.settings.StudySettings`' (declared there); a plan without
    ``protocol`` starts from full sizes (every training class, full passes, 4 folds, patience 2, a 12-epoch cap).
    Trials never read the test classes; ``test_classes`` enters their run identity only."""

    epochs: int = 12
    steps_per_epoch: int = 0
    train_classes: int = 0
    test_classes: int = 0
    validation_folds: int = 4
    patience: int = 2
    workers: int = 2
    name: str = "tune"  # runs go to <runs_root>/<name>/, journals to <runs_root>/<name>/tuning/
    rows: list = field(
        default_factory=lambda: [BASELINE]
    )  # row names (dmlstudy list methods; softmax), `registry` (every row) or a study plan (plans/default.yaml: its comparison's rows)
    protocol: str = ""  # a study plan (plans/default.yaml) whose `protocol:` block gives every shared value this plan leaves out; empty: none
    trials: int = 10  # trials per (dataset, row), the paper defaults first; the same for every row
    startup_trials: int = 3  # random trials before TPE models the results (and before the median pruner acts)
    sampler_seed: int = 0  # seed of the TPE sampler (the same for every row)
    pruner: str = "median"  # median, halving or none
    prune_after: int = 2  # no pruning before this epoch has been evaluated
    out_dir: str = "plans/tuned"  # <out_dir>/<dataset>.yaml: the chosen values (rows tuned here replaced)
    figure: str = "figures/tuning_best_so_far.png"  # best-so-far validation R@1 per trial; empty: none
    storage: str = ""  # empty: Optuna journal files under <runs_root>/<name>/tuning/; or an RDB URL
    validation_fold: int = 0  # the fold held out as validation classes
    seed: int = 0  # the trial runs' seed (model init, batches)

    def __post_init__(self) -> None:
        self.origins: dict[str, str] = dict.fromkeys(self.field_names(), DEFAULT)  # load_tune_config names them
        if isinstance(self.rows, (str, list)):
            self.rows = plan_rows(self.rows)  # `rows: registry` or `rows: plans/default.yaml` → row names
        super().__post_init__()
        self.check_choice("pruner", sorted(PRUNERS))
        if self.validation_folds < 2:
            raise ValueError(
                f"parameter 'validation_folds' must be ≥ 2: trials are scored on validation classes, got {self.validation_folds}"
            )
        if min(self.trials, self.workers) < 1 or self.startup_trials < 0 or self.prune_after < 0:
            raise ValueError("parameters 'trials' and 'workers' must be ≥ 1, 'startup_trials' and 'prune_after' ≥ 0")
        unknown = sorted(set(self.rows) - set(list_rows()))
        if unknown:
            raise ValueError(f"parameter 'rows': unknown rows {unknown}; valid: {list_rows()}")
        without_lr = [row for row in self.rows if "lr" not in search_space(row)]
        if without_lr:
            raise ValueError(
                f"parameter 'rows': {without_lr} declare no 'lr' in their search space; every row tunes its learning "
                "rate: register_method(..., search_space={'lr': dmlstudy.search_space.LR, ...}) (docs/adding_a_method.md)"
            )

    def protocol_config(self, dataset: str) -> ProtocolConfig:
        """The protocol of this plan's trials on ``dataset``: its shared values (:data:`PROTOCOL_FIELDS`), its
        study (``name``) and seed, untuned (a trial draws its own values)."""
        shared = {key: getattr(self, key) for key in PROTOCOL_FIELDS if key != "datasets"}
        return ProtocolConfig(
            **shared, study=self.name, datasets=[dataset], seeds=[self.seed], tuned="", progress=False
        )

    def base_config(self, dataset: str) -> TrainConfig:
        """The TrainConfig of a trial on ``dataset`` before the row's overrides, resolved as a study run is
        (:func:`~dmlstudy.run.protocol.resolve_run`: protocol, then regime), on the validation classes
        only. It carries each value's origin: a value of this plan names the tuning plan or the study plan it
        was read from (``origins``)."""
        resolved = resolve_run(
            self.protocol_config(dataset),
            dataset=dataset,
            method=TrainConfig.method,
            seed=self.seed,
            name="base",
            validation_fold=self.validation_fold,
            final_test=False,
            progress=False,
        )
        own = {TRAIN_NAMES.get(key, key): origin for key, origin in self.origins.items()} | {
            "dataset": self.origins["datasets"]
        }
        origins = {
            key: own[key] if origin in (PROTOCOL, VARIANT) and key in own else origin
            for key, origin in resolved.origins.items()
        }
        return identity.with_origins(resolved.config, origins)


DEFAULT = "default"  # origin of a TuneConfig value: the dataclass's default
TRAIN_NAMES = {"name": "study"}  # a TuneConfig field → the TrainConfig field it sets, where the names differ
PROTOCOL_FIELDS = tuple(
    StudySettings.field_names()
)  # the values a tuning plan shares with its study plan's protocol (read from its `protocol:` block)


def load_tune_config(path: str | Path, **overrides: Any) -> TuneConfig:
    """Read a tuning plan (a mapping of :class:`TuneConfig` fields); unknown keys name the file. With
    ``protocol: <study plan>``, each of :data:`PROTOCOL_FIELDS` the tuning plan leaves out is that plan's
    ``protocol:`` value (:func:`~dmlstudy.run.protocol.plan_protocol`). The config's ``origins`` name,
    per field, ``plan: <this file>``, ``protocol: <study plan>``, ``override`` (``overrides``) or ``default``."""
    path = Path(path)
    values = load_yaml(path.read_text()) or {}
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a mapping of TuneConfig fields, got {type(values).__name__}")
    unknown = sorted(set(values) - set(TuneConfig.field_names()))
    if unknown:
        raise ValueError(f"{path}: unknown keys {unknown}; valid: {TuneConfig.field_names()}")
    given = {k: v for k, v in overrides.items() if v is not None}
    origins = dict.fromkeys(values, f"plan: {path_label(path)}") | dict.fromkeys(given, "override")
    study_plan = given.get("protocol", values.get("protocol"))
    if study_plan:
        try:
            protocol = plan_protocol(study_plan)
        except (FileNotFoundError, ValueError) as error:
            raise ValueError(f"{path}: parameter 'protocol': {error}") from None
        inherited = {key: protocol[key] for key in PROTOCOL_FIELDS if key in protocol and key not in values}
        values = inherited | values
        origins = dict.fromkeys(inherited, f"protocol: {study_plan}") | origins
    try:
        config = TuneConfig(**{**values, **given})
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path}: {error}") from None
    config.origins |= origins
    return config


def path_label(path: Path) -> str:
    """``path`` relative to the project when it is inside it (``plans/tune.yaml``), else as given."""
    try:
        return str(path.resolve().relative_to(project_root().resolve()))
    except ValueError:
        return str(path)


def trial_values(study: optuna.Study) -> list[float | None]:
    """Per trial number, the objective of a complete trial and None for a pruned, failed or running one."""
    return [t.value if t.state == optuna.trial.TrialState.COMPLETE else None for t in study.trials]


def tune_row(config: TuneConfig, dataset: str, row: str, *, poll_seconds: float = 1.0) -> RowResult:
    """Tune ``row`` on ``dataset`` (resuming its journal), trial 0 at the paper defaults."""
    started = time.perf_counter()
    space = search_space(row)
    study = tune(
        config.base_config(dataset),
        row_sampler(row),
        name=f"{dataset}-{row}",
        n_trials=config.trials,
        workers=config.workers,
        storage=config.storage,
        sampler=optuna.samplers.TPESampler(seed=config.sampler_seed, n_startup_trials=config.startup_trials),
        pruner=PRUNERS[config.pruner](config),
        poll_seconds=poll_seconds,
        enqueue=[search.paper_values(space)],
    )
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if not complete:
        errors = {t.user_attrs.get("error", "") for t in study.trials} - {""}
        raise RuntimeError(f"tuning {row} on {dataset}: no trial completed; errors: {sorted(errors) or 'none'}")
    best = max(complete, key=lambda t: t.value)
    return RowResult(
        dataset=dataset,
        row=row,
        overrides=search.nested(best.params),
        value=float(best.value),
        trials=finished_trials(study),
        values=trial_values(study),
        seconds=time.perf_counter() - started,
    )


def run_tune_plan(path: str | Path, *, command: str = "", poll_seconds: float = 1.0, **overrides: Any) -> list[Path]:
    """``dmlstudy tune PLAN``: tune every row on every dataset, write ``<out_dir>/<dataset>.yaml`` and the
    best-so-far figure; returns the files written."""
    config = load_tune_config(path, **overrides)
    started = time.perf_counter()
    results = [
        tune_row(config, dataset, row, poll_seconds=poll_seconds) for dataset in config.datasets for row in config.rows
    ]
    header = {
        "command": command or f"dmlstudy tune {path}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine_description(config.workers),
        "regime": f"{config.regime} ({REGIMES[config.regime].summary})",
        "duration": f"{time.perf_counter() - started:.0f} s (this invocation; resumed trials are not retrained)",
    }
    written = [
        write_tuned(
            tuned_file(config.out_dir, dataset),
            dataset,
            [r for r in results if r.dataset == dataset],
            header,
            regime=config.regime,
        )
        for dataset in config.datasets
    ]
    if config.figure:
        figure = plot_best_so_far({(r.dataset, r.row): r.values for r in results})
        Path(config.figure).parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(config.figure, dpi=120, bbox_inches="tight")
        written.append(Path(config.figure))
    return written


def machine_description(workers: int) -> str:
    import platform

    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{platform.machine()}, {engine.available_cores()} cores, {gpu}, {workers} workers"


# ----------------------------------------------------------------------------------------------
# Best so far
# ----------------------------------------------------------------------------------------------
def best_so_far(values: list[float | None]) -> list[float]:
    """Running maximum of the complete trials' values (NaN until the first complete trial)."""
    best, curve = -math.inf, []
    for value in values:
        best = max(best, value) if value is not None else best
        curve.append(best if best > -math.inf else math.nan)
    return curve


def trials_to_plateau(values: list[float | None], tolerance: float) -> int:
    """The fewest trials whose best-so-far value is within ``tolerance`` of the best of all ``values`` (0 when no
    trial completed): how many trials of this budget the row needed (``benchmarks/tune_plateau.yaml`` states the
    rule that uses it)."""
    curve = best_so_far(values)
    final = curve[-1] if curve else math.nan
    if math.isnan(final):
        return 0
    return next(count for count, best in enumerate(curve, start=1) if best >= final - tolerance)


def plot_best_so_far(values: dict[tuple[str, str], list[float | None]]):
    """Best-so-far validation R@1 against trial number, one line per row in its method's colour and marker
    (:func:`dmlstudy.plots.method_style`), one panel per dataset on its own scale, one legend for all panels
    outside them (inside, it covered the lowest curves): a flat end says the row's search has plateaued."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from dmlstudy.plots import legend_outside, method_style
    from dmlstudy.rows import method_label

    datasets = list(dict.fromkeys(dataset for dataset, _ in values))
    figure, axes = plt.subplots(1, len(datasets), figsize=(5 * len(datasets), 3.6), squeeze=False, sharey=False)
    for axis, dataset in zip(axes[0], datasets):
        for (name, row), row_values in values.items():
            if name == dataset:
                curve = best_so_far(row_values)
                style = method_style(row)
                axis.plot(
                    range(len(curve)),
                    curve,
                    drawstyle="steps-post",
                    marker=style.marker,
                    markersize=4,
                    label=method_label(row),
                    color=style.colour,
                )
        axis.set(title=dataset, xlabel="trial (0: paper defaults)", ylabel="best validation R@1 so far")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.grid(alpha=0.3)
    figure.tight_layout()
    legend_outside(figure)
    return figure
