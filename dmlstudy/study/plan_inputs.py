"""What a plan reads before its notebooks start: the datasets it names (``dmlstudy data generate --plan``) and the
cached activations of frozen stems (``dmlstudy study run``, before the first notebook).

A plan's datasets are those its entries name — the shared protocol's ``datasets``, an entry's ``dataset``,
``datasets`` and ``ablation_datasets`` — with the notebook's own default where an entry leaves one out.

A regime with a frozen, cached stem (``stem_views``, e.g. ``imagenet``) computes the stem once per image and view
(:mod:`dmlstudy.models.trunk_cache`). Left to the notebooks, the first kernels to load a dataset would compute it
side by side, each with its own threads, on the same cores; done here, it is computed once, with all the cores,
and every notebook reads it.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import time
from typing import Any

from dmlstudy.rows import BASELINE
from dmlstudy.run.data import load_datasets
from dmlstudy.run.protocol import ProtocolConfig
from dmlstudy.run.train import TrainConfig
from dmlstudy.study.plan import PROTOCOL_PARAMETER, PlanEntry, load_plan, notebook_parameters

DATASET_PARAMETERS = ("dataset", "datasets", "ablation_datasets")  # entry parameters that name datasets
REGIMES_PARAMETER = "compared_regimes"  # the comparison's further regimes, beside the protocol's


def _names(value: Any) -> list[str]:
    """A parameter's dataset names: one name, a list of names, or none ('' reads every run's dataset)."""
    if isinstance(value, str):
        return [value] if value else []
    return [str(name) for name in value or []]


def _entry_values(entry: PlanEntry, declared: dict[str, dict]) -> dict[str, Any]:
    """The entry's parameters over the notebook's defaults (papermill gives defaults as Python literals)."""
    values = {}
    for name, spec in declared.items():
        try:
            values[name] = ast.literal_eval(spec["default"])
        except (ValueError, SyntaxError):
            continue
    return {**values, **entry.parameters}


def _protocols(values: dict[str, Any]) -> list[ProtocolConfig]:
    """The entry's protocol in each regime it trains in (its own, then ``compared_regimes``); [] if the notebook
    takes no protocol."""
    if PROTOCOL_PARAMETER not in values:
        return []
    fields = {k: v for k, v in (values[PROTOCOL_PARAMETER] or {}).items() if k not in ("study", "runs_root")}
    protocol = ProtocolConfig(**fields)
    regimes = [protocol.regime, *[r for r in values.get(REGIMES_PARAMETER) or [] if r != protocol.regime]]
    return [dataclasses.replace(protocol, regime=regime) for regime in regimes]


def _selected(plan: str, only: str) -> list[dict[str, Any]]:
    """The parameter values of every plan entry whose run name matches ``only``."""
    entries = [entry for entry in load_plan(plan) if re.search(only, entry.run_name)]
    declared = {notebook: notebook_parameters(notebook) for notebook in {entry.notebook for entry in entries}}
    return [_entry_values(entry, declared[entry.notebook]) for entry in entries]


def plan_datasets(plan: str, *, only: str = "") -> list[str]:
    """Every dataset the plan's entries (those whose run name matches ``only``) read, in order of first mention."""
    names: list[str] = []
    for values in _selected(plan, only):
        protocols = _protocols(values)
        mentioned = [
            *(protocols[0].datasets if protocols else []),
            *(n for k in DATASET_PARAMETERS for n in _names(values.get(k))),
        ]
        for name in mentioned:
            if name not in names:
                names.append(name)
    return names


def stem_configs(plan: str, *, only: str = "") -> dict[str, TrainConfig]:
    """``"<dataset> (<regime>, <size> px)"`` → one run configuration, for every dataset × regime × image size of
    the plan whose regime caches a frozen stem (``stem_views`` > 0): what :func:`prepare_stem_caches` loads. Entries
    that read the same cache (same dataset, backbone, size, views and data root) give one configuration."""
    configs: dict[str, TrainConfig] = {}
    seen: set[tuple] = set()
    for values in _selected(plan, only):
        for protocol in _protocols(values):
            datasets = [*protocol.datasets, *_names(values.get("ablation_datasets"))]
            for dataset in datasets:
                config = protocol.train_config(dataset=dataset, method=BASELINE, seed=0, name="stem-cache")
                key = (dataset, config.backbone, config.image_size, config.stem_views, config.data_root)
                if config.stem_views and key not in seen:
                    seen.add(key)
                    configs[f"{dataset} ({protocol.regime}, {config.image_size} px)"] = config
    return configs


def prepare_stem_caches(configs: dict[str, TrainConfig], *, echo: Any = print) -> list[str]:
    """Compute (or find) the cached stem activations of every configuration's dataset, training views and test
    view, before any notebook starts; one line each (``emoji (imagenet, 128 px): … cached in 212 s``);
    the caches are found, not computed again, once made. Computing one takes minutes on a CPU, so its bar
    (images × views, with the time left) shows whether or not the output is a terminal."""
    lines = []
    for label, config in configs.items():
        started = time.perf_counter()
        load_datasets(dataclasses.replace(config, progress=True))
        line = (
            f"{label}: the frozen stem's activations ({config.stem_views} training views and the test view) cached "
            f"in {time.perf_counter() - started:.0f} s"
        )
        echo(line, flush=True)
        lines.append(line)
    return lines
