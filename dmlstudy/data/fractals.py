"""Fractals: a formula-driven pretraining source set (iterated function systems), in the CUB layout.

The study's "ImageNet": a general source, not a copy of a target set, in the spirit of FractalDB
(Kataoka et al., *Pre-training without Natural Images*, ACCV 2020). Written here from that idea:

* **A class is an iterated function system** (:func:`sample_class`): ``m ∈ {2, 3, 4}`` affine maps
  ``w_j(x) = A_j x + b_j`` with the six entries of each ``(A_j, b_j)`` uniform in ``[-1, 1]``, kept only
  when every map is a contraction (largest singular value of ``A_j`` ≤ :data:`MAX_SINGULAR`, so the
  attractor exists) and the attractor fills at least :data:`MIN_FILL` of a 32 × 32 grid over its bounding
  box (FractalDB's filling-rate filter: no dust, no lines). Map ``j`` is chosen with probability
  ``∝ |det A_j|``. A candidate whose parameters lie within :data:`MIN_CLASS_DISTANCE` (max-abs) of an
  earlier class's is redrawn, so two classes never share a system.
* **An image is the attractor rendered with per-image nuisances** (:func:`render_fractal`): the class
  parameters jittered (Gaussian, std :data:`PARAM_JITTER`, as FractalDB's intra-class variation), the
  chaos game run on :data:`WALKERS` parallel points, then a random rotation, scale, position and flip, a
  colour ramp between two random colours along a random direction (colour never identifies the class), and one of three backgrounds
  (gradient, smooth noise, two-colour stripes) plus pixel noise. Drawn at twice the size and box-averaged.

Size: :data:`DEFAULT_CLASSES` = 400 classes × 30 images of 64 × 64 (12,000 images), 1.5× the images and
2–3× the classes of SynBirds-200 (8,000 / 200) and Glyphs (5,120 / 128). Generation costs ≈ 9 ms of CPU per
image: 2 min 19 s of CPU in all, so about 70 s on 2 idle cores (measured: 11.5 min wall on the shared 2 cores
at load average ≈ 15). The ``train``/``test`` splits (classes 1–200 / 201–400) exist only so the set reads
like the others; :mod:`dmlstudy.run.pretrain` uses every class.

Disjointness from the study sets (SynBirds-200, Glyphs, and the real CUB/Cars/SOP/In-shop): by
construction. A class here is an IFS attractor, a point set defined by contractive affine maps; no study
class is one: SynBirds classes are part-attribute combinations drawn by :mod:`dmlstudy.data.synbirds`'s
bird renderer, Glyphs classes are Unicode characters rendered from fonts, the real sets are photographs of
birds, cars and products. This module shares no renderer, palette, font or parameter space with them (it
imports only the layout writer and random streams of :mod:`dmlstudy.data.embedded`), and its class names
``ifs<id>_m<maps>`` name no study class; ``tests/test_pretrain.py`` checks both. The class parameters are
written to ``ifs_parameters.json``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from dmlstudy.data.embedded import (
    SquareImagesGenerator,
    encode_png,
    image_rng,
    register_generated,
)

PARAMETERS_FILE = "ifs_parameters.json"
DEFAULT_CLASSES = 400
DEFAULT_IMAGES_PER_CLASS = 30
MAP_COUNTS = (2, 3, 4)
MAX_SINGULAR = 0.95  # every map a contraction, so the chaos game converges to one attractor
MIN_FILL = 0.08  # fraction of a 32 × 32 grid over the attractor's bounding box that must be hit
FILL_GRID = 32
MIN_CLASS_DISTANCE = 0.1  # max-abs difference of the parameter arrays between two classes of equal m
PARAM_JITTER = 0.02
WALKERS = 1024
BURN_IN = 16  # chaos-game steps before points are recorded
RECORDED_STEPS = 12
CLASS_STREAM = 1  # image_rng stream of the class draws (stream 0: the images)
NOISE_STD = 6.0


def chaos_game(
    maps: np.ndarray, rng: np.random.Generator, *, walkers: int = WALKERS, steps: int = RECORDED_STEPS
) -> np.ndarray:
    """``(walkers · steps) × 2`` points of the attractor of ``maps`` (``m × 6`` rows ``a b c d e f``:
    ``x' = a x + b y + e``, ``y' = c x + d y + f``), map ``j`` drawn with probability ``∝ |ad − bc|``.

    The walkers start at the fixed point of map 0 (which lies on the attractor), so no burn-in bias
    remains; :data:`BURN_IN` steps only spread them over the attractor before recording.
    """
    weights = np.abs(maps[:, 0] * maps[:, 3] - maps[:, 1] * maps[:, 2]) + 1e-3
    a, b, c, d, e, f = maps[0]
    fixed = np.linalg.solve(np.array([[1 - a, -b], [-c, 1 - d]]), np.array([e, f]))
    x = np.full(walkers, fixed[0])
    y = np.full(walkers, fixed[1])
    choices = rng.choice(len(maps), size=(BURN_IN + steps, walkers), p=weights / weights.sum())
    recorded = []
    for step, choice in enumerate(choices):
        a, b, c, d, e, f = maps[choice].T
        x, y = a * x + b * y + e, c * x + d * y + f
        if step >= BURN_IN:
            recorded.append(np.stack([x, y], axis=1))
    return np.concatenate(recorded)


def fill_rate(points: np.ndarray, grid: int = FILL_GRID) -> float:
    """Fraction of a ``grid × grid`` raster over the points' bounding box that holds a point."""
    low, high = points.min(axis=0), points.max(axis=0)
    span = np.maximum(high - low, 1e-9)
    cells = np.clip(((points - low) / span * grid).astype(np.int64), 0, grid - 1)
    return len(np.unique(cells[:, 0] * grid + cells[:, 1])) / grid**2


