"""A paper's study, declared: one YAML declaration per paper (``dmlstudy/experiments/papers/<paper>.yaml``) names
its tables (rows, metrics, the paper's column from ``papers.yaml``, the contrasts their readings judge), and this
one path turns any declaration into runs, mean ± std tables with the paper's numbers, and verdict lines. A
paper's own module keeps only what no declaration says: its figures and the measurements they draw on.

A **variant** is a change to the paper's method's own keyword defaults (read from the method's signature,
:func:`~dmlstudy.experiments.kit.method_defaults`), to TrainConfig fields, or another registered method. Its run
name is written from what it changes (:func:`variant`): ``<method>-<key>=<value>-…``, TrainConfig overrides
first (abbreviated by the declaration's ``names.tags``) and then the method's keywords in sorted order, keywords at
their default left out unless ``explicit``; so two tables that ask for the same configuration share one run.
Keywords the declaration's ``names.suffixes`` lists (keyword → suffix, in its order) are written after the name
instead, as ``<suffix><value>`` (a true flag as the suffix alone), after a row's fixed ``name`` too.

A declaration (``paper`` and ``method`` required)::

    paper: crt                         # the section of papers.yaml that holds the paper's numbers
    method: crt                        # variants change this registered method's keyword defaults
    names: {tags: {classes_per_batch: P}, silent: [output_stride], values: str}   # how run names write a variant
    tables:
      components:                      # a table of rows, each named by its label
        title: Components
        when: components               # the notebook parameter that switches the table on (absent: always)
        seeds: ablation                # ablation (ablation_seeds on ablation_datasets, the default) or protocol
        rows:
          crt: {}                      # the method at its defaults
          −CRT: {kwargs: {use_crt: false}}
          −CRT−Consistency: {method: ms}
        paper: {table: COMPONENTS}     # the paper's number of each row, by its label
        readings: [[crt, −CRT, "full − (−CRT) (the coded residual transform)"]]
      K1:                              # a sweep: one row per value of a notebook parameter, the default added
        sweep: {parameter: k1_values, kwarg: K1, with: {shared: false}}
        paper: {table: K1}
        readings: best_worst

Every key, level by level, with its type and meaning: ``docs/declarations.md``, written from the schema that checks
each declaration when it loads (:mod:`~dmlstudy.experiments.declaration_schema`). What a schema cannot know is
checked then too: the method keywords a row or sweep gives, and, once the paper's module binds its declaration to
its notebook config and measurements (:func:`declaration`), every config field and measurement the declaration
names. A table its paper's module shows says so with ``paper_specific.shown_by`` (the generic :func:`table`
refuses it); the rest of ``paper_specific`` only that module reads.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from dmlstudy import metrics as metric_functions
from dmlstudy.config import load_yaml
from dmlstudy.experiments import declaration_schema
from dmlstudy.experiments.kit import backbone_overrides, method_defaults, paper_dataset, recall_columns
from dmlstudy.findings.numbers import numbers
from dmlstudy.methods import METHODS
from dmlstudy.rows import SHARED_VARIANTS
from dmlstudy.run.protocol import ProtocolConfig
from dmlstudy.run.train import RunResult
from dmlstudy.study.grids import mean_std_table, results_frame, run_grid
from dmlstudy.study.report import mean_std_text
from dmlstudy.verdicts import effect_sentence, paired_differences

DECLARATIONS = Path(__file__).with_name("papers")
FINAL_EVALUATION_ONLY = {"eval_every": 1_000_000}  # a run only its table reads: test metrics after the last epoch
Variant = tuple[str, dict[str, Any]]  # (run name, ProtocolConfig.grid spec)
Measurement = Callable[[RunResult, Any], float]  # a per-run column: f(result, notebook config)


@dataclass(frozen=True)
class Declaration:
    """One paper's declaration (see the module docstring), with the measurements its ``columns`` may name."""

    paper: str
    method: str
    names: Mapping[str, Any]
    tables: Mapping[str, Mapping[str, Any]]
    measurements: Mapping[str, Measurement] = field(default_factory=dict)

    def table(self, name: str) -> Mapping[str, Any]:
        if name not in self.tables:
            raise KeyError(f"{self.paper}: no table {name!r}; declared: {sorted(self.tables)}")
        return self.tables[name]


