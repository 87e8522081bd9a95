"""Notebook 95 (exploring by hand): a retrieval explorer over the finished runs of a study.

Choose a dataset, a method, one of its runs (found under ``<runs_root>/<study>/``) and a query image; see the
query's top-K retrievals framed blue (same class) or vermillion (another class) and, where the method has one,
its explanation: what the trained method itself shows about the query and its first retrievals
(:meth:`dmlstudy.methods.Method.explain`: DIML's transport plans, cross-attention's attention maps, CRT's prototype
codes), drawn by its kind (:func:`dmlstudy.explanations.explanation_figure`); a method that explains nothing says so.

The first view shows a method with an explanation (:func:`first_method`: the explorer's own DIML first, then
the others that explain, where the study has their runs; else ``ms``): the explanation is what the explorer adds
to the tables.

Decisions: a run is listed when its folder holds ``metrics.json``, ``config.yaml``, ``embeddings.npz`` and
``checkpoint.pt`` (a complete run); it is loaded from those records with the public training functions
(never retrained). Retrievals rank the stored test embeddings all against all (the query excluded), as the
run's evaluation did; datasets evaluated query → gallery (In-Shop) are not shown.

Which study it shows (:func:`choose_study`): the one named by ``study``; by default (``study = ""``) the
published study (``default``, what ``make study`` trains) when it has complete runs, else the explorer's own
study ``notebook-95_explore``, where one CI-sized DIML run (:data:`FALLBACK_PROTOCOL`) is trained first when it
is empty (a fresh clone), so the notebook always has something to show, explanation included: its own transport
plans between the query's and each retrieval's grid cells. A named study without runs is an error
listing the studies that have some; nothing is ever trained into a study the explorer does not own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from dmlstudy import plots
from dmlstudy.config import TypedConfig, load_yaml
from dmlstudy.experiments.kit import explained_retrievals, top_k_retrievals
from dmlstudy.methods import METHODS, Method, TransportPlans
from dmlstudy.paths import PUBLISHED_STUDY
from dmlstudy.paths import runs_root as default_runs_root
from dmlstudy.rows import BASELINE
from dmlstudy.run.compute import resolve_device
from dmlstudy.run.data import load_datasets
from dmlstudy.run.identity import superseded_runs
from dmlstudy.run.model import build_model
from dmlstudy.run.protocol import ProtocolConfig
from dmlstudy.run.train import RunResult, TrainConfig, load_reported_state
from dmlstudy.study.grids import run_grid

RUN_RECORDS = ("metrics.json", "config.yaml", "embeddings.npz", "checkpoint.pt")
MAX_EXPLAINED = 3  # retrievals explained (the figures grow with each)


OWN_STUDY = "notebook-95_explore"  # the explorer's own study: its fallback run, when no other study has runs
FALLBACK_EXPLANATION = TransportPlans  # a fresh clone's one run: the first registered method explaining by these
FALLBACK_PROTOCOL = {"datasets": ["synbirds"], "seeds": [0]}  # else ProtocolConfig's CI-sized defaults


@dataclass
class ExploreConfig(TypedConfig):
    """Parameters of ``notebooks/95_explore.ipynb``: which study's runs to explore and what is shown first.
    Only what exploring needs; the fallback run's protocol is fixed (:data:`FALLBACK_PROTOCOL`)."""

    study: str = ""  # "": the published study ('default') when it has runs, else the explorer's own fallback run
    runs_root: str = ""  # default: <project>/runs
    data_root: str = ""  # default: <project>/data
    dataset: str = ""  # dataset shown first ("": the first with runs)
    method: str = ""  # method shown first ("": the first with an explanation, diml, cross_attention, crt, else ms)
    run: str = ""  # run folder shown first ("": the lowest seed of that dataset and method)
    query: int = 0  # query image shown first (index into the run's test set)
    top_k: int = 5  # retrievals shown
    explain: bool = True  # draw the method's explanation where it has one (diml, cross_attention, crt)
    save_figures: bool = False  # also save the first view as <study's figures>/explore_*.png

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.top_k < 1:
            raise ValueError(f"parameter 'top_k' must be ≥ 1, got {self.top_k}")
        if self.query < 0:
            raise ValueError(f"parameter 'query' must be ≥ 0, got {self.query}")


# ----------------------------------------------------------------------------------------------
# Finding and loading runs
# ----------------------------------------------------------------------------------------------
RUN_COLUMNS = ["dataset", "method", "run", "seed", "R@1", "method_kwargs", "path"]


