"""Checks of a rendered emoji build: near-identical renders, and the fingerprint that compares two builds.

Near-identical renders (:func:`near_identical_pairs`): two images of one family in two classes whose rendered
pixels differ nowhere by more than :data:`NEAR_DUPLICATE_LEVELS` of 255 levels in any channel. Their SVG texts
differ, their images do not: fluent-emoji-flat's "black-medium-square" and "white-square-button" render
identically, emojione's "black-circle" and "new-moon" differ by faint shading, several families' white shapes on
white differ only by a faint outline. The build (:mod:`dmlstudy.data.emoji`) removes both designs, as for an
ambiguous design: every class keeps the designs its other families draw, and merging the two classes would
wrongly call two emoji one. Decision: the threshold is one eighth of the range. The smallest difference seen
between two renders that a viewer tells apart at once (a white circle and a white square on white) is 25–47
levels of faint outline, so the rule also removes such barely visible pairs; a drawn detail (a clock's hands,
the dot of the dotted star) differs by more than 128 levels.

The fingerprint (:func:`build_fingerprint`): one line per class with the cut sha256 of each family's PNG, so
that two machines' builds compare image by image (:func:`fingerprint_difference`).
"""

from __future__ import annotations

import gzip
import hashlib
import io
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

NEAR_DUPLICATE_LEVELS = 32  # two renders differing nowhere by more than this (of 255) are near-identical
DIGEST_CHARACTERS = 12  # hex characters of an image's sha256 kept in the fingerprint


def decode_png(png: bytes) -> np.ndarray:
    """An ``H × W × 3`` uint8 array of PNG bytes."""
    with Image.open(io.BytesIO(png)) as image:
        return np.asarray(image.convert("RGB"))


def near_identical_pairs(
    images: np.ndarray, labels: Sequence[Any], *, levels: int = NEAR_DUPLICATE_LEVELS, block: int = 8
) -> list[tuple[int, int]]:
    """Index pairs ``(i, j)``, ``i < j``, of images with different labels that differ nowhere by more than
    ``levels`` (of 255) in any channel: ``max |images[i] − images[j]| ≤ levels``.

    ``images``: ``N × H × W × 3`` uint8. Exact: the means over ``block × block`` tiles of two such images also
    differ by at most ``levels``, so only pairs passing that test on the tiles (a tenth of the work per pair) are
    compared pixel by pixel.
    """
    images = np.asarray(images)
    if images.ndim != 4 or images.dtype != np.uint8:
        raise ValueError(
            f"near_identical_pairs: expected N × H × W × C uint8 images, got {images.shape} {images.dtype}"
        )
    n, height, width, channels = images.shape
    if len(labels) != n:
        raise ValueError(f"near_identical_pairs: {n} images but {len(labels)} labels")
    codes = np.unique(np.asarray(labels, dtype=object).astype(str), return_inverse=True)[1]
    rows, cols = height // block * block, width // block * block
    tiles = images[:, :rows, :cols].reshape(n, rows // block, block, cols // block, block, channels)
    tiles = tiles.mean(axis=(2, 4), dtype=np.float32).reshape(n, -1)
    pairs = []
    for i in range(n - 1):
        others = np.arange(i + 1, n)
        others = others[codes[others] != codes[i]]
        close = others[np.abs(tiles[others] - tiles[i]).max(axis=1) <= levels]
        for j in close:
            if np.abs(images[i].astype(np.int16) - images[j].astype(np.int16)).max() <= levels:
                pairs.append((i, int(j)))
    return pairs


def near_identical_designs(
    png: Mapping[tuple[str, str], bytes], *, levels: int = NEAR_DUPLICATE_LEVELS
) -> list[tuple[tuple[str, str], tuple[str, str]]]:
    """Pairs of designs ``((class, family), (class, family))`` of one family in two classes whose renders are
    near-identical (:func:`near_identical_pairs`), family by family."""
    pairs = []
    for family in sorted({family for _, family in png}):
        keys = sorted(key for key in png if key[1] == family)
        images = np.stack([decode_png(png[key]) for key in keys])
        pairs += [(keys[i], keys[j]) for i, j in near_identical_pairs(images, [c for c, _ in keys], levels=levels)]
    return pairs


def digest_of(data: bytes) -> str:
    """The first :data:`DIGEST_CHARACTERS` hex characters of the sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()[:DIGEST_CHARACTERS]


def build_fingerprint(classes: Mapping[str, Iterable[str]], digests: Mapping[tuple[str, str], str]) -> str:
    """The fingerprint text: a header, then one line per class of ``classes`` (class name → its design
    families, in class-id order), ``<class id> <TAB> <name> <TAB> <family>=<digest> …`` (families sorted);
    ``digests`` maps ``(class name, family)`` to :func:`digest_of` its PNG."""
    lines = ["# emoji build: class id, class name, then each family's design as <family>=<sha256 of its PNG, cut>"]
    for c, (name, families) in enumerate(classes.items(), start=1):
        designs = " ".join(f"{family}={digests[name, family]}" for family in sorted(families))
        lines.append(f"{c}\t{name}\t{designs}")
    return "\n".join(lines) + "\n"


def read_fingerprint(path: str | Path) -> str:
    """The text of a fingerprint file, gzipped (``.gz``: the committed published fingerprint) or not."""
    path = Path(path)
    data = path.read_bytes()
    return (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8")


def parse_fingerprint(text: str) -> dict[str, dict[str, str]]:
    """class name → family → digest, from a fingerprint text (:func:`build_fingerprint`)."""
    parsed = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != 3:
            raise ValueError(f"fingerprint line {number}: expected '<id>\\t<name>\\t<family>=<digest> …', got {line!r}")
        parsed[fields[1]] = dict(design.split("=", 1) for design in fields[2].split())
    return parsed


def fingerprint_difference(built: str, published: str) -> str:
    """ "" when two fingerprints are equal, else one sentence saying how the build differs from the published one."""
    if built == published:
        return ""
    mine, theirs = parse_fingerprint(built), parse_fingerprint(published)
    added, removed = sorted(set(mine) - set(theirs)), sorted(set(theirs) - set(mine))
    changed = sorted(name for name in set(mine) & set(theirs) if mine[name] != theirs[name])
    parts = [
        f"{len(added)} classes not in it (e.g. {', '.join(added[:3])})" if added else "",
        f"{len(removed)} of its classes missing (e.g. {', '.join(removed[:3])})" if removed else "",
        f"{len(changed)} classes with other images (e.g. {', '.join(changed[:3])})" if changed else "",
    ]
    parts = [part for part in parts if part] or ["the same classes and images in another order or split"]
    return "; ".join(parts)


__all__ = [
    "DIGEST_CHARACTERS",
    "NEAR_DUPLICATE_LEVELS",
    "build_fingerprint",
    "decode_png",
    "digest_of",
    "fingerprint_difference",
    "near_identical_designs",
    "near_identical_pairs",
    "parse_fingerprint",
    "read_fingerprint",
]