@functools.cache
def declaration(paper: str, *, config: type | None = None, measurements: Sequence[Measurement] = ()) -> Declaration:
    """The declaration ``papers/<paper>.yaml``, read once and checked: every key against the schema
    (:mod:`~dmlstudy.experiments.declaration_schema`), every method keyword against the method's signature, and,
    when the paper's module binds it, every config field it names against the notebook's ``config`` class and every
    measurement its ``columns`` name against ``measurements`` (the paper's functions ``f(result, config)``,
    registered by their names). A mistake fails here, naming the file, the key's path and what is valid."""
    path = DECLARATIONS / f"{paper}.yaml"
    if not path.is_file():
        raise KeyError(f"no declaration {path.name}; declared papers: {declared_papers()}")
    values = load_yaml(path.read_text(encoding="utf-8")) or {}
    declaration_schema.check(values, str(path))
    registered = {function.__name__: function for function in measurements}
    problems = _method_problems(values)
    if config is not None:  # bound by the paper's module: its config's fields and its measurements
        fields = {spec.name for spec in dataclasses.fields(config)}
        problems += [
            f"{where}: {name!r} is not a field of {config.__name__}; its fields: {sorted(fields)}"
            for where, name in declaration_schema.config_fields(values)
            if name not in fields
        ]
        problems += [
            f"{where}: no measurement {name!r} registered; registered: {sorted(registered)}"
            for where, name in declaration_schema.measurements_named(values)
            if name not in registered
        ]
    if problems:
        raise declaration_schema.DeclarationError(f"{path}: " + "; ".join(problems))
    return Declaration(
        values["paper"], values["method"], values.get("names") or {}, values.get("tables") or {}, registered
    )


def _method_problems(values: Mapping[str, Any]) -> list[str]:
    """Every method a declaration names that is not registered and every keyword its rows, sweeps and ``names.same``
    give that the method does not take, as ``<key path>: <what is wrong>``."""
    problems = []

    def check(where: str, method: str, keywords: Sequence[str]) -> None:
        if method not in METHODS:
            problems.append(f"{where}: no method {method!r}; registered: {sorted(METHODS)}")
            return
        defaults = method_defaults(METHODS[method])
        unknown = sorted(set(keywords) - set(defaults))
        if unknown:
            problems.append(f"{where}: {method} takes no {unknown}; its keywords: {sorted(defaults)}")

    own = values["method"]
    check("method", own, [])
    for name, same in ((values.get("names") or {}).get("same") or {}).items():
        check(f"names.same.{name}", own, list(same))
    for table, spec in (values.get("tables") or {}).items():
        sweep = spec.get("sweep") or {}
        rows = {**(spec.get("rows") or {}), **(sweep.get("choices") or {})}
        for label, row in rows.items():
            row = row or {}
            if not row.get("shared"):
                keywords = [*(row.get("kwargs") or {}), *(spec.get("parameters") or ()), *(row.get("explicit") or ())]
                check(f"tables.{table}.rows.{label}", row.get("method", own), keywords)
        if "kwarg" in sweep:
            check(f"tables.{table}.sweep", own, [sweep["kwarg"], *(sweep.get("with") or {})])
    return problems


def declared_papers() -> list[str]:
    """The papers with a declaration, in the study's order (``papers.yaml``'s)."""
    from dmlstudy.findings.numbers import load

    return [name for name in load() if (DECLARATIONS / f"{name}.yaml").is_file()]


# ----------------------------------------------------------------------------------------------
# Variants and the rows of a table
# ----------------------------------------------------------------------------------------------
def _written(value: Any, style: str) -> str:
    return f"{value:g}" if style == "g" and isinstance(value, float) else str(value)


def variant(
    declared: Declaration,
    *,
    method: str = "",
    kwargs: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
    explicit: Sequence[str] = (),
) -> Variant:
    """``(name, spec)`` of a variant of ``declared``'s method (or of ``method``): keyword arguments equal to the
    method's defaults are dropped unless ``explicit``, so equal configurations get equal names and share runs;
    ``overrides`` are TrainConfig fields, written first in the name (``names.tags`` abbreviates them,
    ``names.silent`` leaves out those another tag implies). A variant the declaration's ``names.same`` lists
    (cross-attention with no blocks is the MS baseline) is that run."""
    method = method or declared.method
    defaults = method_defaults(METHODS[method])
    kwargs, overrides = dict(kwargs or {}), dict(overrides or {})
    unknown = sorted(set(kwargs) - set(defaults))
    if unknown:
        raise KeyError(f"{declared.paper}: {method} takes no {unknown}; its keywords: {sorted(defaults)}")
    kept = {key: value for key, value in sorted(kwargs.items()) if defaults[key] != value or key in explicit}
    for name, same in (declared.names.get("same") or {}).items():
        if kept and kept == same and not overrides:
            return name, {"method": name}
    names = declared.names
    tags = [(key, value) for key, value in overrides.items() if key not in (names.get("silent") or ())]
    tags += [(key, value) for key, value in kept.items() if key not in (names.get("suffixes") or {})]
    written = [f"{(names.get('tags') or {}).get(k, k)}={_written(v, names.get('values', 'str'))}" for k, v in tags]
    spec: dict[str, Any] = {"method": method, **overrides, **({"method_kwargs": kept} if kept else {})}
    return "-".join([method, *written]) + _suffixes(declared, kept), spec