def find_runs(study: str, *, runs_root: str | Path = "") -> pd.DataFrame:
    """Every complete run folder ``<runs_root>/<study>/<run>/`` (all of :data:`RUN_RECORDS` present): one row
    with its dataset, method, folder name, seed, test R@1, method kwargs (JSON) and path, sorted by dataset and
    method, the protocol's runs of the method with its defaults (``<dataset>-<method>-seed<s>``) first, then by
    seed and name. Folders without the records (plan entries, unfinished runs) are skipped, and so are runs a
    newer configuration of the same run replaced (:func:`dmlstudy.run.identity.superseded_runs`)."""
    folder = Path(runs_root or default_runs_root()) / study
    superseded = superseded_runs(folder)
    rows = []
    for metrics_file in sorted(folder.glob("*/metrics.json")):
        run_dir = metrics_file.parent
        if run_dir.name in superseded or not all((run_dir / name).is_file() for name in RUN_RECORDS):
            continue
        config = load_yaml((run_dir / "config.yaml").read_text()) or {}
        metrics = json.loads(metrics_file.read_text())
        rows.append(
            {
                "dataset": config.get("dataset", ""),
                "method": config.get("method", ""),
                "run": run_dir.name,
                "seed": int(config.get("seed", 0)),
                "R@1": float(metrics.get("R@1", float("nan"))),
                "method_kwargs": json.dumps(config.get("method_kwargs") or {}, sort_keys=True),
                "path": str(run_dir),
            }
        )
    frame = pd.DataFrame(rows, columns=RUN_COLUMNS)
    plain = [
        bool(
            re.fullmatch(f"{re.escape(d)}-{re.escape(m)}-seed\\d+(-[0-9a-f]{{8}})?", r)
        )  # the config hash suffix (dmlstudy.run.identity)
        for d, m, r in zip(frame["dataset"], frame["method"], frame["run"])
    ]
    frame["_variant"] = ~np.asarray(plain, dtype=bool)  # the protocol's runs of the method with its defaults first
    return (
        frame.sort_values(["dataset", "method", "_variant", "seed", "run"], kind="stable")
        .drop(columns="_variant")
        .reset_index(drop=True)
    )


def runs_table(runs: pd.DataFrame) -> pd.DataFrame:
    """What the notebook lists of the runs: dataset, method, run folder, seed and test R@1 in percent, one
    decimal, as the explorer's menus show it."""
    shown = runs[["dataset", "method", "run", "seed"]].copy()
    shown["R@1 (%)"] = (100 * runs["R@1"]).round(1)
    return shown.reset_index(drop=True)


def studies_with_runs(*, runs_root: str | Path = "") -> list[str]:
    """The studies under ``runs_root`` holding at least one complete run, sorted."""
    root = Path(runs_root or default_runs_root())
    folders = sorted(path for path in root.iterdir() if path.is_dir()) if root.is_dir() else []
    return [folder.name for folder in folders if not find_runs(folder.name, runs_root=root).empty]


def choose_study(config: ExploreConfig) -> tuple[str, str]:
    """``(study, why)``: the config's ``study`` when named, else the published study when it has complete runs,
    else :data:`OWN_STUDY`; ``why`` is the sentence the notebook prints about the choice."""
    if config.study:
        return config.study, f"study {config.study!r}, as the parameter 'study' names"
    if not find_runs(PUBLISHED_STUDY, runs_root=config.runs_root).empty:
        return PUBLISHED_STUDY, f"the published study {PUBLISHED_STUDY!r} (the runs of `make study`)"
    return OWN_STUDY, (
        f"the explorer's own study {OWN_STUDY!r}: the published study {PUBLISHED_STUDY!r} has no runs here yet "
        "(`make study` trains them)"
    )


def ensure_runs(config: ExploreConfig) -> tuple[str, pd.DataFrame]:
    """The study to explore (:func:`choose_study`) and its :func:`find_runs`. An empty :data:`OWN_STUDY` first
    gets one CI-sized run of :func:`fallback_method` (:data:`FALLBACK_PROTOCOL`; resumable like every run); any
    other study without runs raises, naming the studies that have some."""
    study, _ = choose_study(config)
    runs = find_runs(study, runs_root=config.runs_root)
    if runs.empty and study == OWN_STUDY:
        protocol = ProtocolConfig(
            study=study, runs_root=config.runs_root, data_root=config.data_root, **FALLBACK_PROTOCOL
        )
        method = fallback_method()
        run_grid(protocol.grid({method: {"method": method}}))
        runs = find_runs(study, runs_root=config.runs_root)
    if runs.empty:
        raise ValueError(
            f"parameter 'study': no complete runs in study {study!r} under "
            f"{Path(config.runs_root or default_runs_root())}; studies with runs: "
            f"{studies_with_runs(runs_root=config.runs_root) or 'none'}"
        )
    return study, runs


