"""What the command line shows without importing torch: the registered names and their one-line descriptions,
and the options of :class:`~dmlstudy.run.train.TrainConfig` and :class:`~dmlstudy.run.pretrain.PretrainConfig`.

The registries (``dmlstudy.methods``, ``dmlstudy.data``, ``dmlstudy.models``) and the configs live in modules
that import torch, torchvision and timm, which takes seconds. :func:`live_catalog` reads them; :func:`catalog`
keeps what it read in a cache file named by a digest of the source files it was read from (:data:`SOURCES`), in
the user's cache folder (``$XDG_CACHE_HOME/dmlstudy``, default ``~/.cache/dmlstudy``; ``DMLSTUDY_CACHE`` overrides
it). The first command after a change to those files reads the registries (seconds) and writes the cache; every
later one reads the cache (milliseconds). ``make install`` writes it once. With a plugin method module named in
``DMLSTUDY_METHOD_MODULES`` the registries are always read, so a plugin is never refused. Nothing is committed:
a stale catalogue cannot exist, only a missing one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parent
CACHE_VARIABLE = "DMLSTUDY_CACHE"  # the folder of the catalogue cache, instead of the user's cache folder
# what the catalogue is read from: the registries' packages (a new module file there can register a name) and the
# modules of the configs; the catalogue is current while these files are byte for byte those it was written from
SOURCES = ("methods/*.py", "data/*.py", "models/*.py", "config.py", "train.py", "pretrain.py")
PLUGIN_VARIABLE = "DMLSTUDY_METHOD_MODULES"  # dmlstudy.methods.PLUGIN_VARIABLE (a test keeps the two equal)
OPTION_TYPES = {kind.__name__: kind for kind in (bool, int, float, str, dict, list)}


@dataclass(frozen=True)
class MethodEntry:
    """A registered method as ``dmlstudy list methods`` shows it (:class:`dmlstudy.methods.MethodInfo` without
    its search space)."""

    label: str
    group: str
    paper: str
    summary: str


@dataclass(frozen=True)
class ConfigOption:
    """One field of a config dataclass as a command-line option: its type's name (a key of
    :data:`OPTION_TYPES`), default and help (the comment after the field, :meth:`TypedConfig.field_help`)."""

    name: str
    type: str
    default: Any
    help: str


@dataclass(frozen=True)
class Catalog:
    """The registered names, each with its one-line description, and the configs' options."""

    methods: dict[str, MethodEntry]  # by name, sorted
    datasets: dict[str, str]  # name → the first line of its builder's docstring
    backbones: dict[str, str]  # dmlstudy.models.list_backbones()
    optimizers: list[str]
    lr_schedules: list[str]
    train_description: str  # TrainConfig's docstring
    train_options: list[ConfigOption]
    pretrain_options: list[ConfigOption]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> Catalog:
        return cls(
            **{
                **values,
                "methods": {name: MethodEntry(**entry) for name, entry in values["methods"].items()},
                "train_options": [ConfigOption(**option) for option in values["train_options"]],
                "pretrain_options": [ConfigOption(**option) for option in values["pretrain_options"]],
            }
        )


def first_line(text: str | None) -> str:
    """The first line of a docstring, without its ``literal`` quotes."""
    lines = inspect.cleandoc(text or "").splitlines()
    return lines[0].replace("``", "") if lines else ""


def config_options(config_class: type) -> list[ConfigOption]:
    """The fields of a :class:`~dmlstudy.config.TypedConfig` dataclass, in order, with their defaults."""
    hints, comments, defaults = typing.get_type_hints(config_class), config_class.field_help(), config_class()
    options = []
    for name in config_class.field_names():
        if OPTION_TYPES.get(getattr(hints[name], "__name__", "")) is not hints[name]:
            raise TypeError(f"{config_class.__name__}.{name}: type {hints[name]!r} is not one of {list(OPTION_TYPES)}")
        options.append(ConfigOption(name, hints[name].__name__, getattr(defaults, name), comments[name]))
    return options


def live_catalog() -> Catalog:
    """The catalogue read from the registries and configs themselves (imports torch; plugin methods included)."""
    from dmlstudy.data import DATASETS, list_datasets
    from dmlstudy.methods import METHOD_INFO, discover, list_methods
    from dmlstudy.models import list_backbones
    from dmlstudy.run.pretrain import PretrainConfig
    from dmlstudy.run.train import OPTIMIZERS, SCHEDULES, TrainConfig

    discover()  # plugin modules named in DMLSTUDY_METHOD_MODULES since dmlstudy.methods was imported
    return Catalog(
        methods={
            name: MethodEntry(info.label, info.group, info.paper, info.summary)
            for name, info in ((name, METHOD_INFO[name]) for name in list_methods())
        },
        datasets={name: first_line(DATASETS[name].__doc__) for name in list_datasets()},
        backbones=list_backbones(),
        optimizers=sorted(OPTIMIZERS),
        lr_schedules=sorted(SCHEDULES),
        train_description=inspect.cleandoc(TrainConfig.__doc__ or ""),
        train_options=config_options(TrainConfig),
        pretrain_options=config_options(PretrainConfig),
    )


def source_digest() -> str:
    """SHA-256 of the files of :data:`SOURCES` (their paths and contents)."""
    digest = hashlib.sha256()
    for path in sorted({path for pattern in SOURCES for path in PACKAGE.glob(pattern)}):
        digest.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def cache_folder() -> Path:
    """Where catalogues are cached: ``$DMLSTUDY_CACHE``, else ``$XDG_CACHE_HOME/dmlstudy`` (``~/.cache/dmlstudy``)."""
    if os.environ.get(CACHE_VARIABLE):
        return Path(os.environ[CACHE_VARIABLE])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dmlstudy"


def cache_file(digest: str | None = None) -> Path:
    """The cache file of the catalogue read from the current sources (or those of ``digest``)."""
    return cache_folder() / f"catalog-{(digest or source_digest())[:20]}.json"


def stored_catalog(digest: str | None = None) -> Catalog | None:
    """The cached catalogue of the current sources (or of ``digest``); ``None`` when there is none or it is damaged."""
    try:
        return Catalog.from_json(json.loads(cache_file(digest).read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_catalog(digest: str | None = None, live: Catalog | None = None) -> Path:
    """Write :func:`live_catalog` (the package's own registries: plugin methods are not written) to its cache file;
    the file appears whole or not at all."""
    if os.environ.get(PLUGIN_VARIABLE, "").strip():
        raise RuntimeError(f"unset {PLUGIN_VARIABLE} to write the catalogue: plugin methods are not part of it")
    path = cache_file(digest)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    partial.write_text(
        json.dumps((live or live_catalog()).to_json(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    partial.replace(path)
    return path


def catalog() -> Catalog:
    """The cached catalogue of the current sources; read from the registries (and cached) when there is none, and
    always read from them while a plugin module is named."""
    if os.environ.get(PLUGIN_VARIABLE, "").strip():
        return live_catalog()
    digest = source_digest()
    stored = stored_catalog(digest)
    if stored is not None:
        return stored
    live = live_catalog()
    try:
        write_catalog(digest, live)
    except OSError:  # a read-only home: every command reads the registries
        pass
    return live


if __name__ == "__main__":
    print(f"written: {write_catalog()}", file=sys.stderr)
