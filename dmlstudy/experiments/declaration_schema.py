"""The grammar of a paper's declaration (``dmlstudy/experiments/papers/<paper>.yaml``), as one JSON Schema
(:data:`SCHEMA`): every level typed (paper, names, table, row, sweep, readings, columns), every key described, and
no key accepted that the schema does not name. :func:`check` applies it when a declaration loads, so a misspelt
key fails there, naming the file, the key's path and the valid keys, instead of silently changing what a table
means (a row's ``kwarg:`` for ``kwargs:`` would otherwise be the method at its defaults).

The schema is also the one reference of the keys: ``docs/declarations.md`` is written from it
(:func:`reference_markdown`; ``python -m dmlstudy.experiments.declaration_schema > docs/declarations.md``) and a
test holds the two equal. What a schema cannot know, the notebook config's field names and the paper module's
measurements, :mod:`dmlstudy.experiments.ablations` checks when the paper's module binds its declaration.

Decision: JSON Schema through ``jsonschema`` (a dependency of the notebook stack the study already installs)
rather than a second typed model of the same data: the declaration stays plain mappings, read by one path."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jsonschema

LABEL = {"type": ["string", "number", "boolean"], "description": "a row's label (a swept value for a sweep)"}
NAMES = {"type": "array", "items": {"type": "string"}}
CONFIG_FIELD = "a field of the notebook's config"  # keys whose value names one: checked against the config class

ROW = {
    "type": ["object", "null"],
    "title": "row",
    "description": "One row of a table (or one choice of a sweep): a variant of the paper's method. `{}` is the "
    "method at its defaults.",
    "additionalProperties": False,
    "properties": {
        "kwargs": {"type": "object", "description": "the method's keyword arguments that differ from its defaults"},
        "overrides": {"type": "object", "description": "TrainConfig fields the row changes (`{epochs: 20}`)"},
        "method": {"type": "string", "description": "another registered method (the baseline: `ms`)"},
        "shared": {
            "type": "string",
            "description": "a shared variant of `dmlstudy.rows.SHARED_VARIANTS`, trained under its own name",
        },
        "backbone": {
            "type": "string",
            "description": f"{CONFIG_FIELD} naming a backbone to train on, with the overrides it needs",
        },
        "name": {"type": "string", "description": "a fixed run name (the declaration's suffixes still follow it)"},
        "explicit": {"description": "keywords written in the run name even at their default", **NAMES},
        "final_evaluation": {
            "type": "boolean",
            "description": "a run only this table reads: its test classes evaluated after the last epoch only "
            "(the training is the same)",
        },
    },
}

CONTRAST = {
    "type": "array",
    "title": "contrast",
    "description": "`[A, B, what]` or `[A, B, what, options]`: row A against row B, judged on the per-seed paired "
    "differences; a contrast naming a row the table does not show is skipped.",
    "minItems": 3,
    "maxItems": 4,
    "prefixItems": [
        LABEL,
        LABEL,
        {"type": "string", "description": "what the contrast reads, as the verdict line says it"},
        {
            "type": "object",
            "title": "contrast options",
            "description": "how the contrast is read (below)",
            "additionalProperties": False,
            "properties": {
                "metric": {"type": "string", "description": "the metric compared (default `R@1`)"},
                "pick": {"type": "integer", "description": "the entry of the paper's tuple that holds this metric"},
                "paper": {"type": "boolean", "description": "false: no paper difference beside ours"},
            },
        },
    ],
}

READINGS = {
    "title": "readings",
    "description": "The contrasts a table's verdict lines judge: a list of contrasts, `best_worst` (the values "
    "the paper ranks best and worst, among ours) or `reference` (each row against the first, no paper number).",
    "if": {"type": "string"},
    "then": {"enum": ["best_worst", "reference"]},
    "else": {"type": "array", "items": CONTRAST},
}

COLUMN = {
    "title": "column",
    "description": "A per-run measurement beside the metrics, shown as mean ± std: the name of a measurement the "
    "paper's module registers (a function of a run and the notebook config), or `{of: <name>, decimals: 3}`.",
    "if": {"type": "string"},
    "then": {"type": "string"},
    "else": {
        "type": "object",
        "additionalProperties": False,
        "required": ["of"],
        "properties": {
            "of": {"type": "string", "description": "the registered measurement"},
            "decimals": {"type": "integer", "description": "decimals of its mean ± std (default 1)"},
        },
    },
}

SWEEP = {
    "type": "object",
    "title": "sweep",
    "description": "One row per value of a notebook parameter, of one of three kinds: a keyword of the method "
    "(`kwarg`), a TrainConfig field per protocol unit (`override` with `per`), or named rows (`choices`).",
    "additionalProperties": False,
    "required": ["parameter"],
    "properties": {
        "parameter": {"type": "string", "description": f"{CONFIG_FIELD}: the list of swept values or choices"},
        "kwarg": {"type": "string", "description": "the method's keyword swept; its default is a row too"},
        "with": {"type": "object", "description": "keywords every row of a `kwarg` sweep sets"},
        "default": {"type": "boolean", "description": "false: the keyword's default is not added as a row"},
        "explicit": {"type": "boolean", "description": "name the keyword in the run name even at its default"},
        "final_evaluation": {"type": "boolean", "description": "as for a row"},
        "override": {"type": "string", "description": "a TrainConfig field: the swept value divided by `per`"},
        "per": {
            "type": "string",
            "description": "the protocol field `override` is counted in (its product is the reference)",
        },
        "choices": {"type": "object", "description": "named rows", "additionalProperties": ROW},
        "reference": {"type": "string", "description": "the choice always shown, first"},
        "always": {"type": "boolean", "description": "show the table even when the parameter lists no choice"},
    },
    "oneOf": [{"required": ["kwarg"]}, {"required": ["override", "per"]}, {"required": ["choices", "reference"]}],
}

PAPER_COLUMN = {
    "type": "object",
    "title": "paper column",
    "description": "The paper's number of each row, from the paper's section of `papers.yaml`.",
    "additionalProperties": False,
    "required": ["table"],
    "properties": {
        "table": {"type": "string", "description": "the entry of `papers.yaml` that holds the numbers"},
        "by": {
            "enum": ["label", "value", "dataset"],
            "description": "keyed by row label (default), by swept value, or by stand-in dataset then run name",
        },
        "pick": {"type": "integer", "description": "the entry of a tuple shown"},
        "column": {"type": "string", "description": "the column's title (`{dataset}`: the paper's dataset)"},
    },
}

PAPER_SPECIFIC = {
    "type": "object",
    "title": "paper-specific",
    "description": "What only the paper's own module reads (`papers/<paper>.py`). A table with `shown_by` has its "
    "runs resolved by the generic path but is shown by that function, and the generic table refuses it; a table "
    "with no `rows` and no `sweep` is the paper module's alone.",
    "additionalProperties": False,
    "properties": {
        "shown_by": {
            "type": "string",
            "description": "the function that shows the table: one of the paper's module (`loss_table`) or of the "
            "study kit (`kit.projection_figure`)",
        },
        "rerank": {
            "enum": ["K", "G"],
            "description": "DIML: the table re-ranks the trained runs at every truncation K or every grid size G",
        },
        "labels": {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "description": "DIML: the base losses, as its verdict lines name them",
        },
        "speed": {
            "type": "object",
            "additionalProperties": False,
            "required": ["slower", "paper"],
            "description": "DGCRL: the row whose speed the paper compares with, and the paper's speed-up",
            "properties": {"slower": {"type": "string"}, "paper": {"type": "string"}},
        },
    },
}

TABLE = {
    "type": "object",
    "title": "table",
    "description": "One table of the paper's notebook: rows or a sweep, what is shown, and what is judged.",
    "additionalProperties": False,
    "properties": {
        "title": {"type": "string", "description": "the title the notebook shows it under"},
        "when": {"type": "string", "description": f"{CONFIG_FIELD} that switches the table on (absent: always)"},
        "seeds": {
            "enum": ["ablation", "protocol"],
            "description": "`ablation` (the config's ablation_seeds on ablation_datasets, the default) or "
            "`protocol` (the protocol's datasets and seeds)",
        },
        "select": {"type": "string", "description": f"{CONFIG_FIELD} listing the rows shown, in order"},
        "label": {"type": "string", "description": "the title of the rows' label column (default `setting`)"},
        "rows": {"type": "object", "description": "label → row", "additionalProperties": ROW},
        "sweep": SWEEP,
        "parameters": {
            "description": f"each {CONFIG_FIELD}, passed to the rows' method as the keyword of the same name",
            **NAMES,
        },
        "metrics": {"description": "the metric columns shown (default: R@K and MAP@R)", **NAMES},
        "ks": {"type": "string", "description": f"{CONFIG_FIELD}: Recall@K at its K, from the stored embeddings"},
        "columns": {"type": "object", "description": "column → measurement", "additionalProperties": COLUMN},
        "paper": PAPER_COLUMN,
        "readings": READINGS,
        "cost": {
            "type": "array",
            "items": LABEL,
            "minItems": 2,
            "maxItems": 2,
            "description": "`[cheaper, dearer]`: the measured cost of the second against the first",
        },
        "paper_cost": {"type": "string", "description": "the entry of `papers.yaml` with the paper's cost ratio"},
        "paper_specific": PAPER_SPECIFIC,
    },
    "anyOf": [{"required": ["rows"]}, {"required": ["sweep"]}, {"required": ["paper_specific"]}],
    "if": {"not": {"anyOf": [{"required": ["rows"]}, {"required": ["sweep"]}]}},
    "then": {"properties": {"paper_specific": {"required": ["shown_by"]}}},
}

NAMES_SECTION = {
    "type": "object",
    "title": "names",
    "description": "How run names write a variant: `<method>-<key>=<value>-…`, TrainConfig overrides first.",
    "additionalProperties": False,
    "properties": {
        "tags": {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "description": "a key → its abbreviation in run names",
        },
        "silent": {"description": "keys left out of run names (another tag implies them)", **NAMES},
        "values": {"enum": ["str", "g"], "description": "how values are written: `str` or `g` (`0.1`, not `0.10`)"},
        "same": {
            "type": "object",
            "additionalProperties": {"type": "object"},
            "description": "a run name → the method keywords that are that run (with no blocks, cross-attention is `ms`)",
        },
        "suffixes": {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "description": "a keyword → the suffix written after the name instead (`_g2`; a true flag: the suffix alone)",
        },
    },
}

SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "title": "paper",
    "description": "A paper's declaration.",
    "additionalProperties": False,
    "required": ["paper", "method"],
    "properties": {
        "paper": {"type": "string", "description": "the section of `papers.yaml` that holds the paper's numbers"},
        "method": {"type": "string", "description": "the registered method whose keyword defaults variants change"},
        "names": NAMES_SECTION,
        "tables": {"type": "object", "description": "table name → table", "additionalProperties": TABLE},
    },
}
LEVELS = (SCHEMA, NAMES_SECTION, TABLE, ROW, SWEEP, PAPER_COLUMN, READINGS, CONTRAST, COLUMN, PAPER_SPECIFIC)


class DeclarationError(ValueError):
    """A declaration that does not follow :data:`SCHEMA` (or names what its notebook config does not have)."""


def key_path(path: Sequence[Any]) -> str:
    """A key's path as the message writes it: ``tables.components.rows.−CRT.kwarg`` (``<top>`` for the top)."""
    return ".".join(str(part) for part in path) or "<top>"


