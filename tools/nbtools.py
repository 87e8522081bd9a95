"""Authoring helpers for the study's notebooks: build a notebook from (kind, source) cells, and write the
``parameters`` cell of a config dataclass (one line per field, typed, commented), so the two stay in step.

Used by the ``tools/make_*.py`` scripts that (re)write ``notebooks/*.ipynb`` without outputs.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import typing
from pathlib import Path

import nbformat


def parameter_lines(config_class: type, overrides: dict | None = None) -> str:
    """``name: type = literal  # comment`` for every field of ``config_class`` (comments from its source)."""
    overrides = overrides or {}
    source = "\n".join(inspect.getsource(klass) for klass in reversed(config_class.__mro__) if dataclasses.is_dataclass(klass))
    comments = {}
    for line in source.splitlines():
        stripped = line.strip()
        if ":" in stripped and "#" in stripped and not stripped.startswith(("#", '"')):
            comments[stripped.split(":")[0].strip()] = stripped.split("#", 1)[1].strip()
    hints = typing.get_type_hints(config_class)
    lines = []
    for spec in dataclasses.fields(config_class):
        if spec.name in overrides:
            value = overrides[spec.name]
        elif spec.default is not dataclasses.MISSING:
            value = spec.default
        else:
            value = spec.default_factory()
        ast.literal_eval(repr(value))
        comment = comments.get(spec.name, "").replace("=", "＝")  # papermill cannot parse a comment holding "="
        lines.append(f"{spec.name}: {hints[spec.name].__name__} = {value!r}  # {comment}".rstrip())
    return "\n".join(lines)


def build_notebook(cells: list[tuple[str, str]], path: str | Path) -> None:
    """Write a notebook of ``(kind, source)`` cells; kind is ``md``, ``code`` or ``parameters``.

    A ``study`` parameter defaults to ``notebook-<stem>``: the CI-sized runs of different notebooks (run as
    they are, e.g. by nbval) never share run folders, while plans inject one study for all of them.
    """
    study_line = re.compile(r"^study: str = '[^']*'", re.MULTILINE)
    cells = [(kind, study_line.sub(f"study: str = 'notebook-{Path(path).stem}'", source) if kind == "parameters" else source) for kind, source in cells]
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    notebook.metadata["language_info"] = {"name": "python"}
    for kind, source in cells:
        source = inspect.cleandoc(source)
        if kind == "md":
            cell = nbformat.v4.new_markdown_cell(source)
        else:
            cell = nbformat.v4.new_code_cell(source)
            if kind == "parameters":
                cell.metadata["tags"] = ["parameters"]
        notebook.cells.append(cell)
    for index, cell in enumerate(notebook.cells):
        cell["id"] = f"cell-{index:02d}"
    nbformat.validate(notebook)
    Path(path).write_text(nbformat.writes(notebook) + "\n")
