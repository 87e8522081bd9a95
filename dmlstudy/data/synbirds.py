"""SynBirds-200: a procedurally generated, fine-grained, birds-like dataset in the CUB-200-2011 layout.

What it imitates from CUB-200-2011 (what makes it hard):

* **Classes are combinations of local part attributes on one shared body plan** (:data:`PARTS`): the
  structure (body shape, beak shape, tail shape, crest) and the plumage (colours of head, body, wing,
  breast, tail and beak; wing pattern, body pattern, eye marking).
* **A hierarchy with small inter-class differences** (:func:`class_attributes`): a *family* fixes the
  structure, a *genus* draws the plumage, and the *species* of a genus are the genus plumage with one
  plumage part changed. Two species of one genus thus differ in one or two parts; genera of one
  family share the silhouette.
* **Strong nuisance variation independent of the class** (:func:`render_bird`): position, scale,
  rotation, horizontal flip, a mild colour shift (per-channel gains, so colour-defined parts stay
  identifiable), a cluttered background drawn with the same palette as the birds, a perch, partial
  occlusion by foreground leaves, and pixel noise.

Default size: 200 classes × 40 images of 64 × 64 RGB; classes 1–100 train, 101–200 test (zero-shot,
as in CUB). Images are drawn at twice the size and box-downsampled (anti-aliasing). The class
definitions are written to ``class_attributes.json`` in the dataset folder.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from PIL import Image, ImageChops, ImageDraw

from dmlstudy.data.embedded import (
    SquareImagesGenerator,
    encode_png,
    image_rng,
    register_generated,
)

ATTRIBUTES_FILE = "class_attributes.json"
SPECIES_PER_GENUS = 5
GENERA_PER_FAMILY = 4

PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (200, 35, 35),
    "orange": (240, 135, 25),
    "yellow": (240, 215, 45),
    "green": (55, 150, 55),
    "teal": (25, 150, 150),
    "blue": (40, 75, 205),
    "purple": (125, 55, 165),
    "brown": (120, 72, 38),
    "grey": (135, 135, 135),
    "black": (28, 28, 28),
    "white": (238, 238, 238),
    "buff": (215, 185, 130),
}
COLOURS = tuple(PALETTE)
BEAK_COLOURS = ("black", "yellow", "orange", "grey", "red")

# Structure parts are fixed per family; plumage parts are drawn per genus and varied per species.
STRUCTURE_PARTS: dict[str, tuple[str, ...]] = {
    "body_shape": ("round", "slim", "long"),
    "beak_shape": ("cone", "needle", "hook", "thick", "curved"),
    "tail_shape": ("fan", "fork", "pointed", "square"),
    "crest": ("none", "tuft", "long", "spiky"),
}
PLUMAGE_PARTS: dict[str, tuple[str, ...]] = {
    "head_color": COLOURS,
    "body_color": COLOURS,
    "breast_color": COLOURS,
    "wing_color": COLOURS,
    "tail_color": COLOURS,
    "beak_color": BEAK_COLOURS,
    "wing_pattern": ("plain", "bars", "spots", "dark_tips"),
    "body_pattern": ("plain", "stripes", "spots", "bars"),
    "eye_marking": ("none", "ring", "stripe", "mask", "brow"),
}
PARTS: dict[str, tuple[str, ...]] = STRUCTURE_PARTS | PLUMAGE_PARTS

GENUS_STEMS = ("Acantho", "Bory", "Cala", "Dendro", "Eremo", "Ficedo", "Garru", "Hylo", "Ictero", "Junco")
GENUS_ENDINGS = ("ula", "ops", "ella", "ornis")
EPITHETS = ("vulgaris", "minor", "major", "rufus", "pallidus", "niger", "ornatus", "minimus")

# Nuisance ranges (canvas fractions / degrees), see render_bird.
SCALE_RANGE = (0.8, 1.1)
MAX_ANGLE = 20.0
MAX_SHIFT = 0.12
GAIN_RANGE = (0.9, 1.1)
NOISE_STD = 4.0
BODY_UNIT = 0.48  # canonical unit (≈ body length) as a fraction of the canvas at scale 1
CLUTTER_RANGE = (4, 9)  # number of background clutter items, [low, high)
PERCH_P = 0.6
BEAK_SCALE = 1.25  # beaks drawn 25 % larger than their outlines so beak colour/shape read at 64 px
OCCLUSION_P = 0.4


# ----------------------------------------------------------------------------------------------
# Class definitions
# ----------------------------------------------------------------------------------------------
def genus_sizes(num_classes: int, *, species_per_genus: int = SPECIES_PER_GENUS) -> list[int]:
    """Species count of each genus: ``ceil(n / species_per_genus)`` genera, sizes as equal as possible."""
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    n_genera = math.ceil(num_classes / species_per_genus)
    return [num_classes // n_genera + (g < num_classes % n_genera) for g in range(n_genera)]


def genus_name(genus: int) -> str:
    """Pseudo-Latin genus name, unique per index (``Acanthoula``, ``Acanthoops``, …, then numbered)."""
    stem = GENUS_STEMS[(genus // len(GENUS_ENDINGS)) % len(GENUS_STEMS)]
    name = stem + GENUS_ENDINGS[genus % len(GENUS_ENDINGS)]
    cycle = genus // (len(GENUS_STEMS) * len(GENUS_ENDINGS))
    return name if cycle == 0 else f"{name}{cycle + 1}"


def species_name(genus: int, species: int) -> str:
    """``Genus_epithet`` (e.g. ``Acanthoula_minor``); unique per (genus, species)."""
    epithet = EPITHETS[species] if species < len(EPITHETS) else f"sp{species}"
    return f"{genus_name(genus)}_{epithet}"


def draw_value(rng: np.random.Generator, part: str, *, exclude: Sequence[str] = ()) -> str:
    """A uniformly drawn value of ``part`` other than those in ``exclude``."""
    options = [v for v in PARTS[part] if v not in exclude]
    return options[int(rng.integers(len(options)))]


def class_attributes(num_classes: int = 200, seed: int = 0) -> list[dict[str, Any]]:
    """The definition of every class: ``[{"name", "family", "genus", "species", "attributes"}, …]``.

    ``attributes`` maps each part of :data:`PARTS` to its value. Construction (deterministic in
    ``seed``): genera of :data:`SPECIES_PER_GENUS` consecutive classes, families of
    :data:`GENERA_PER_FAMILY` consecutive genera. A family draws the structure parts; each of its
    genera draws the plumage parts; species 0 of a genus is the genus plumage and species ``k ≥ 1``
    changes one plumage part to another value, a different part for each species while parts last.
    So siblings differ in 1 part (from species 0, or same part changed) or 2 parts, and every class is
    distinct (a species that would duplicate an existing class is redrawn).
    """
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x5B1D5]))
    plumage = list(PLUMAGE_PARTS)
    classes: list[dict[str, Any]] = []
    seen: set[tuple[str, ...]] = set()
    structure: dict[str, str] = {}
    for genus, size in enumerate(genus_sizes(num_classes)):
        family = genus // GENERA_PER_FAMILY
        if genus % GENERA_PER_FAMILY == 0:
            structure = {part: draw_value(rng, part) for part in STRUCTURE_PARTS}
        prototype = structure | {part: draw_value(rng, part) for part in PLUMAGE_PARTS}
        changed_parts = [plumage[i] for i in rng.permutation(len(plumage))]
        for species in range(size):
            for attempt in range(1000):
                attributes = dict(prototype)
                if species > 0 or attempt > 0:
                    part = changed_parts[(species - 1 + attempt) % len(changed_parts)]
                    attributes[part] = draw_value(rng, part, exclude=[prototype[part]])
                key = tuple(attributes[p] for p in PARTS)
                if key not in seen:
                    break
            else:  # pragma: no cover - would need more species than one-part variants exist
                raise RuntimeError(f"class_attributes: cannot find a new species for genus {genus}")
            seen.add(key)
            classes.append(
                {
                    "name": species_name(genus, species),
                    "family": family,
                    "genus": genus,
                    "species": species,
                    "attributes": attributes,
                }
            )
    return classes


def attribute_codes(classes: Sequence[dict[str, Any]]) -> np.ndarray:
    """``N × P`` integer codes: ``codes[c, p]`` is the index of class ``c``'s value in ``PARTS[p]``."""
    return np.array([[PARTS[p].index(cls["attributes"][p]) for p in PARTS] for cls in classes], dtype=np.int64).reshape(
        len(classes), len(PARTS)
    )