def study_header(config: ExploreConfig, runs: pd.DataFrame) -> str:
    """What the notebook prints first: which study it shows and why, its run count, and how to switch."""
    study, why = choose_study(config)
    others = [name for name in studies_with_runs(runs_root=config.runs_root) if name != study]
    return (
        f"Exploring {why}: {len(runs)} complete run{'' if len(runs) == 1 else 's'}.\n"
        f"To explore another study, set study = '<name>' in the parameters cell (papermill: -p study <name>); "
        f"other studies with runs here: {', '.join(others) or 'none'}."
    )


@dataclass
class LoadedRun:
    """A run restored from its records: the trained method, its test set (test transforms) and the stored
    test embeddings and labels."""

    result: RunResult
    dataset: Any
    embeddings: np.ndarray
    labels: np.ndarray

    @property
    def method_name(self) -> str:
        return self.result.config.method


def load_run(run_dir: str | Path, *, data_root: str = "") -> LoadedRun:
    """Restore a complete run from its folder (config, checkpoint, embeddings) without training.

    The stored config is read with ``runs_root``/``study``/``run_name`` pointing at the folder where it was
    found; ``data_root`` (when given) replaces the stored one.
    """
    run_dir = Path(run_dir)
    missing = [name for name in RUN_RECORDS if not (run_dir / name).is_file()]
    if missing:
        raise FileNotFoundError(f"load_run: {run_dir} is not a complete run folder; missing {missing}")
    config = TrainConfig.of_run_folder(run_dir, data_root=data_root)
    datasets = load_datasets(config)
    if datasets.get("gallery") is not None:
        raise ValueError(
            f"load_run: {config.dataset} is evaluated query → gallery; the explorer shows all-vs-all test sets only"
        )
    device = resolve_device(config.device)
    method = build_model(config, datasets["train"].num_classes).to(device)
    load_reported_state(method, run_dir, device).eval()
    with np.load(run_dir / "embeddings.npz") as stored_arrays:
        arrays = dict(stored_arrays)
    history = pd.read_csv(run_dir / "history.csv") if (run_dir / "history.csv").is_file() else pd.DataFrame()
    result = RunResult(config, run_dir, json.loads((run_dir / "metrics.json").read_text()), history, method, arrays)
    if len(arrays["embeddings"]) != len(datasets["query"]):
        raise ValueError(
            f"load_run: {run_dir} stores {len(arrays['embeddings'])} test embeddings but its test set has {len(datasets['query'])} images "
            "(was the dataset regenerated?)"
        )
    return LoadedRun(result, datasets["query"], arrays["embeddings"], np.asarray(arrays["labels"]))


# ----------------------------------------------------------------------------------------------
# What is drawn
# ----------------------------------------------------------------------------------------------
def retrieval_figure(loaded: LoadedRun, query: int, *, top_k: int) -> plt.Figure:
    """The query and its top-``top_k`` retrievals, green = same class, red = another (plots.retrieval_grid)."""
    ranking = top_k_retrievals(loaded.embeddings, query, top_k=top_k)
    figure = plots.retrieval_grid(
        loaded.dataset, loaded.embeddings, loaded.labels, queries=[query], top_k=len(ranking), ranking=ranking[None]
    )
    hits = int(np.sum(loaded.labels[ranking] == loaded.labels[query]))
    figure.suptitle(
        f"{loaded.result.run_dir.name}: query {query} (class {loaded.labels[query]}), {hits}/{len(ranking)} retrievals of its class",
        fontsize=9,
        y=1.0 + 0.3 / figure.get_figheight(),
    )  # above the column titles
    return figure


def explanation_kind(method: str) -> type | None:
    """The kind of explanation the registered method ``method`` draws (its ``explanation_kind``: heat maps or
    transport plans), None when it explains nothing. A name registered with a preset (each loss of the baseline,
    ``gcrl``) is a builder, not a class: it explains nothing."""
    builder = METHODS.get(method)
    return builder.explanation_kind if isinstance(builder, type) and issubclass(builder, Method) else None


def explains(method: str) -> bool:
    """Whether the registered method ``method`` explains its retrievals (:func:`explanation_kind`)."""
    return explanation_kind(method) is not None


def fallback_method() -> str:
    """The method of a fresh clone's one run: the first registered method whose explanation is
    :data:`FALLBACK_EXPLANATION` (DIML's transport plans between the query's grid cells and a retrieval's, the
    explanation that relates two images)."""
    return next(name for name in METHODS if explanation_kind(name) is FALLBACK_EXPLANATION)


