"""A run folder's identity and records: which fields name a run, its folder, ``config.yaml`` with each value's
origin, whether a folder holds a finished run, and the ledger of the runs a plan's notebooks reported. What a run
checks and holds while it writes its folder (checks before data, one writer, signals) is
:mod:`dmlstudy.run.guard`.

Decisions (docs/run_safety.md):

* **Identity.** A run is identified by the fields of its :class:`~dmlstudy.run.train.TrainConfig` that change
  what it computes: every field except :data:`NON_IDENTITY_FIELDS` (where it is written, its label, the
  device, progress bars, loader workers, the evaluation batch size and the resume/overwrite switches).
  :func:`identity_hash` is the first 8 hex digits of the SHA-256 of those fields as sorted JSON; a field
  added to ``TrainConfig`` later therefore changes every hash (old folders are left alone, never reused
  by mistake), unless it is listed in :data:`NON_IDENTITY_FIELDS` or in :data:`HASHED_WHEN_SET`: a field
  added with a default that computes exactly what the runs before it computed (the pretrained regime's
  ``backbone_lr_scale`` = 1 and ``warmup_epochs`` = 0) enters the identity only when set to another value,
  so the folders recorded before it existed keep their names and are reused.
* **Folder name.** ``<label>-<hash8>``, where the label is ``run_name`` when given, else
  ``<dataset>-<method>-seed<seed>``. The hash is always appended, also to an explicit ``run_name``, so two
  configurations never share a folder whatever their names; a ``run_name`` that already ends in its own
  hash (a folder name given back, e.g. by :func:`dmlstudy.experiments.explore.load_run`) is used as is.
  ``config.yaml`` in the folder is the record of the configuration.
* **Finished.** A folder with ``config.yaml``, ``metrics.json`` and ``checkpoint.pt`` holds a finished run
  (:func:`is_complete`), unless its reported checkpoint is a warm-up epoch (:func:`chosen_in_warmup`), which only
  the selection rule before 2026-11-26 could choose.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from dmlstudy.config import load_yaml

NON_IDENTITY_FIELDS = (
    "study",
    "run_name",
    "runs_root",
    "data_root",
    "device",
    "num_workers",
    "eval_batch_size",
    "progress",
    "resume",
    "overwrite",
)
HASHED_WHEN_SET = {  # field → the value that reproduces the runs recorded before the field existed
    "backbone_lr_scale": 1.0,
    "warmup_epochs": 0,
    "stem_views": 0,
    "conv_head": True,
}
ACTIONS = ("resume", "overwrite")  # fields that say what to do with a run folder, recorded off in config.yaml
RECORD_FILES = ("metrics.json", "checkpoint.pt", "history.csv", "embeddings.npz", "environment.json", "config.yaml")
# The revision of the rule that chooses a run's reported checkpoint (checkpoint_selection.CheckpointSelection); a plan executes
# its entries again when it changes (study.entry_inputs).
SELECTION_RULE = "2026-11-26"
LEDGER_VARIABLE = "DMLSTUDY_RUN_LEDGER"  # set by the study runner for each notebook's kernel: see note_used()
LEDGER_NAME = "runs.txt"  # the ledger's name in a plan entry's folder


class RunWarning(UserWarning):
    """Something about a run looks wrong but may be intended (the CLI prints it as ``warning: …``)."""


def warn(message: str) -> None:
    warnings.warn(message, RunWarning, stacklevel=3)


# ---------------------------------------------------------------------------------------------- identity


def identity(values: Mapping[str, Any]) -> dict[str, Any]:
    """The result-changing fields of a config dict (see the module docstring)."""
    return {
        key: value
        for key, value in values.items()
        if key not in NON_IDENTITY_FIELDS and not (key in HASHED_WHEN_SET and value == HASHED_WHEN_SET[key])
    }


def identity_hash(values: Mapping[str, Any]) -> str:
    """8 hex digits of the SHA-256 of :func:`identity` as sorted, compact JSON."""
    text = json.dumps(identity(values), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def folder_name(values: Mapping[str, Any]) -> str:
    """``<run_name or dataset-method-seed<seed>>-<hash8>``; a label ending in its own hash is kept as is."""
    label = values.get("run_name") or f"{values['dataset']}-{values['method']}-seed{values['seed']}"
    digest = identity_hash(values)
    return label if label.endswith(f"-{digest}") else f"{label}-{digest}"


def differing_fields(stored: Mapping[str, Any], requested: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{field: (stored, requested)}`` for the identity fields whose values differ."""
    stored = {**HASHED_WHEN_SET, **stored}  # a record written before a field existed ran at its neutral value
    requested = {**HASHED_WHEN_SET, **requested}
    return {
        key: (stored.get(key), value)
        for key, value in requested.items()
        if key not in NON_IDENTITY_FIELDS and stored.get(key) != value
    }