def attribute_distances(classes: Sequence[dict[str, Any]]) -> np.ndarray:
    """``N × N`` Hamming distances: number of parts whose values differ between two classes."""
    codes = attribute_codes(classes)  # N × P
    return (codes[:, None, :] != codes[None, :, :]).sum(axis=-1)


def nearest_classes(classes: Sequence[dict[str, Any]], index: int, *, k: int = 4) -> list[dict[str, Any]]:
    """The ``k`` classes closest to class ``index`` by number of differing parts.

    Returns ``[{"index", "name", "distance", "differing": {part: (value of index, value of other)}}]``
    sorted by distance, then index.
    """
    if not 0 <= index < len(classes):
        raise IndexError(f"nearest_classes: class index {index} out of range [0, {len(classes)})")
    codes = attribute_codes(classes)  # N × P
    distances = (codes != codes[index]).sum(axis=1)  # N
    order = [int(j) for j in np.lexsort((np.arange(len(classes)), distances)) if j != index][:k]
    mine = classes[index]["attributes"]
    return [
        {
            "index": j,
            "name": classes[j]["name"],
            "distance": int(distances[j]),
            "differing": {
                p: (mine[p], classes[j]["attributes"][p]) for p in PARTS if mine[p] != classes[j]["attributes"][p]
            },
        }
        for j in order
    ]


