"""``TypedConfig``: the base of every config dataclass whose fields a notebook's ``parameters`` cell mirrors.

It checks each field against its annotation when constructed (papermill injects whatever a user typed),
so a wrong type fails at once with the parameter's name, and builds a config from a notebook's globals. A field
annotated with another ``TypedConfig`` (a study notebook's ``protocol``) is one parameter holding a mapping, as
papermill injects it: built into that config, its keys checked, its errors naming ``protocol.<key>``.

:func:`load_yaml` is the one reader of every YAML the project accepts (plans, ``--config`` files,
``--method-kwargs`` and other YAML-valued options, stored ``config.yaml`` records).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import re
import textwrap
import tokenize
import typing
from collections.abc import Mapping
from typing import Any

import yaml


@dataclasses.dataclass
class TypedConfig:
    def __post_init__(self) -> None:
        self.check_types()

    def check_types(self) -> None:
        """Every field must match its annotation (an int is accepted, and converted, for a float; a mapping, built
        with :meth:`from_mapping`, for a nested ``TypedConfig``)."""
        hints = typing.get_type_hints(type(self))
        for spec in dataclasses.fields(self):
            value, expected = getattr(self, spec.name), hints[spec.name]
            if is_typed_config(expected) and not isinstance(value, expected):
                if not isinstance(value, Mapping):
                    raise TypeError(
                        f"parameter {spec.name!r} must be a mapping (dict) of {expected.__name__} fields, got "
                        f"{type(value).__name__} {value!r}"
                    )
                setattr(self, spec.name, expected.from_mapping(value, parameter=spec.name))
            elif expected is float and isinstance(value, int) and not isinstance(value, bool):
                setattr(self, spec.name, float(value))
            elif (expected is int and isinstance(value, bool)) or not isinstance(value, expected):
                raise TypeError(
                    f"parameter {spec.name!r} must be of type {expected.__name__}, got {type(value).__name__} {value!r}"
                )

    def check_choice(self, name: str, choices: typing.Sequence[str]) -> None:
        """Field ``name`` must be one of ``choices`` (the error names the parameter and lists them)."""
        value = getattr(self, name)
        if value not in choices:
            raise ValueError(f"parameter {name!r} must be one of {list(choices)}, got {value!r}")

    @classmethod
    def field_names(cls) -> list[str]:
        return [spec.name for spec in dataclasses.fields(cls)]

    @classmethod
    def field_help(cls) -> dict[str, str]:
        """The comment written after each field in the class source (``name: type = default  # comment``), by
        field name, inherited fields included; the one description of a field that the CLI's ``--help``, the
        notebooks' ``parameters`` cells and ``dmlstudy list`` show.

        Read from the source with :mod:`ast` (which lines hold which field, multi-line defaults included) and
        :mod:`tokenize` (the comments, so a ``#`` inside a string default is not taken for one). A class whose
        source cannot be read (defined interactively) contributes no comments; a field without one maps to ``""``.
        """
        comments: dict[str, str] = {}
        for klass in reversed(cls.__mro__):
            if not dataclasses.is_dataclass(klass):
                continue
            try:
                source = textwrap.dedent(inspect.getsource(klass))
            except (OSError, TypeError):
                continue
            by_line: dict[int, str] = {}
            for token in tokenize.generate_tokens(io.StringIO(source).readline):
                if token.type == tokenize.COMMENT:
                    by_line[token.start[0]] = token.string.lstrip("#").strip()
            body = next(node for node in ast.parse(source).body if isinstance(node, ast.ClassDef)).body
            for statement in body:
                if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                    lines = range(statement.lineno, (statement.end_lineno or statement.lineno) + 1)
                    text = " ".join(by_line[line] for line in lines if line in by_line)
                    if text or statement.target.id not in comments:  # a redefinition without a comment keeps the base's
                        comments[statement.target.id] = text
        return {name: comments.get(name, "") for name in cls.field_names()}

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, parameter: str):
        """Build from ``values``, the mapping a notebook's parameter ``parameter`` holds (keys left out keep their
        defaults). An unknown key is an error listing the valid ones; a wrong value's error names the key as
        ``<parameter>.<key>`` (``parameter 'protocol.seeds' must be of type list, …``)."""
        unknown = sorted(set(values) - set(cls.field_names()))
        if unknown:
            raise TypeError(f"parameter {parameter!r} has no keys {unknown}; valid keys: {cls.field_names()}")
        try:
            return cls(**values)
        except (TypeError, ValueError) as error:
            kind = TypeError if isinstance(error, TypeError) else ValueError
            raise kind(qualified_message(str(error), parameter)) from None

    @classmethod
    def from_namespace(cls, namespace: Mapping[str, Any]):
        """Build from a notebook's globals (the ``parameters`` cell plus what papermill injected)."""
        return cls(**{name: namespace[name] for name in cls.field_names() if name in namespace})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def is_typed_config(annotation: Any) -> bool:
    """Whether a field's annotation is a ``TypedConfig`` dataclass (a nested config: one mapping parameter)."""
    return isinstance(annotation, type) and issubclass(annotation, TypedConfig)


def qualified_message(message: str, parameter: str) -> str:
    """An error message of a nested config as its parent reports it: every ``parameter 'key'`` named
    ``parameter '<parameter>.key'``; a message naming no parameter is said to be about ``parameter``."""
    renamed, count = re.subn(r"\b(parameters? )'([^']+)'", lambda m: f"{m[1]}'{parameter}.{m[2]}'", message)
    return renamed if count else f"parameter {parameter!r}: {message}"


class Yaml12Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that also reads YAML 1.2 floats without a dot (``1e-3``, ``5E-4``, ``2e+1``).

    PyYAML follows YAML 1.1, whose float pattern needs a ``.``, so ``lr: 1e-3`` (the way every DML config
    writes learning rates) came back as the string ``"1e-3"``. Decision: add the YAML 1.2 core-schema float
    pattern as one more implicit resolver instead of coercing by field type, so a plan, a ``--config`` file
    and a free-form ``method_kwargs`` mapping all read numbers the same way. Integers still resolve first
    (``10`` stays an int); everything else is the safe loader unchanged.
    """


Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def load_yaml(text: str) -> Any:
    """Parse YAML text with :class:`Yaml12Loader` (safe; ``1e-3`` is a float)."""
    return yaml.load(text, Loader=Yaml12Loader)