def describe_differences(differing: Mapping[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{key}: stored {old!r} ≠ requested {new!r}" for key, (old, new) in differing.items())


def read_config_record(run_dir: Path) -> dict[str, Any] | None:
    """The ``config.yaml`` of a run folder (None when there is none)."""
    path = Path(run_dir) / "config.yaml"
    return (load_yaml(path.read_text()) or {}) if path.is_file() else None


# ---------------------------------------------------------------------------------------------- origins
#
# Where each value of a run's configuration came from (``default``, ``protocol``, ``regime: <name>``,
# ``tuned: <file>``, ``variant``: :func:`dmlstudy.run.protocol.resolve_run`) is recorded as an end-of-line
# comment per key of ``config.yaml``. Decision: comments, not fields, so that the configuration, its identity hash
# and every reader of the record (:func:`differing_fields`, ``dmlstudy train --config``) stay what they were. The
# origins travel with the config object as an attribute of the instance (:func:`with_origins`), not a dataclass
# field: a copy of the config (``dataclasses.replace``, ``TrainConfig(**values)``) starts without them, and a run
# without origins writes the plain record it always wrote. The engine passes them to its worker beside the
# config's values (:func:`dmlstudy.study.engine.train_task`).

ORIGINS_ATTRIBUTE = "origins"
ORIGINS_HEADER = "# after each value, where it came from: default, protocol, regime: <name>, tuned: <file> or variant\n"


def with_origins(config, origins: Mapping[str, str]):
    """``config`` carrying ``origins`` (key → origin; keys are fields or dotted ``method_kwargs`` paths), which
    its run records in ``config.yaml``; returns ``config``."""
    setattr(config, ORIGINS_ATTRIBUTE, dict(origins))
    return config


def origins_of(config) -> dict[str, str]:
    """The origins ``config`` carries ({} for a config built without them)."""
    return dict(getattr(config, ORIGINS_ATTRIBUTE, None) or {})


def commented_yaml(values: Mapping[str, Any], comments: Mapping[str, str], prefix: str = "") -> str:
    """``values`` as block YAML, the same text as ``yaml.safe_dump(values, sort_keys=False)``, with
    ``  # <comments[key]>`` after each key that has one (nested keys dotted: ``method_kwargs.loss_kwargs.alpha``).
    A key of a non-empty mapping gets its comment on its own line; a long scalar that YAML wraps, on its last."""
    lines: list[str] = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        comment = f"  # {comments[path]}" if comments.get(path) else ""
        if isinstance(value, Mapping) and value:
            lines.append(
                yaml.safe_dump({key: {}}).rstrip("\n").removesuffix(" {}") + comment
            )  # "key:" as YAML writes it
            lines += ["  " + line for line in commented_yaml(value, comments, f"{path}.").splitlines()]
            continue
        chunk = yaml.safe_dump({key: value}, sort_keys=False).rstrip("\n").splitlines()
        if comment:
            at = 0 if len(chunk) == 1 or chunk[0].endswith(":") else len(chunk) - 1  # ":": a block list follows
            chunk[at] += comment
        lines += chunk
    return "".join(f"{line}\n" for line in lines)


def config_record_text(values: Mapping[str, Any], origins: Mapping[str, str]) -> str:
    """The text of ``config.yaml``: ``values`` as YAML, with each value's origin as a comment when known."""
    if not origins:
        return yaml.safe_dump(dict(values), sort_keys=False)
    return ORIGINS_HEADER + commented_yaml(values, origins)


def is_complete(run_dir: Path) -> bool:
    """Whether a folder holds a finished run: its configuration, final metrics and checkpoint, with a
    checkpoint the current selection rule could have chosen (not :func:`chosen_in_warmup`)."""
    run_dir = Path(run_dir)
    recorded = all((run_dir / name).is_file() for name in ("config.yaml", "metrics.json", "checkpoint.pt"))
    return recorded and chosen_in_warmup(run_dir) is None


def chosen_in_warmup(run_dir: Path) -> int | None:
    """The warm-up epoch a finished run reports its checkpoint from, or None. Only the rule before 2026-11-26
    chose warm-up epochs (:class:`dmlstudy.run.checkpoint_selection.CheckpointSelection`); such a record is trained again, as a
    run of the current rule would differ from it. Every other record is what the current rule computes, since
    the two rules agree on a run whose best evaluation came after its warm-up."""
    try:
        metrics = json.loads((Path(run_dir) / "metrics.json").read_text())
    except (OSError, ValueError):
        return None
    best, cap = metrics.get("best_epoch"), metrics.get("epochs")
    if not isinstance(best, int) or (isinstance(cap, int) and best >= cap):  # warmup_epochs < epochs
        return None
    warmup = int((read_config_record(run_dir) or {}).get("warmup_epochs") or 0)
    return best if 0 < best <= warmup else None


def copy_finished_runs(source: Path, target: Path) -> list[str]:
    """Copy every finished run folder of ``source`` (:func:`is_complete`) that ``target`` lacks; returns the
    copied names. Unfinished folders (an interrupted run's checkpoint) and notebook-entry folders are left
    behind: the copy holds only records a run of the same identity loads instead of training. A missing
    ``source`` copies nothing (a fresh clone trains every run)."""
    source, target = Path(source), Path(target)
    if not source.is_dir():
        return []
    copied = []
    for run_dir in sorted(source.iterdir()):
        if run_dir.is_dir() and is_complete(run_dir) and not (target / run_dir.name).exists():
            partial = target.parent / f".{target.name}-{run_dir.name}.copying"  # outside the study: never gathered
            target.mkdir(parents=True, exist_ok=True)
            shutil.copytree(run_dir, partial, dirs_exist_ok=True)
            partial.rename(target / run_dir.name)
            copied.append(run_dir.name)
    return copied


def note_used(run_dir: Path) -> None:
    """Append the run folder's name to the ledger :data:`LEDGER_VARIABLE` names, if any: the study runner
    gives each notebook of a plan its own (``<study>/<entry>/runs.txt``, emptied when the entry starts), so
    after a plan every entry lists the runs it reported. One short line per append, so processes that write
    one ledger at once do not interleave."""
    ledger = os.environ.get(LEDGER_VARIABLE)
    if ledger:
        with open(ledger, "a", encoding="utf-8") as handle:
            handle.write(f"{Path(run_dir).name}\n")


def superseded_runs(study_dir: Path) -> set[str]:
    """The run folders of a study that a newer configuration of the same run has replaced.

    A folder is superseded when no entry's ledger (:func:`note_used`) names it but one names another folder
    of the same run label (``run_name`` of its ``config.yaml``, the folder name without its hash): the same
    run under an older configuration, left behind when tuned values or the protocol changed. Nothing is
    superseded unless every plan entry of the study (a folder with a ``study_entry.json``) has a ledger: an
    entry last executed before ledgers existed may report any run, so a study in that state, like one with no
    ledgers at all (runs trained by hand), keeps every run. A folder whose label no ledger names (an ad-hoc
    run beside the plan's) is kept."""
    study_dir = Path(study_dir)
    if any(not (entry.parent / LEDGER_NAME).is_file() for entry in study_dir.glob("*/study_entry.json")):
        return set()
    named = {
        line.strip()
        for ledger in study_dir.glob(f"*/{LEDGER_NAME}")
        for line in ledger.read_text(encoding="utf-8").splitlines()
        if line.strip()
    }
    if not named:
        return set()

    def label(run_dir: Path) -> str:
        stored = read_config_record(run_dir) or {}
        return str(stored.get("run_name") or run_dir.name.rsplit("-", 1)[0])

    labels = {path.parent.name: label(path.parent) for path in study_dir.glob("*/config.yaml")}
    current = {labels[name] for name in named if name in labels}
    return {name for name, run_label in labels.items() if name not in named and run_label in current}


def resume_command(run_dir: Path) -> str:
    return f"dmlstudy train --config {shlex.quote(str(Path(run_dir) / 'config.yaml'))} --resume"