# ----------------------------------------------------------------------------------------------
# Rendering
# ----------------------------------------------------------------------------------------------
Point = tuple[float, float]


def ellipse(cx: float, cy: float, rx: float, ry: float, *, angle: float = 0.0, n: int = 32) -> np.ndarray:
    """``n × 2`` points of an ellipse rotated by ``angle`` degrees."""
    t = np.linspace(0.0, 2.0 * np.pi, n, endpoint=False)
    x, y = rx * np.cos(t), ry * np.sin(t)
    a = np.deg2rad(angle)
    return np.stack([cx + x * np.cos(a) - y * np.sin(a), cy + x * np.sin(a) + y * np.cos(a)], axis=1)


@dataclass(frozen=True)
class Pose:
    """Canonical bird coordinates (x forward, y down, body length ≈ 1) → canvas pixels."""

    centre: tuple[float, float]
    unit: float
    angle: float
    flip: bool

    def __call__(self, points: np.ndarray | Sequence[Point]) -> list[Point]:
        p = np.asarray(points, dtype=np.float64).reshape(-1, 2)
        x = -p[:, 0] if self.flip else p[:, 0]
        a = np.deg2rad(self.angle)
        px = self.centre[0] + self.unit * (x * np.cos(a) - p[:, 1] * np.sin(a))
        py = self.centre[1] + self.unit * (x * np.sin(a) + p[:, 1] * np.cos(a))
        return list(zip(px.tolist(), py.tolist()))

    def width(self, w: float) -> int:
        return max(1, round(w * self.unit))


def contrast_colour(colour: tuple[int, int, int]) -> tuple[int, int, int]:
    """Dark pattern ink on light plumage, light ink on dark plumage (luma threshold 110)."""
    luma = 0.299 * colour[0] + 0.587 * colour[1] + 0.114 * colour[2]
    return (245, 245, 235) if luma < 110 else (25, 22, 20)