def first_method(methods: Sequence[str]) -> str:
    """The method shown first among ``methods``: one that explains its retrievals (:func:`explains`), the
    explorer's own :func:`fallback_method` before the others, else the baseline, else the first."""
    fallback = fallback_method()
    explaining = sorted((name for name in methods if explains(name)), key=lambda name: name != fallback)
    return explaining[0] if explaining else (BASELINE if BASELINE in methods else methods[0])


def explanation(loaded: LoadedRun, query: int, *, top_k: int) -> plt.Figure | str:
    """The method's explanation of the query and its first ``min(top_k, 3)`` retrievals
    (:func:`~dmlstudy.experiments.kit.explained_retrievals`), or a sentence saying there is none."""
    return explained_retrievals(loaded.result, loaded.dataset, [query], retrievals=min(top_k, MAX_EXPLAINED))


class Explorer:
    """The runs of a study and what the explorer draws for them; loaded runs are cached by folder."""

    def __init__(self, runs: pd.DataFrame, *, data_root: str = "") -> None:
        if runs.empty:
            raise ValueError("Explorer: no complete runs to explore (train one first, e.g. with ensure_runs)")
        self.runs, self.data_root = runs.reset_index(drop=True), data_root
        self._loaded: dict[str, LoadedRun] = {}

    def load(self, run_dir: str | Path) -> LoadedRun:
        key = str(run_dir)
        if key not in self._loaded:
            self._loaded[key] = load_run(key, data_root=self.data_root)
        return self._loaded[key]

    def datasets(self) -> list[str]:
        return list(dict.fromkeys(self.runs["dataset"]))

    def methods(self, dataset: str) -> list[str]:
        return list(dict.fromkeys(self.runs.loc[self.runs["dataset"] == dataset, "method"]))

    def run_options(self, dataset: str, method: str) -> list[tuple[str, str]]:
        """``(label, path)`` of the runs of ``method`` on ``dataset``: the label gives the folder and its R@1."""
        rows = self.runs[(self.runs["dataset"] == dataset) & (self.runs["method"] == method)]
        return [
            (f"{run} (R@1 {100 * recall:.1f} %)", path)
            for run, recall, path in zip(rows["run"], rows["R@1"], rows["path"])
        ]

    def selection(self, config: ExploreConfig) -> dict[str, Any]:
        """The first view: the config's dataset / method / run where given (an unknown one raises, listing what
        exists), else the defaults described on :class:`ExploreConfig`; the query clipped to the test set."""
        runs = self.runs
        if config.run:
            chosen = runs[runs["run"] == config.run]
            if chosen.empty:
                raise ValueError(f"parameter 'run': no complete run {config.run!r}; found {runs['run'].tolist()}")
            row = chosen.iloc[0]
        else:
            datasets = self.datasets()
            if config.dataset and config.dataset not in datasets:
                raise ValueError(f"parameter 'dataset': no runs on {config.dataset!r}; found {datasets}")
            dataset = config.dataset or datasets[0]
            methods = self.methods(dataset)
            if config.method and config.method not in methods:
                raise ValueError(f"parameter 'method': no runs of {config.method!r} on {dataset!r}; found {methods}")
            method = config.method or first_method(methods)
            row = runs[(runs["dataset"] == dataset) & (runs["method"] == method)].iloc[0]
        loaded = self.load(row["path"])
        return {
            "dataset": row["dataset"],
            "method": row["method"],
            "run_dir": row["path"],
            "query": int(min(config.query, len(loaded.embeddings) - 1)),
            "top_k": config.top_k,
            "explain": config.explain,
        }

    def render(self, run_dir: str | Path, *, query: int, top_k: int, explain: bool = True) -> list[plt.Figure | str]:
        """What the explorer shows for one choice: a header line, the retrieval figure, and the explanation
        (a figure, or a sentence when the method has none)."""
        loaded = self.load(run_dir)
        metrics = loaded.result.metrics
        header = (
            f"**{loaded.result.run_dir.name}** — method `{loaded.method_name}` on {loaded.result.config.dataset}, "
            f"seed {loaded.result.config.seed}: R@1 {100 * metrics.get('R@1', float('nan')):.1f} %, "
            f"MAP@R {100 * metrics.get('MAP@R', float('nan')):.1f} % over {len(loaded.embeddings)} test images"
        )
        items: list[plt.Figure | str] = [header, retrieval_figure(loaded, query, top_k=top_k)]
        if explain:
            items.append(explanation(loaded, query, top_k=top_k))
        return items


