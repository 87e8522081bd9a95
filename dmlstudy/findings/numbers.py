"""The papers' numbers, read from ``papers.yaml`` (package data beside this module): one place for every number
the study prints beside its own, each with the table or figure it comes from.

``numbers(paper, table)`` gives a table's values as the notebook modules use them: a key ``"(a, b)"`` becomes
the tuple ``(a, b)`` (each part read as YAML: ``"(ms, 100)"`` → ``("ms", 100)``) and lists become tuples.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml

SOURCE = Path(__file__).with_name("papers.yaml")


@functools.lru_cache(maxsize=1)
def load() -> dict[str, Any]:
    """The whole file, parsed once."""
    return yaml.safe_load(SOURCE.read_text())


def _key(key: Any) -> Any:
    if isinstance(key, str) and key.startswith("(") and key.endswith(")"):
        return tuple(yaml.safe_load(part) for part in key[1:-1].split(", "))
    return key


def _value(value: Any) -> Any:
    if isinstance(value, dict):
        return {_key(key): _value(item) for key, item in value.items()}
    if isinstance(value, list):
        return tuple(_value(item) for item in value)
    return value


def numbers(paper: str, table: str) -> Any:
    """The values of ``table`` of ``paper`` (``crt``, ``diml``, ``cross_attention``, ``dgcrl``)."""
    papers = load()
    if paper not in papers or "tables" not in papers[paper]:
        raise KeyError(
            f"papers.yaml has no paper {paper!r}; have {sorted(k for k, v in papers.items() if 'tables' in v)}"
        )
    tables = papers[paper]["tables"]
    if table not in tables:
        raise KeyError(f"papers.yaml: paper {paper!r} has no table {table!r}; have {sorted(tables)}")
    return _value(tables[table]["values"])


def reporting(table: str) -> str:
    """The one paper whose section holds ``table`` (``ESD``: the CRT paper, which alone measures the embedding
    geometry), so a shared table finds the paper by what it reports rather than by its name."""
    papers = [name for name, section in load().items() if table in (section.get("tables") or {})]
    if len(papers) != 1:
        raise KeyError(f"papers.yaml: table {table!r} is reported by {papers or 'no paper'}; expected exactly one")
    return papers[0]


def source(paper: str, table: str) -> str:
    """Where the numbers of ``table`` come from (the paper's table or figure)."""
    return load()[paper]["tables"][table]["source"]


def reported(config: str) -> dict[str, float]:
    """The numbers a paper reports for the protocol of ``plans/papers/<config>.yaml`` (metric → percent)."""
    return dict(load()["reported"][config]["values"])


PAPER_DATASET: dict[str, str] = dict(load()["stand_in"]["values"])  # embedded set → the paper dataset it stands beside