def paste_clipped(
    canvas: Image.Image,
    clip: list[Point],
    colour: tuple[int, int, int],
    draw_shapes: Callable[[ImageDraw.ImageDraw], None],
) -> None:
    """Paint ``colour`` where the shapes drawn by ``draw_shapes`` (255 on a mask) fall inside polygon ``clip``."""
    clip_mask = Image.new("L", canvas.size, 0)
    ImageDraw.Draw(clip_mask).polygon(clip, fill=255)
    shapes = Image.new("L", canvas.size, 0)
    draw_shapes(ImageDraw.Draw(shapes))
    canvas.paste(colour, (0, 0, *canvas.size), ImageChops.multiply(clip_mask, shapes))


BODY_GEOMETRY = {  # body radii (rx, ry), head centre (hx, hy), head radius
    "round": ((0.40, 0.31), (0.36, -0.34), 0.20),
    "slim": ((0.46, 0.23), (0.43, -0.25), 0.17),
    "long": ((0.56, 0.21), (0.53, -0.21), 0.16),
}


def tail_polygon(shape: str, rx: float) -> np.ndarray:
    """Tail outline behind the body's rear end ``-rx`` (canonical coordinates)."""
    r = -rx * 0.7
    e = -rx
    points = {
        "fan": [(r, -0.08), (e - 0.36, -0.24), (e - 0.42, 0.0), (e - 0.36, 0.24), (r, 0.08)],
        "fork": [(r, -0.07), (e - 0.46, -0.22), (e - 0.22, 0.0), (e - 0.46, 0.22), (r, 0.07)],
        "pointed": [(r, -0.07), (e - 0.58, 0.04), (r, 0.08)],
        "square": [(r, -0.10), (e - 0.34, -0.10), (e - 0.34, 0.10), (r, 0.10)],
    }[shape]
    return np.asarray(points)


def beak_polygon(shape: str, bx: float, by: float) -> np.ndarray:
    """Beak outline from its base ``(bx, by)`` on the head, pointing forward (+x)."""
    if shape == "curved":
        t = np.linspace(0.0, 1.0, 8)
        upper = np.stack([bx + 0.30 * t, by - 0.04 + 0.20 * t**2], axis=1)
        lower = np.stack([bx + 0.28 * t[::-1], by + 0.05 + 0.16 * t[::-1] ** 2], axis=1)
        return np.concatenate([upper, lower])
    points = {
        "cone": [(bx, by - 0.065), (bx + 0.17, by + 0.01), (bx, by + 0.07)],
        "needle": [(bx, by - 0.03), (bx + 0.34, by + 0.02), (bx, by + 0.04)],
        "hook": [
            (bx, by - 0.075),
            (bx + 0.13, by - 0.05),
            (bx + 0.18, by + 0.05),
            (bx + 0.12, by + 0.02),
            (bx, by + 0.06),
        ],
        "thick": [(bx - 0.02, by - 0.11), (bx + 0.16, by + 0.0), (bx - 0.02, by + 0.11)],
    }[shape]
    return np.asarray(points)