def _suffixes(declared: Declaration, kept: Mapping[str, Any]) -> str:
    """The ``names.suffixes`` of the keywords in ``kept``, in the declared order."""
    style = declared.names.get("values", "str")
    return "".join(
        suffix if kept[key] is True else f"{suffix}{_written(kept[key], style)}"
        for key, suffix in (declared.names.get("suffixes") or {}).items()
        if key in kept
    )


def row_variant(declared: Declaration, row: Mapping[str, Any], config: Any = None) -> Variant:
    """The variant of one declared row (see the module docstring); a ``backbone`` row reads the notebook ``config``."""
    if row.get("shared"):
        return row["shared"], dict(SHARED_VARIANTS[row["shared"]])
    overrides = dict(row.get("overrides") or {})
    if row.get("backbone"):
        overrides.update(backbone_overrides(getattr(config, row["backbone"]), config.protocol))
    name, spec = variant(
        declared,
        method=row.get("method", ""),
        kwargs=row.get("kwargs"),
        overrides=overrides,
        explicit=row.get("explicit", ()),
    )
    if row.get("name"):
        name = row["name"] + _suffixes(declared, spec.get("method_kwargs") or {})
    return _final_evaluation(declared, name, spec) if row.get("final_evaluation") else (name, spec)


def _final_evaluation(declared: Declaration, name: str, spec: dict[str, Any]) -> Variant:
    """The variant evaluated after its last epoch only, unless it is a run other tables read too (``names.same``)."""
    return (name, spec) if name in (declared.names.get("same") or {}) else (name, {**spec, **FINAL_EVALUATION_ONLY})