def is_contractive(maps: np.ndarray) -> bool:
    """Every ``A_j`` has largest singular value ≤ :data:`MAX_SINGULAR`."""
    return bool(np.linalg.norm(maps[:, :4].reshape(-1, 2, 2), ord=2, axis=(1, 2)).max() <= MAX_SINGULAR)


def sample_class(rng: np.random.Generator, earlier: list[np.ndarray]) -> np.ndarray:
    """Rejection-sample one class's ``m × 6`` IFS parameters (see the module docstring for the filters)."""
    while True:
        maps = rng.uniform(-1.0, 1.0, size=(int(rng.choice(MAP_COUNTS)), 6))
        if not is_contractive(maps):
            continue
        if any(o.shape == maps.shape and np.abs(o - maps).max() < MIN_CLASS_DISTANCE for o in earlier):
            continue
        if fill_rate(chaos_game(maps, rng, walkers=256, steps=8)) >= MIN_FILL:
            return maps


def class_parameters(num_classes: int, seed: int) -> list[np.ndarray]:
    """The IFS of every class, drawn in class order from one stream (class ``c`` depends on classes < c)."""
    rng = image_rng(seed, 0, 0, stream=CLASS_STREAM)
    classes: list[np.ndarray] = []
    for _ in range(num_classes):
        classes.append(sample_class(rng, classes))
    return classes


def class_name(class_index: int, maps: np.ndarray) -> str:
    return f"ifs{class_index + 1:04d}_m{len(maps)}"