def draw_bird(canvas: Image.Image, attributes: dict[str, str], pose: Pose) -> list[Point]:
    """Draw the bird of ``attributes`` on ``canvas`` at ``pose``; return the body outline (pixels)."""
    draw = ImageDraw.Draw(canvas)
    a = attributes
    (rx, ry), (hx, hy), hr = BODY_GEOMETRY[a["body_shape"]]
    colour = {
        part: PALETTE[a[part]]
        for part in ("head_color", "body_color", "breast_color", "wing_color", "tail_color", "beak_color")
    }

    leg = (70, 60, 50)
    for x in (-0.06, 0.1):
        draw.line(
            pose([(x, ry * 0.8), (x + 0.03, ry + 0.2), (x + 0.12, ry + 0.22)]),
            fill=leg,
            width=pose.width(0.035),
            joint="curve",
        )

    draw.polygon(pose(tail_polygon(a["tail_shape"], rx)), fill=colour["tail_color"], outline=(20, 20, 20))
    body = pose(ellipse(0.0, 0.0, rx, ry))
    draw.polygon(body, fill=colour["body_color"])
    paste_clipped(
        canvas,
        body,
        colour["breast_color"],
        lambda d: d.polygon(pose(ellipse(rx * 0.35, ry * 0.45, rx * 0.62, ry * 0.62)), fill=255),
    )

    ink = contrast_colour(colour["body_color"])
    pattern = a["body_pattern"]
    if pattern == "stripes":
        paste_clipped(
            canvas,
            body,
            ink,
            lambda d: [
                d.line(pose([(-rx, y), (rx, y)]), fill=255, width=pose.width(0.04)) for y in np.arange(-ry, ry, 0.1)
            ],
        )
    elif pattern == "bars":
        paste_clipped(
            canvas,
            body,
            ink,
            lambda d: [
                d.line(pose([(x, -ry), (x, ry)]), fill=255, width=pose.width(0.045)) for x in np.arange(-rx, rx, 0.13)
            ],
        )
    elif pattern == "spots":
        centres = [(x, y) for x in np.arange(-rx + 0.06, rx, 0.14) for y in np.arange(-ry + 0.07, ry, 0.12)]
        paste_clipped(
            canvas,
            body,
            ink,
            lambda d: [d.polygon(pose(ellipse(x, y, 0.035, 0.035, n=8)), fill=255) for x, y in centres],
        )

    wing = pose(ellipse(-0.1, -0.03, rx * 0.72, ry * 0.55, angle=-10.0))
    draw.polygon(wing, fill=colour["wing_color"], outline=(20, 20, 20))
    wing_ink = contrast_colour(colour["wing_color"])
    wing_pattern = a["wing_pattern"]
    if wing_pattern == "bars":
        paste_clipped(
            canvas,
            wing,
            wing_ink,
            lambda d: [
                d.line(pose([(x, -ry), (x - 0.04, ry)]), fill=255, width=pose.width(0.05)) for x in (-0.16, 0.02)
            ],
        )
    elif wing_pattern == "spots":
        centres = [(x, y) for x in np.arange(-rx * 0.6, rx * 0.5, 0.12) for y in (-0.08, 0.03)]
        paste_clipped(
            canvas,
            wing,
            wing_ink,
            lambda d: [d.polygon(pose(ellipse(x, y, 0.03, 0.03, n=8)), fill=255) for x, y in centres],
        )
    elif wing_pattern == "dark_tips":
        tip = (20, 20, 20) if wing_ink == (25, 22, 20) else (240, 240, 230)
        paste_clipped(
            canvas,
            wing,
            tip,
            lambda d: d.polygon(pose([(-rx * 0.32, -1), (-2, -1), (-2, 1), (-rx * 0.32, 1)]), fill=255),
        )

    crest = a["crest"]
    if crest == "tuft":
        draw.polygon(
            pose([(hx - 0.02, hy - hr * 0.75), (hx - 0.2, hy - hr - 0.2), (hx + 0.07, hy - hr * 0.9)]),
            fill=colour["head_color"],
        )
    elif crest == "long":
        for dx in (-0.06, 0.0, 0.06):
            draw.line(
                pose([(hx + dx, hy - hr * 0.8), (hx + dx - 0.22, hy - hr - 0.22)]),
                fill=colour["head_color"],
                width=pose.width(0.045),
            )
    elif crest == "spiky":
        for dx in (-0.1, -0.02, 0.06):
            draw.polygon(
                pose([(hx + dx - 0.04, hy - hr * 0.8), (hx + dx, hy - hr - 0.12), (hx + dx + 0.04, hy - hr * 0.8)]),
                fill=colour["head_color"],
            )
    head = pose(ellipse(hx, hy, hr, hr))
    draw.polygon(head, fill=colour["head_color"])

    ex, ey = hx + hr * 0.35, hy - hr * 0.15
    marking = a["eye_marking"]
    if marking == "ring":
        draw.polygon(pose(ellipse(ex, ey, 0.08, 0.08, n=16)), fill=(245, 245, 245))
    elif marking == "stripe":
        paste_clipped(
            canvas,
            head,
            (15, 15, 15),
            lambda d: d.line(pose([(hx - hr, ey - 0.02), (hx + hr, ey + 0.01)]), fill=255, width=pose.width(0.07)),
        )
    elif marking == "mask":
        paste_clipped(
            canvas, head, (15, 15, 15), lambda d: d.polygon(pose(ellipse(ex + 0.02, ey + 0.02, 0.15, 0.1)), fill=255)
        )
    elif marking == "brow":
        paste_clipped(
            canvas,
            head,
            (245, 245, 235),
            lambda d: d.line(
                pose([(hx - hr * 0.7, ey - 0.09), (hx + hr * 0.8, ey - 0.07)]), fill=255, width=pose.width(0.06)
            ),
        )
    draw.polygon(pose(ellipse(ex, ey, 0.036, 0.036, n=12)), fill=(10, 10, 10))

    draw.polygon(
        pose(BEAK_SCALE * beak_polygon(a["beak_shape"], 0.0, 0.0) + (hx + hr * 0.9, hy + 0.03)),
        fill=colour["beak_color"],
        outline=(20, 20, 20),
    )
    return body


