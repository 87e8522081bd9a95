"""Shapes: a procedural pretraining source set (compositions of geometric primitives), in the CUB layout.

The study's "ImageNet" for the generated datasets: a general source of object-like images, not a copy of a target set.
Measured before it was chosen: the formula-driven :mod:`dmlstudy.data.fractals` set did not train within the
15-minute budget (held-out top-1 2.2 % on 100 classes after 8 epochs of 19,000 images, chance 1 %; see
``docs/datasets.md``), because a thin IFS attractor under a random pose, colour ramp and background leaves a
small CNN almost nothing stable to learn from 64 pixels. Shapes keeps the nuisances and makes the class visible:

* **A class is a composition** (:func:`sample_class`): ``m ∈ {2, 3}`` primitives, each a kind from
  :data:`KINDS` (ellipse, rectangle, triangle, pentagon, star, cross, arc stroke, zig-zag stroke), drawn
  filled or as an outline, with its centre in ``[-0.45, 0.45]²`` of the object box, a size, an aspect ratio
  and an angle. Two classes with the same kinds in the same order must differ by at least
  :data:`MIN_CLASS_DISTANCE` (max-abs over centres, sizes and aspects), so no two classes share a layout.
* **An image is the composition under per-image nuisances** (:func:`render_shapes`): every primitive's
  centre, size and angle jittered (:data:`JITTER`), the whole object rotated by up to ±:data:`MAX_ROTATION`
  degrees, scaled, moved and mirrored, each primitive in its class colour jittered per image (hue ± 0.04,
  saturation and value ± 0.15) — or, with probability :data:`RANDOM_COLOUR`, in a random colour — on one of the
  fractals set's three backgrounds (gradient, smooth noise, stripes), plus pixel
  noise. Drawn with PIL at twice the size and box-averaged.

Size: :data:`DEFAULT_CLASSES` = 500 classes × 40 images of 64 × 64 (20,000 images): 2.5× the images and
classes of SynBirds-200 (8,000 / 200), 4× the classes of Glyphs (128).

Disjointness from the study sets (SynBirds-200, Glyphs and the real CUB/Cars/SOP/In-shop): by construction.
A class here is a layout of two or three geometric primitives; SynBirds classes are part-attribute
combinations of :mod:`dmlstudy.data.synbirds`'s bird renderer (body, head, wing, tail, beak), Glyphs classes
are Unicode characters rendered from fonts, the real sets are photographs. This module shares no renderer,
font, palette or parameter space with them (it imports the layout writer and random streams of
:mod:`dmlstudy.data.embedded` and the backgrounds of :mod:`dmlstudy.data.fractals`), and its class names
``shape<id>_<kinds>`` name no study class; ``tests/test_pretrain.py`` checks the names. The class
parameters are written to ``shape_parameters.json``.
"""

from __future__ import annotations

import colorsys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
from PIL import Image, ImageDraw

from dmlstudy.data.embedded import (
    SquareImagesGenerator,
    encode_png,
    image_rng,
    register_generated,
)
from dmlstudy.data.fractals import NOISE_STD, background

PARAMETERS_FILE = "shape_parameters.json"
DEFAULT_CLASSES = 200
DEFAULT_IMAGES_PER_CLASS = 100
KINDS = ("ellipse", "rectangle", "triangle", "pentagon", "star", "cross", "arc", "zigzag")
PRIMITIVE_COUNTS = (2, 3)
MIN_CLASS_DISTANCE = 0.12  # max-abs difference of centres, sizes and aspects between two classes of equal kinds
JITTER = {"centre": 0.03, "size": 0.06, "angle": 0.12}  # per-image std: box units, relative size, radians
MAX_ROTATION = 30.0  # degrees, the whole object
CLASS_STREAM = 2  # image_rng stream of the class draws (stream 0: the images; the fractals use stream 1)
FIELDS = ("kind", "filled", "x", "y", "size", "aspect", "angle", "hue")
RANDOM_COLOUR = 0.25  # share of primitives drawn in a random colour instead of their class colour