def _messages(error: jsonschema.ValidationError) -> Iterator[str]:
    """What ``error`` says, at its key path: an unknown key with the valid ones, else jsonschema's own words."""
    path = list(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, Mapping):
        valid = sorted(error.schema.get("properties", {}))
        for key in sorted(set(error.instance) - set(valid), key=str):
            yield f"{key_path([*path, key])}: unknown key {key!r}; valid keys: {valid}"
    elif error.validator in ("oneOf", "anyOf") and "required" in str(error.validator_value):
        kinds = [" + ".join(option["required"]) for option in error.validator_value]
        yield f"{key_path(path)}: needs exactly one of {kinds}"
    else:
        yield f"{key_path(path)}: {error.message}"


def check(values: Any, source: str) -> None:
    """Raise :class:`DeclarationError` naming ``source`` (the file) and every key of ``values`` that breaks
    :data:`SCHEMA`, with its path and the valid keys."""
    errors = sorted(jsonschema.Draft202012Validator(SCHEMA).iter_errors(values), key=lambda e: list(map(str, e.path)))
    messages = list(dict.fromkeys(m for error in errors for m in _messages(error)))
    if messages:
        raise DeclarationError(f"{source}: " + "; ".join(messages))


def config_fields(values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(key path, field)`` for every value of the declaration that names a field of the notebook's config
    (the keys :data:`SCHEMA` describes as one), for :func:`dmlstudy.experiments.ablations.declaration` to check."""
    named = []
    for table, spec in (values.get("tables") or {}).items():
        for key in ("when", "select", "ks"):
            if key in spec:
                named.append((f"tables.{table}.{key}", spec[key]))
        named += [(f"tables.{table}.parameters", name) for name in spec.get("parameters") or ()]
        if spec.get("seeds", "ablation") == "ablation" and ("rows" in spec or "sweep" in spec):
            named += [(f"tables.{table}.seeds", name) for name in ("ablation_seeds", "ablation_datasets")]
        sweep = spec.get("sweep") or {}
        if "parameter" in sweep:
            named.append((f"tables.{table}.sweep.parameter", sweep["parameter"]))
        rows = {**(spec.get("rows") or {}), **(sweep.get("choices") or {})}
        named += [
            (f"tables.{table}.rows.{label}.backbone", (row or {})["backbone"])
            for label, row in rows.items()
            if (row or {}).get("backbone")
        ]
    return named


def measurements_named(values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(key path, name)`` for every measurement the declaration's ``columns`` name."""
    return [
        (f"tables.{table}.columns.{column}", entry["of"] if isinstance(entry, Mapping) else entry)
        for table, spec in (values.get("tables") or {}).items()
        for column, entry in (spec.get("columns") or {}).items()
    ]


# ----------------------------------------------------------------------------------------------
# The reference page
# ----------------------------------------------------------------------------------------------
def _kind(schema: Mapping[str, Any]) -> str:
    """A key's type as the reference page writes it (a level of its own as a link to its section)."""
    if schema is LABEL:
        return "row label"
    if "title" in schema:
        return f"[{schema['title']}](#{schema['title'].replace(' ', '-')})"
    if "enum" in schema:
        return " \\| ".join(f"`{value}`" for value in schema["enum"])
    kind = schema.get("type", "")
    kinds = kind if isinstance(kind, list) else [kind]
    if "array" in kinds and "items" in schema:
        return f"list of {_kind(schema['items'])}"
    if "object" in kinds and isinstance(schema.get("additionalProperties"), Mapping):
        return f"map of {_kind(schema['additionalProperties'])}"
    return " or ".join(k for k in kinds if k) or "any"


def reference_markdown() -> str:
    """``docs/declarations.md``: every level of :data:`SCHEMA`, with each key's type and what it means."""
    lines = [
        "# The declaration language",
        "",
        "Every key of a paper's declaration (`dmlstudy/experiments/papers/<paper>.yaml`), level by level. A key not",
        "listed here fails when the declaration loads, naming the file, the key's path and the valid keys. This page",
        "is written from the schema, `dmlstudy/experiments/declaration_schema.py`",
        "(`python -m dmlstudy.experiments.declaration_schema > docs/declarations.md`); a test holds the two equal.",
        "Keys marked *config field* name a field of the paper's notebook config, checked when the paper's module",
        "loads its declaration.",
    ]
    for level in LEVELS:
        lines += ["", f"## {level['title']}", "", level["description"]]
        if "properties" in level:
            required = set(level.get("required", ()))
            lines += ["", "| key | type | what |", "|---|---|---|"]
            for key, spec in level["properties"].items():
                what = (
                    "see below"
                    if "title" in spec
                    else spec.get("description", "").replace(CONFIG_FIELD, "*config field*")
                )
                lines.append(f"| `{key}`{' (required)' if key in required else ''} | {_kind(spec)} | {what} |")
        elif level is READINGS:
            lines += ["", "A list of [contrast](#contrast), or one of `best_worst`, `reference`."]
        elif level is COLUMN:
            lines += ["", "| key | type | what |", "|---|---|---|"]
            for key, spec in level["else"]["properties"].items():
                lines.append(f"| `{key}` | {_kind(spec)} | {spec['description']} |")
        elif level is CONTRAST:
            lines += ["", "| entry | type | what |", "|---|---|---|"]
            for index, spec in enumerate(level["prefixItems"]):
                lines.append(f"| {index + 1} | {_kind(spec)} | {spec.get('description', '')} |")
            options = level["prefixItems"][3]["properties"]
            lines += ["", "### contrast options", "", "| key | type | what |", "|---|---|---|"]
            lines += [f"| `{key}` | {_kind(spec)} | {spec['description']} |" for key, spec in options.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(reference_markdown(), end="")