def table_rows(declared: Declaration, table: str, config: Any = None) -> dict[Any, Variant]:
    """Label (or swept value) → variant of every row of ``table``, in table order; a sweep's values come from the
    notebook ``config``'s parameter, its reference from the method's default or the config's protocol."""
    spec = declared.table(table)
    if "rows" in spec:
        rows = spec["rows"]
        chosen = list(getattr(config, spec["select"])) if spec.get("select") else list(rows)
        unknown = [label for label in chosen if label not in rows]
        if unknown:
            raise KeyError(f"{declared.paper} table {table!r}: unknown rows {unknown}; declared: {list(rows)}")
        from_config = {key: getattr(config, key) for key in spec.get("parameters") or ()}
        return {label: row_variant(declared, _with_kwargs(rows[label] or {}, from_config), config) for label in chosen}
    if "sweep" not in spec:
        raise KeyError(
            f"{declared.paper} table {table!r} is paper-specific (paper_specific: {sorted(spec['paper_specific'])}): "
            "its paper's module reads it, not the generic path"
        )
    sweep = spec["sweep"]
    values = list(getattr(config, sweep["parameter"])) if config is not None else []
    if "choices" in sweep:
        choices = sweep["choices"]
        unknown = sorted(set(values) - set(choices))
        if unknown:
            raise KeyError(f"parameter {sweep['parameter']!r}: unknown {unknown}; valid: {sorted(choices)}")
        order = [sweep["reference"], *[name for name in choices if name in values and name != sweep["reference"]]]
        return {name: row_variant(declared, choices[name] or {}, config) for name in order}
    fixed = dict(sweep.get("with") or {})
    if "kwarg" in sweep:
        reference = method_defaults(METHODS[declared.method])[sweep["kwarg"]]
        values = [type(reference)(value) for value in values]
        swept = _with_reference(values, reference) if sweep.get("default", True) else sorted(set(values))
        return {value: sweep_variant(declared, sweep, value) for value in swept}
    protocol = config.protocol
    per = getattr(protocol, sweep["per"])
    reference = getattr(protocol, sweep["override"]) * per
    rows = {}
    for value in _with_reference([int(v) for v in values], reference):
        if value % per or value < 2 * per:
            raise ValueError(f"{sweep['parameter']}: {value} is not a multiple of {sweep['per']} = {per} (at least 2×)")
        overrides = {} if value == reference else {sweep["override"]: value // per}
        rows[value] = variant(declared, kwargs=fixed, overrides=overrides)
    return rows


def _with_kwargs(row: Mapping[str, Any], kwargs: Mapping[str, Any]) -> Mapping[str, Any]:
    """``row`` with ``kwargs`` under its own keywords."""
    return {**row, "kwargs": {**kwargs, **(row.get("kwargs") or {})}} if kwargs else row


def sweep_variant(declared: Declaration, sweep: Mapping[str, Any], value: Any) -> Variant:
    """The variant of one value of a keyword sweep (``kwarg``, its ``with`` keywords, ``explicit``,
    ``final_evaluation``)."""
    key = sweep["kwarg"]
    value = type(method_defaults(METHODS[declared.method])[key])(value)
    explicit = (key,) if sweep.get("explicit") else ()
    name, spec = variant(declared, kwargs={**(sweep.get("with") or {}), key: value}, explicit=explicit)
    return _final_evaluation(declared, name, spec) if sweep.get("final_evaluation") else (name, spec)


def declared_variant(declared: Declaration, reference: str | Mapping[str, Any]) -> Variant:
    """A run a claim names: a plain name (a method, a shared variant: ``{"method": name}`` as the comparison trains
    it), a row of a table (``{table, row}``) or a value of a keyword sweep (``{table, value}``)."""
    if isinstance(reference, str):
        return reference, dict(SHARED_VARIANTS.get(reference, {"method": reference}))
    spec = declared.table(reference["table"])
    if "row" in reference:
        rows = spec.get("rows") or spec["sweep"]["choices"]
        return row_variant(declared, rows[reference["row"]] or {})
    return sweep_variant(declared, spec["sweep"], reference["value"])


def _with_reference(values: Sequence[Any], reference: Any) -> list[Any]:
    """The swept values with the reference added, sorted, without duplicates."""
    return sorted({*values, reference})


def grid(rows: Mapping[Any, Variant]) -> dict[str, dict[str, Any]]:
    """``{name: spec}`` of a table's rows, for :meth:`ProtocolConfig.grid` (rows sharing a run appear once)."""
    return dict(rows.values())


def run_table(declared: Declaration, table: str, config: Any) -> list[tuple[str, RunResult]]:
    """Train (or load) every row of ``table`` × dataset × seed: the protocol's datasets and seeds, or with
    ``seeds: ablation`` (the default) the notebook's ``ablation_datasets`` and ``ablation_seeds``."""
    protocol, datasets = _protocol(declared.table(table), config)
    variants = grid(table_rows(declared, table, config))
    return run_grid(protocol.grid(variants, datasets=datasets), workers=protocol.workers)


def _protocol(spec: Mapping[str, Any], config: Any) -> tuple[ProtocolConfig, list[str] | None]:
    if spec.get("seeds", "ablation") == "protocol":
        return config.protocol, None
    return config.protocol.with_seeds(config.ablation_seeds), list(config.ablation_datasets)


def enabled(declared: Declaration, table: str, config: Any) -> bool:
    """Whether the notebook ``config`` asks for ``table`` (its ``when`` parameter; a sweep, a non-empty list, or
    ``always``)."""
    spec = declared.table(table)
    if "when" in spec:
        return bool(getattr(config, spec["when"]))
    sweep = spec.get("sweep")
    return sweep is None or bool(sweep.get("always")) or bool(getattr(config, sweep["parameter"]))


# ----------------------------------------------------------------------------------------------
# Tables and their readings
# ----------------------------------------------------------------------------------------------
def recall_at(result: RunResult, ks: Sequence[int]) -> dict[str, float]:
    """Recall@K for ``ks`` (those below the number of test items) from the run's stored test embeddings."""
    embeddings, labels = result.embeddings["embeddings"], result.embeddings["labels"]
    usable = [int(k) for k in ks if int(k) < len(labels)]
    if not usable:
        return {}
    return {f"R@{k}": value for k, value in metric_functions.recall_at_k(embeddings, labels, usable).items()}


def _measurement(declared: Declaration, entry: str | Mapping[str, Any]) -> Measurement:
    return declared.measurements[entry["of"] if isinstance(entry, Mapping) else entry]


def run_frame(
    declared: Declaration, name: str, results: Sequence[tuple[str, RunResult]], config: Any = None
) -> pd.DataFrame:
    """One row per run of table ``name`` (:func:`~dmlstudy.study.grids.results_frame`) with the row's label (column
    ``label``, default ``setting``), Recall@K at the table's ``ks`` and its per-run ``columns``."""
    spec = declared.table(name)
    frame = results_frame(list(results))
    label_of = {variant_name: label for label, (variant_name, _) in table_rows(declared, name, config).items()}
    frame.insert(1, spec.get("label", "setting"), [label_of.get(v, v) for v in frame["variant"]])
    ks = [int(k) for k in getattr(config, spec["ks"])] if spec.get("ks") else []
    if ks:
        frame = frame.drop(columns=[c for c in frame.columns if c.startswith("R@")])
    measured = {column: _measurement(declared, entry) for column, entry in (spec.get("columns") or {}).items()}
    extra = [
        {**recall_at(result, ks), **{column: f(result, config) for column, f in measured.items()}}
        for _, result in results
    ]
    return pd.concat([frame, pd.DataFrame(extra, index=frame.index)], axis=1)


def paper_values(declared: Declaration, spec: Mapping[str, Any], dataset: str) -> dict[Any, Any]:
    """Row key → the paper's number for ``dataset``'s stand-in (``by: dataset``) or for every dataset."""
    paper = spec.get("paper")
    if not paper:
        return {}
    values = numbers(declared.paper, paper["table"])
    if paper.get("by") == "dataset":
        values = values.get(paper_dataset(dataset), {})
    return {
        key: (value[paper["pick"]] if "pick" in paper and value is not None else value) for key, value in values.items()
    }


def with_decimals(summary: pd.DataFrame, decimals: Mapping[str, int]) -> pd.DataFrame:
    """A mean ± std table with each column of ``decimals`` written at its own number of decimals."""
    for column, places in decimals.items():
        if f"{column}_mean" in summary:
            summary[column] = [
                mean_std_text(m, s, n, decimals=places)
                for m, s, n in zip(summary[f"{column}_mean"], summary[f"{column}_std"], summary["runs"])
            ]
    return summary


def _shown(value: Any) -> Any:
    if isinstance(value, tuple):
        return " / ".join("–" if v is None else f"{v:.1f}" for v in value)
    return "–" if value is None else value


def table(
    declared: Declaration, name: str, results: Sequence[tuple[str, RunResult]], config: Any = None
) -> tuple[pd.DataFrame, list[str]]:
    """The mean ± std table of ``name`` over ``results`` (its rows in order, each labelled, the paper's number
    beside) and its readings: one sentence per dataset and declared contrast, by the study's verdict rule on the
    per-seed paired differences (:func:`dmlstudy.verdicts.effect_sentence`)."""
    spec = declared.table(name)
    shown_by = (spec.get("paper_specific") or {}).get("shown_by")
    if shown_by:
        raise ValueError(f"{declared.paper} table {name!r} is shown by its paper's {shown_by}, not the generic table")
    rows = table_rows(declared, name, config)
    frame = run_frame(declared, name, results, config)
    measured = spec.get("columns") or {}
    ks = len(getattr(config, spec["ks"])) if spec.get("ks") else 4
    metrics = [*(spec.get("metrics") or [*recall_columns(frame, count=ks), "MAP@R"]), *measured]
    summary = mean_std_table(frame, metrics=[m for m in metrics if m in frame.columns])
    summary = with_decimals(summary, {c: e.get("decimals", 1) for c, e in measured.items() if isinstance(e, Mapping)})
    label_of = {variant_name: label for label, (variant_name, _) in rows.items()}
    shown, sentences = [], []
    key_name = spec.get("label", "setting")
    for dataset in dict.fromkeys(summary["dataset"]):
        paper = paper_values(declared, spec, dataset)
        here = (
            summary[summary["dataset"] == dataset]
            .set_index("variant")
            .loc[[n for n in dict.fromkeys(n for n, _ in rows.values()) if n in set(summary["variant"])]]
            .reset_index()
        )
        here.insert(1, key_name, [label_of[v] for v in here["variant"]])
        by_name = (spec.get("paper") or {}).get("by") == "dataset"
        column = (spec.get("paper") or {}).get("column", "paper R@1").format(dataset=paper_dataset(dataset, "–"))
        if spec.get("paper"):
            here[column] = [_shown(paper.get(v if by_name else label_of[v])) for v in here["variant"]]
        shown.append(here)
        sentences += _readings(declared, spec, rows, frame, dataset, paper, by_name)
    table = pd.concat(shown, ignore_index=True)
    return table[[c for c in table.columns if not c.endswith(("_mean", "_std"))]], sentences


def _readings(declared, spec, rows, frame, dataset, paper, by_name) -> list[str]:
    def paper_of(label: Any) -> Any:
        return paper.get(rows[label][0] if by_name else label)

    readings = spec.get("readings") or []
    if readings == "best_worst":
        common = [value for value in rows if paper.get(value) is not None]
        if len(common) < 2:
            return [f"{dataset}: fewer than two swept values have a paper number; no direction to check."]
        best, worst = max(common, key=paper.get), min(common, key=paper.get)
        key = spec.get("label", "value")
        readings = [[best, worst, f"{key} = {best} − {key} = {worst} (the paper's best − worst of ours)"]]
    elif readings == "reference":
        reference = next(iter(rows))
        readings = [[label, reference, f"{label} − {reference}", {"paper": False}] for label in list(rows)[1:]]
    sentences = []
    for a, b, what, *options in readings:
        if a not in rows or b not in rows:
            continue
        options = options[0] if options else {}
        metric = options.get("metric", "R@1")
        first, second = paper_of(a), paper_of(b)
        if "pick" in options and first is not None and second is not None:
            first, second = first[options["pick"]], second[options["pick"]]
        difference = first - second if options.get("paper", True) and None not in (first, second) else None
        ours = paired_differences(frame, dataset, rows[a][0], rows[b][0], metric)
        unit = "R@1 points" if metric == "R@1" else f"{metric} points"
        sentences.append(effect_sentence(f"{dataset}: {what}", ours=ours, paper=difference, unit=unit))
    if spec.get("cost") and all(label in rows for label in spec["cost"]):
        cheaper, dearer = (rows[label][0] for label in spec["cost"])
        paper_cost = numbers(declared.paper, spec["paper_cost"]) if spec.get("paper_cost") else None
        sentences.append(cost_sentence(frame, cheaper=cheaper, dearer=dearer, paper=paper_cost))
    return sentences


def cost_sentence(frame: pd.DataFrame, *, cheaper: str, dearer: str, paper: float | None = None) -> str:
    """The measured cost of ``dearer`` against ``cheaper`` from their run records: training seconds per epoch
    (data loading included; timings on a shared machine are noisy) and parameters."""
    seconds = frame.groupby("variant")["seconds_per_epoch"].mean()
    parameters = frame.groupby("variant")["parameters"].first()
    return (
        f"cost: {dearer} trains at {seconds[dearer] / seconds[cheaper]:.2f}× the seconds per epoch of {cheaper}"
        + (f" (the paper: {paper:.2f})" if paper else "")
        + f" with {parameters[dearer] - parameters[cheaper]:+,d} parameters (timings on a shared machine are noisy)."
    )


def report(declared: Declaration, name: str, results, config: Any, *, title: str = "") -> list[str]:
    """Print the protocol line, show the table ``name`` under its title, then print its readings; return the readings
    (``<title> — <sentence>``)."""
    table_, sentences = table(declared, name, results, config)
    protocol, _ = _protocol(declared.table(name), config)
    title = title or declared.table(name).get("title", name)
    from IPython.display import display

    print(f"{title}\nprotocol: {protocol.protocol_text()}, datasets {list(dict.fromkeys(table_['dataset']))}")
    display(table_)
    for sentence in sentences:
        print("→", sentence)
    return [f"{title} — {sentence}" for sentence in sentences]


def run_and_report(declared: Declaration, name: str, config: Any) -> tuple[list[tuple[str, RunResult]], list[str]]:
    """:func:`run_table` then :func:`report`, when the notebook asks for the table (else nothing)."""
    if not enabled(declared, name, config):
        return [], []
    results = run_table(declared, name, config)
    return results, report(declared, name, results, config)


__all__ = [
    "Declaration",
    "cost_sentence",
    "declaration",
    "declared_variant",
    "declared_papers",
    "enabled",
    "grid",
    "paper_values",
    "report",
    "recall_at",
    "row_variant",
    "run_and_report",
    "run_frame",
    "run_table",
    "sweep_variant",
    "table",
    "table_rows",
    "variant",
    "with_decimals",
]