def show_items(items: Sequence[plt.Figure | str]) -> None:
    """Display what :meth:`Explorer.render` returned (sentences as Markdown) and close the figures, so the
    inline backend does not draw them a second time."""
    from IPython.display import Markdown, display

    for item in items:
        if isinstance(item, str):
            display(Markdown(item))
        else:
            display(item)
            plt.close(item)


def save_items(items: Sequence[plt.Figure | str], *, study: str, prefix: str = "explore") -> list[Path]:
    """Save the figures among ``items`` as ``<prefix>_retrievals.png`` and ``<prefix>_explanation.png`` in the
    study's figures folder."""
    figures = [item for item in items if not isinstance(item, str)]
    return [
        plots.save_figure(figure, f"{prefix}_{name}", study=study)
        for figure, name in zip(figures, ("retrievals", "explanation"))
    ]


# ----------------------------------------------------------------------------------------------
# The widgets
# ----------------------------------------------------------------------------------------------
class ExplorerUI:
    """Dropdowns (dataset → method → run), a query slider, a top-K slider and an explanation switch over an
    output area; :meth:`update` redraws the output for the current choice (called on every change, and once
    by the notebook so the first view exists without a live kernel)."""

    def __init__(self, explorer: Explorer, selection: Mapping[str, Any]) -> None:
        import ipywidgets as widgets

        self.explorer = explorer
        self._syncing = True
        dataset, method = selection["dataset"], selection["method"]
        style = {"description_width": "70px"}
        self.dataset = widgets.Dropdown(options=explorer.datasets(), value=dataset, description="dataset", style=style)
        self.method = widgets.Dropdown(
            options=explorer.methods(dataset), value=method, description="method", style=style
        )
        self.run = widgets.Dropdown(
            options=explorer.run_options(dataset, method),
            value=selection["run_dir"],
            description="run",
            style=style,
            layout=widgets.Layout(width="480px"),
        )
        size = len(explorer.load(selection["run_dir"]).embeddings)
        self.query = widgets.IntSlider(
            value=selection["query"], min=0, max=size - 1, description="query", continuous_update=False, style=style
        )
        self.top_k = widgets.IntSlider(
            value=selection["top_k"], min=1, max=16, description="top K", continuous_update=False, style=style
        )
        self.explain = widgets.Checkbox(value=selection["explain"], description="explanation")
        self.output = widgets.Output()
        self.box = widgets.VBox(
            [
                widgets.HBox([self.dataset, self.method]),
                self.run,
                widgets.HBox([self.query, self.top_k, self.explain]),
                self.output,
            ]
        )
        self.dataset.observe(self._on_dataset, names="value")
        self.method.observe(self._on_method, names="value")
        self.run.observe(self._on_run, names="value")
        for control in (self.query, self.top_k, self.explain):
            control.observe(lambda change: self.update(), names="value")
        self._syncing = False

    def _set_runs(self) -> None:
        self.run.options = self.explorer.run_options(self.dataset.value, self.method.value)
        self.run.value = self.run.options[0][1]
        self.query.max = len(self.explorer.load(self.run.value).embeddings) - 1

    def _on_dataset(self, change) -> None:
        if self._syncing:
            return
        self._syncing = True
        try:
            methods = self.explorer.methods(self.dataset.value)
            self.method.options = methods
            self.method.value = first_method(methods)
            self._set_runs()
        finally:
            self._syncing = False
        self.update()

    def _on_method(self, change) -> None:
        if self._syncing:
            return
        self._syncing = True
        try:
            self._set_runs()
        finally:
            self._syncing = False
        self.update()

    def _on_run(self, change) -> None:
        if self._syncing:
            return
        self._syncing = True
        try:
            self.query.max = len(self.explorer.load(self.run.value).embeddings) - 1
        finally:
            self._syncing = False
        self.update()

    def update(self) -> None:
        """Redraw the output area for the current choice.

        The output widget's ``outputs`` are replaced directly (``append_display_data``), not captured with
        ``with output:``: under nbclient (papermill, nbval) with ipykernel 7 the capturing context now and
        then leaves the cell waiting for its execute reply until the cell timeout.
        """
        if self._syncing:
            return
        from IPython.display import Markdown

        self.output.outputs = ()
        try:
            items = self.explorer.render(
                self.run.value, query=self.query.value, top_k=self.top_k.value, explain=self.explain.value
            )
        except Exception as error:  # shown in the widget: a live kernel must survive one bad choice
            self.output.append_stdout(f"{type(error).__name__}: {error}\n")
            return
        for item in items:
            self.output.append_display_data(Markdown(item) if isinstance(item, str) else item)
            if not isinstance(item, str):
                plt.close(item)