def sample_primitive(rng: np.random.Generator) -> dict:
    """One primitive of a class: kind, filled or outline, centre, size (fraction of the box), aspect, angle."""
    return {
        "kind": str(rng.choice(KINDS)),
        "filled": bool(rng.random() < 0.5),
        "x": float(rng.uniform(-0.45, 0.45)),
        "y": float(rng.uniform(-0.45, 0.45)),
        "size": float(rng.uniform(0.3, 0.6)),
        "aspect": float(rng.uniform(0.35, 1.0)),
        "angle": float(rng.uniform(0, np.pi)),
        "hue": float(rng.uniform(0, 1)),
    }


def layout_vector(primitives: list[dict]) -> np.ndarray:
    return np.array([[p["x"], p["y"], p["size"], p["aspect"]] for p in primitives])


def sample_class(rng: np.random.Generator, earlier: list[list[dict]]) -> list[dict]:
    """Rejection-sample one class's primitives (see the module docstring for the distance filter)."""
    while True:
        primitives = [sample_primitive(rng) for _ in range(int(rng.choice(PRIMITIVE_COUNTS)))]
        kinds = [(p["kind"], p["filled"]) for p in primitives]
        vector = layout_vector(primitives)
        if not any(
            [(p["kind"], p["filled"]) for p in other] == kinds
            and np.abs(layout_vector(other) - vector).max() < MIN_CLASS_DISTANCE
            for other in earlier
        ):
            return primitives


def class_parameters(num_classes: int, seed: int) -> list[list[dict]]:
    """The primitives of every class, drawn in class order from one stream (class ``c`` depends on classes < c)."""
    rng = image_rng(seed, 0, 0, stream=CLASS_STREAM)
    classes: list[list[dict]] = []
    for _ in range(num_classes):
        classes.append(sample_class(rng, classes))
    return classes


def class_name(class_index: int, primitives: list[dict]) -> str:
    return f"shape{class_index + 1:04d}_" + "-".join(p["kind"][:3] + ("f" if p["filled"] else "o") for p in primitives)


def outline(kind: str, rng: np.random.Generator) -> tuple[np.ndarray, bool]:
    """Unit-size vertices of ``kind`` (``n × 2``, centred at 0, radius ≈ 1) and whether it is a closed shape."""
    if kind == "ellipse":
        t = np.linspace(0, 2 * np.pi, 32, endpoint=False)
        return np.stack([np.cos(t), np.sin(t)], 1), True
    if kind == "rectangle":
        return np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]], dtype=float), True
    if kind in ("triangle", "pentagon"):
        n = 3 if kind == "triangle" else 5
        t = np.pi / 2 + np.linspace(0, 2 * np.pi, n, endpoint=False)
        return np.stack([np.cos(t), np.sin(t)], 1), True
    if kind == "star":
        t = np.pi / 2 + np.linspace(0, 2 * np.pi, 10, endpoint=False)
        radius = np.where(np.arange(10) % 2 == 0, 1.0, 0.45)
        return np.stack([radius * np.cos(t), radius * np.sin(t)], 1), True
    if kind == "cross":
        a = 0.3
        return np.array(
            [[-a, -1], [a, -1], [a, -a], [1, -a], [1, a], [a, a], [a, 1], [-a, 1], [-a, a], [-1, a], [-1, -a], [-a, -a]]
        ), True
    if kind == "arc":
        t = np.linspace(0.15 * np.pi, 1.35 * np.pi, 24)
        return np.stack([np.cos(t), np.sin(t)], 1), False
    t = np.linspace(-1, 1, 6)  # zigzag
    return np.stack([t, np.where(np.arange(6) % 2 == 0, -0.5, 0.5)], 1), False


def primitive_colour(hue: float, rng: np.random.Generator) -> tuple[int, int, int]:
    """RGB of a primitive of class hue ``hue``: the hue jittered, saturation and value drawn high; with
    probability :data:`RANDOM_COLOUR` any colour (colour is a cue of the class, as in photographs, not a rule)."""
    if rng.random() < RANDOM_COLOUR:
        return tuple(int(c) for c in rng.integers(0, 256, size=3))
    h = (hue + rng.normal(0, 0.04)) % 1.0
    saturation, value = rng.uniform(0.55, 1.0), rng.uniform(0.55, 1.0)
    return tuple(int(round(255 * c)) for c in colorsys.hsv_to_rgb(h, saturation, value))


