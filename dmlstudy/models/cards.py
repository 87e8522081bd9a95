"""Model cards: the markdown file beside a weights file that says what it is and how to rebuild it.

A card is ``<weights stem>.md``: a YAML front matter block (between ``---`` lines) with the machine-read
fields (``backbone``, ``sha256`` of the weights file, the source dataset and its generator version, the
pretraining configuration, the measured source accuracy, ``command`` to rebuild it), then free markdown
for people. :func:`dmlstudy.models.backbones.load_backbone_checkpoint` reads the card when one is there
and refuses a weights file whose SHA-256 differs from the card's.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml

FRONT_MATTER = "---"


class ModelCardError(ValueError):
    """A model card is unreadable or lacks a field; the message names the card and the field."""


class CheckpointError(ValueError):
    """A backbone weights file (or its model card) cannot be used; the message names the file and what was expected."""


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def card_path(weights: str | Path) -> Path:
    """The card of a weights file: same folder and stem, suffix ``.md``."""
    return Path(weights).with_suffix(".md")


def write_card(weights: str | Path, fields: dict[str, Any], body: str = "") -> Path:
    """Write ``fields`` (YAML front matter, keys in the given order) and ``body`` as the card of ``weights``."""
    path = card_path(weights)
    text = f"{FRONT_MATTER}\n{yaml.safe_dump(fields, sort_keys=False, allow_unicode=True, width=1000)}{FRONT_MATTER}\n\n{body.strip()}\n"
    path.write_text(text, encoding="utf-8")
    return path


def read_card(path: str | Path, *, required: tuple[str, ...] = ("sha256",)) -> dict[str, Any]:
    """The front-matter fields of the card at ``path``; :class:`ModelCardError` when it has none or lacks ``required``."""
    path = Path(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    try:
        end = lines.index(FRONT_MATTER, 1)
    except ValueError:
        end = -1
    if not lines or lines[0] != FRONT_MATTER or end < 0:
        raise ModelCardError(f"model card {path}: expected a YAML front matter block between '---' lines at the top")
    try:
        fields = yaml.safe_load("\n".join(lines[1:end])) or {}
    except yaml.YAMLError as error:
        raise ModelCardError(f"model card {path}: front matter is not valid YAML ({error})") from error
    missing = [key for key in required if key not in fields]
    if not isinstance(fields, dict) or missing:
        raise ModelCardError(f"model card {path}: missing field(s) {missing}; expected at least {list(required)}")
    return fields


def check_weights(weights: str | Path, card: str | Path, *, backbone: str | None = None) -> dict[str, Any]:
    """The fields of ``card`` once ``weights`` is shown to be the file it describes: the file's SHA-256 is the
    card's ``sha256``, and the card's ``backbone`` (when it has one) is ``backbone`` (when given).

    Raises :class:`CheckpointError` naming the file, the card and, when the card records one, the ``command``
    that rebuilds the file.
    """
    weights, card = Path(weights), Path(card)
    try:
        fields = read_card(card)
    except (ModelCardError, OSError) as error:
        raise CheckpointError(f"checkpoint {weights}: its model card {card} cannot be read: {error}") from error
    actual = sha256_file(weights)
    if actual != str(fields["sha256"]):
        rebuild = f"; rebuild it with `{fields['command']}`" if fields.get("command") else ""
        raise CheckpointError(
            f"checkpoint {weights}: SHA-256 {actual} does not match {fields['sha256']} recorded in its model card "
            f"{card} (the file is damaged or was replaced){rebuild}"
        )
    if backbone and fields.get("backbone") and fields["backbone"] != backbone:
        raise CheckpointError(
            f"checkpoint {weights} holds backbone {fields['backbone']!r} (its model card {card}), expected {backbone!r}"
        )
    return fields