NATURE = (
    (95, 140, 60),
    (60, 105, 45),
    (140, 120, 80),
    (170, 200, 230),
    (120, 170, 210),
    (150, 150, 140),
    (190, 175, 140),
    (90, 80, 60),
)


def random_colour(rng: np.random.Generator) -> tuple[int, int, int]:
    """A clutter colour: half the time a bird palette colour (so colour alone cannot find the bird)."""
    pool = COLOURS if rng.random() < 0.5 else NATURE
    base = PALETTE[pool[int(rng.integers(len(pool)))]] if pool is COLOURS else pool[int(rng.integers(len(pool)))]
    return tuple(int(np.clip(c + rng.normal(0.0, 12.0), 0, 255)) for c in base)  # type: ignore[return-value]


def draw_leaf(draw: ImageDraw.ImageDraw, rng: np.random.Generator, centre: tuple[float, float], length: float) -> None:
    """A leaf/blob: a random rotated ellipse of the given length, random colour."""
    shape = ellipse(centre[0], centre[1], length / 2, length * rng.uniform(0.15, 0.5), angle=rng.uniform(0, 180), n=20)
    draw.polygon([tuple(p) for p in shape.tolist()], fill=random_colour(rng))


def draw_background(size: int, rng: np.random.Generator) -> Image.Image:
    """Vertical two-colour gradient with random leaves, branches and blobs (``size × size`` RGB)."""
    top, bottom = (np.asarray(NATURE[int(rng.integers(len(NATURE)))], dtype=np.float64) for _ in range(2))
    t = np.linspace(0.0, 1.0, size)[:, None, None]  # size × 1 × 1
    gradient = (1 - t) * top + t * bottom  # size × 1 × 3
    canvas = Image.fromarray(np.broadcast_to(gradient, (size, size, 3)).round().astype(np.uint8))
    draw = ImageDraw.Draw(canvas)
    for _ in range(int(rng.integers(*CLUTTER_RANGE))):
        kind = rng.random()
        centre = (rng.uniform(0, size), rng.uniform(0, size))
        if kind < 0.5:
            draw_leaf(draw, rng, centre, rng.uniform(0.08, 0.3) * size)
        elif kind < 0.8:
            angle = rng.uniform(0, np.pi)
            half = rng.uniform(0.2, 0.7) * size
            ends = [
                (centre[0] - half * np.cos(angle), centre[1] - half * np.sin(angle)),
                (centre[0] + half * np.cos(angle), centre[1] + half * np.sin(angle)),
            ]
            draw.line(ends, fill=random_colour(rng), width=int(rng.integers(2, max(3, size // 16))))
        else:
            r = rng.uniform(0.03, 0.1) * size
            draw.ellipse([centre[0] - r, centre[1] - r, centre[0] + r, centre[1] + r], fill=random_colour(rng))
    return canvas


def render_bird(attributes: dict[str, str], rng: np.random.Generator, *, image_size: int = 64) -> np.ndarray:
    """One ``image_size × image_size × 3`` uint8 image of the class ``attributes``.

    Drawn at twice the size then 2 × 2 box-averaged. Nuisances (all from ``rng``): bird scale
    ∈ :data:`SCALE_RANGE` (body length ≈ 0.36 canvas at 1), rotation ±:data:`MAX_ANGLE` degrees,
    horizontal flip (p = 0.5), shift ±:data:`MAX_SHIFT` canvas; background gradient + :data:`CLUTTER_RANGE`
    clutter items; a perch (p = :data:`PERCH_P`); 1–2 occluding leaves over the bird (p = :data:`OCCLUSION_P`); per-channel gain
    ∈ :data:`GAIN_RANGE`; Gaussian pixel noise of std :data:`NOISE_STD`.
    """
    size = 2 * image_size
    canvas = draw_background(size, rng)
    unit = size * BODY_UNIT * rng.uniform(*SCALE_RANGE)
    centre = (
        size / 2 + rng.uniform(-MAX_SHIFT, MAX_SHIFT) * size,
        size / 2 + rng.uniform(-MAX_SHIFT, MAX_SHIFT) * size,
    )
    pose = Pose(
        centre=centre, unit=unit, angle=float(rng.uniform(-MAX_ANGLE, MAX_ANGLE)), flip=bool(rng.random() < 0.5)
    )
    if rng.random() < PERCH_P:
        ry = BODY_GEOMETRY[attributes["body_shape"]][0][1]
        ImageDraw.Draw(canvas).line(
            pose([(-1.2, ry + 0.22), (1.2, ry + 0.22 + rng.uniform(-0.2, 0.2))]),
            fill=random_colour(rng),
            width=pose.width(0.07),
        )
    draw_bird(canvas, attributes, pose)
    if rng.random() < OCCLUSION_P:
        draw = ImageDraw.Draw(canvas)
        for _ in range(int(rng.integers(1, 3))):
            offset = rng.uniform(-0.5, 0.5, size=2) * unit
            draw_leaf(draw, rng, (centre[0] + offset[0], centre[1] + offset[1]), rng.uniform(0.3, 0.55) * unit)
    pixels = np.asarray(canvas, dtype=np.float64).reshape(image_size, 2, image_size, 2, 3).mean(axis=(1, 3))
    pixels = pixels * rng.uniform(*GAIN_RANGE, size=3) + rng.normal(0.0, NOISE_STD, size=pixels.shape)
    return np.clip(pixels.round(), 0, 255).astype(np.uint8)


def render_job(job: tuple[dict[str, str], int, int, int, int]) -> bytes:
    """Worker: PNG bytes of image ``index`` of class ``class_index`` (job = attributes, seed, class, index, size)."""
    attributes, seed, class_index, index, image_size = job
    return encode_png(render_bird(attributes, image_rng(seed, class_index, index), image_size=image_size))


# ----------------------------------------------------------------------------------------------
# Generator and registered builder
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SynBirdsGenerator(SquareImagesGenerator):
    """SynBirds generator for :func:`dmlstudy.data.embedded.ensure_generated`.

    ``workers`` only changes the speed, never the output (per-image random streams).
    """

    name: ClassVar[str] = "synbirds"
    version: ClassVar[str] = "1"

    def generate(self, folder: Path, *, seed: int) -> dict[str, int]:
        """Render all images (class-major order) and write the CUB layout and ``class_attributes.json``."""
        classes = class_attributes(self.num_classes, seed)
        return self.write_classes(
            folder,
            seed=seed,
            specs=[cls["attributes"] for cls in classes],
            names=[cls["name"] for cls in classes],
            render_job=render_job,
            records_file=ATTRIBUTES_FILE,
            records=[
                {"class_id": c + 1, "split": "train" if c < self.train_classes else "test"} | cls
                for c, cls in enumerate(classes)
            ],
        )


def load_class_attributes(root: str | Path) -> list[dict[str, Any]]:
    """The class definitions stored in a generated folder (``class_attributes.json``), in class-id order."""
    return json.loads((Path(root) / ATTRIBUTES_FILE).read_text(encoding="utf-8"))


build = register_generated(
    "synbirds",
    SynBirdsGenerator,
    flip_invariant=True,
    summary='SynBirds-200 split ("train": classes 1–100, "test": 101–200), generated into ``root`` on first use.',
)