def render_shapes(primitives: list[dict], rng: np.random.Generator, *, image_size: int = 64) -> np.ndarray:
    """One ``image_size × image_size × 3`` uint8 image of the class ``primitives`` (see the module docstring)."""
    size = 2 * image_size
    canvas = Image.fromarray(np.clip(background(size, rng), 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(canvas)
    rotation = np.deg2rad(rng.uniform(-MAX_ROTATION, MAX_ROTATION))
    scale = rng.uniform(0.7, 0.95) * size / 2  # the object box's half-width in pixels
    mirror = -1.0 if rng.random() < 0.5 else 1.0
    offset = size / 2 + rng.uniform(-0.1, 0.1, size=2) * size
    turn = np.array([[np.cos(rotation), -np.sin(rotation)], [np.sin(rotation), np.cos(rotation)]])
    width = max(2, round(size / 32))
    for primitive in primitives:
        vertices, closed = outline(primitive["kind"], rng)
        angle = primitive["angle"] + rng.normal(0, JITTER["angle"])
        own = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
        extent = primitive["size"] * (1 + rng.normal(0, JITTER["size"]))
        shape = vertices * np.array([extent, extent * primitive["aspect"]]) @ own.T
        centre = np.array([primitive["x"], primitive["y"]]) + rng.normal(0, JITTER["centre"], size=2)
        points = (shape + centre) * np.array([mirror, 1.0]) @ turn.T * scale + offset
        colour = primitive_colour(primitive["hue"], rng)
        xy = [tuple(p) for p in points]
        if closed and primitive["filled"]:
            draw.polygon(xy, fill=colour)
        elif closed:
            draw.line([*xy, xy[0]], fill=colour, width=width, joint="curve")
        else:
            draw.line(xy, fill=colour, width=width + 1, joint="curve")
    pixels = np.asarray(canvas, dtype=np.float64)
    small = pixels.reshape(image_size, 2, image_size, 2, 3).mean(axis=(1, 3))
    small += rng.normal(0.0, NOISE_STD, size=small.shape)
    return np.clip(small.round(), 0, 255).astype(np.uint8)


def render_job(job: tuple[list[dict], int, int, int, int]) -> bytes:
    """Worker: PNG bytes of image ``index`` of class ``class_index`` (job = primitives, seed, class, index, size)."""
    primitives, seed, class_index, index, image_size = job
    return encode_png(render_shapes(primitives, image_rng(seed, class_index, index), image_size=image_size))


@dataclass(frozen=True)
class ShapesGenerator(SquareImagesGenerator):
    """Shapes generator for :func:`dmlstudy.data.embedded.ensure_generated`; ``workers`` only changes the speed."""

    num_classes: int = DEFAULT_CLASSES
    images_per_class: int = DEFAULT_IMAGES_PER_CLASS
    name: ClassVar[str] = "shapes"
    version: ClassVar[str] = "2"  # 2: class colours (1: every primitive in a random colour)

    def generate(self, folder: Path, *, seed: int) -> dict[str, int]:
        """Draw the classes, render every image (class-major order), write the CUB layout and the parameters."""
        classes = class_parameters(self.num_classes, seed)
        names = [class_name(c, primitives) for c, primitives in enumerate(classes)]
        return self.write_classes(
            folder,
            seed=seed,
            specs=classes,
            names=names,
            render_job=render_job,
            records_file=PARAMETERS_FILE,
            records=[{"class_id": c + 1, "name": names[c], "primitives": p} for c, p in enumerate(classes)],
        )


build = register_generated(
    "shapes",
    ShapesGenerator,
    flip_invariant=True,
    summary='Shapes split ("train": the first half of the classes, "test": the rest), generated into ``root`` on first use.',
)
