"""``TypedConfig``: the base of every config dataclass whose fields a notebook's ``parameters`` cell mirrors.

It checks each field against its annotation when constructed (papermill injects whatever a user typed),
so a wrong type fails at once with the parameter's name, and builds a config from a notebook's globals.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Any, Mapping


@dataclasses.dataclass
class TypedConfig:
    def __post_init__(self) -> None:
        self.check_types()

    def check_types(self) -> None:
        """Every field must match its annotation (an int is accepted, and converted, for a float)."""
        hints = typing.get_type_hints(type(self))
        for spec in dataclasses.fields(self):
            value, expected = getattr(self, spec.name), hints[spec.name]
            if expected is float and isinstance(value, int) and not isinstance(value, bool):
                setattr(self, spec.name, float(value))
            elif (expected is int and isinstance(value, bool)) or not isinstance(value, expected):
                raise TypeError(f"parameter {spec.name!r} must be of type {expected.__name__}, got {type(value).__name__} {value!r}")

    @classmethod
    def field_names(cls) -> list[str]:
        return [spec.name for spec in dataclasses.fields(cls)]

    @classmethod
    def from_namespace(cls, namespace: Mapping[str, Any]):
        """Build from a notebook's globals (the ``parameters`` cell plus what papermill injected)."""
        return cls(**{name: namespace[name] for name in cls.field_names() if name in namespace})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