def background(size: int, rng: np.random.Generator) -> np.ndarray:
    """``size × size × 3`` float background: a gradient, smooth noise, or stripes (one drawn per image)."""
    kind = int(rng.integers(3))
    colours = rng.uniform(0, 255, size=(2, 3))
    rows, cols = np.mgrid[0:size, 0:size] / size
    if kind == 0:
        angle = rng.uniform(0, 2 * np.pi)
        t = np.clip(0.5 + (np.cos(angle) * (cols - 0.5) + np.sin(angle) * (rows - 0.5)), 0, 1)
    elif kind == 1:
        coarse = rng.uniform(0, 1, size=(5, 5))
        t = np.kron(coarse, np.ones((size // 5 + 1, size // 5 + 1)))[:size, :size]
    else:
        angle, period = rng.uniform(0, np.pi), rng.uniform(0.1, 0.4)
        t = (np.sin(2 * np.pi * (np.cos(angle) * cols + np.sin(angle) * rows) / period) > 0).astype(np.float64)
    return (1 - t)[..., None] * colours[0] + t[..., None] * colours[1]


def render_fractal(maps: np.ndarray, rng: np.random.Generator, *, image_size: int = 64) -> np.ndarray:
    """One ``image_size × image_size × 3`` uint8 image of the class ``maps`` (see the module docstring)."""
    size = 2 * image_size
    jittered = maps + rng.normal(0.0, PARAM_JITTER, size=maps.shape)
    norms = np.linalg.norm(jittered[:, :4].reshape(-1, 2, 2), ord=2, axis=(1, 2))
    jittered[:, :4] *= np.minimum(1.0, MAX_SINGULAR / norms)[:, None]  # stay contractive
    points = chaos_game(jittered, rng)
    centre = (points.min(axis=0) + points.max(axis=0)) / 2
    extent = float(np.max(points.max(axis=0) - points.min(axis=0))) / 2 + 1e-9
    unit = (points - centre) / extent  # in [-1, 1]²
    angle = rng.uniform(0, 2 * np.pi)
    scale = rng.uniform(0.55, 0.95) * size / 2
    flip = 1.0 if rng.random() < 0.5 else -1.0
    rotation = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]]) @ np.diag([flip, 1.0])
    offset = size / 2 + rng.uniform(-0.12, 0.12, size=2) * size
    pixels = unit @ rotation.T * scale + offset
    inside = np.all((pixels >= 0) & (pixels < size), axis=1)
    index = pixels[inside].astype(np.int64)
    flat = index[:, 1] * size + index[:, 0]
    direction = rng.normal(size=2)
    ramp = (unit[inside] @ (direction / np.linalg.norm(direction)) + 1) / 2  # colour ramp along a random direction
    counts = np.bincount(flat, minlength=size * size).astype(np.float64)
    ramp_sum = np.bincount(flat, weights=ramp, minlength=size * size)
    density = 1.0 - np.exp(-counts / rng.uniform(0.5, 2.0))
    mean_ramp = np.divide(ramp_sum, counts, out=np.zeros_like(ramp_sum), where=counts > 0)
    ends = rng.uniform(0, 255, size=(2, 3))
    ink = (1 - mean_ramp)[:, None] * ends[0] + mean_ramp[:, None] * ends[1]  # (size²) × 3
    alpha = density.reshape(size, size, 1)
    canvas = background(size, rng) * (1 - alpha) + ink.reshape(size, size, 3) * alpha
    small = canvas.reshape(image_size, 2, image_size, 2, 3).mean(axis=(1, 3))
    small += rng.normal(0.0, NOISE_STD, size=small.shape)
    return np.clip(small.round(), 0, 255).astype(np.uint8)


def render_job(job: tuple[list[list[float]], int, int, int, int]) -> bytes:
    """Worker: PNG bytes of image ``index`` of class ``class_index`` (job = maps, seed, class, index, size)."""
    maps, seed, class_index, index, image_size = job
    return encode_png(render_fractal(np.asarray(maps), image_rng(seed, class_index, index), image_size=image_size))


@dataclass(frozen=True)
class FractalsGenerator(SquareImagesGenerator):
    """Fractals generator for :func:`dmlstudy.data.embedded.ensure_generated`; ``workers`` only changes the speed."""

    num_classes: int = DEFAULT_CLASSES
    images_per_class: int = DEFAULT_IMAGES_PER_CLASS
    name: ClassVar[str] = "fractals"
    version: ClassVar[str] = "1"

    def generate(self, folder: Path, *, seed: int) -> dict[str, int]:
        """Draw the classes, render every image (class-major order), write the CUB layout and ``ifs_parameters.json``."""
        classes = class_parameters(self.num_classes, seed)
        names = [class_name(c, maps) for c, maps in enumerate(classes)]
        return self.write_classes(
            folder,
            seed=seed,
            specs=[maps.tolist() for maps in classes],
            names=names,
            render_job=render_job,
            records_file=PARAMETERS_FILE,
            records=[
                {"class_id": c + 1, "name": names[c], "maps": maps.round(12).tolist()} for c, maps in enumerate(classes)
            ],
        )


build = register_generated(
    "fractals",
    FractalsGenerator,
    flip_invariant=True,
    summary='Fractals split ("train": the first half of the classes, "test": the rest), generated into ``root`` on first use.',
)
