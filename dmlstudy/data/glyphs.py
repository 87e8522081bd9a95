"""Glyphs: characters rendered from the TrueType fonts that ship inside matplotlib, in the CUB layout.

Classes are characters, instances are (font × random distortion). The fonts are the 16 text faces of
``matplotlib.get_data_path()/fonts/ttf`` (DejaVu Sans, Sans Mono and Serif, STIX General, each in
regular/bold/italic/bold-italic), so the source glyphs are identical on every machine.

Class set (:data:`CANDIDATES`, 128 characters): Latin upper and lower case, digits, the Greek and
Cyrillic letters that do not look like a Latin (or each other's) letter, and common symbols. Every
class is checked to have a real glyph in every font (:func:`font_coverage`, the fonts' cmaps via
fontTools, plus a non-empty rendering), so there are no tofu boxes; a candidate that some font lacks is
dropped. Why 128 classes × 40 images: ≥ 100 classes as asked, about as many distinct-looking
characters as all 16 fonts share, 64 unseen test classes (a CUB-like zero-shot test set), 40 images
= 2.5 per font per class, and the whole set (5,120 images) is generated in seconds.

Train/test: classes alternate along :data:`CANDIDATES` (even positions train, odd positions test), so
both halves mix scripts and symbols; class ids 1–64 are the train characters, 65–128 the test ones,
which is the "first half of the class ids" split of :func:`dmlstudy.data.cub.read_cub`.

A horizontal flip changes a glyph's identity (b/d), so the splits are built with ``flip_invariant=False``.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

import matplotlib
import numpy as np
from fontTools.ttLib import TTFont
from PIL import Image, ImageDraw, ImageFont
from scipy import ndimage

from dmlstudy.data.embedded import encode_png, image_rng, parallel_map, register_generated, write_cub_layout

CHARACTERS_FILE = "characters.json"

FONT_FILES = (
    "DejaVuSans.ttf",
    "DejaVuSans-Bold.ttf",
    "DejaVuSans-Oblique.ttf",
    "DejaVuSans-BoldOblique.ttf",
    "DejaVuSansMono.ttf",
    "DejaVuSansMono-Bold.ttf",
    "DejaVuSansMono-Oblique.ttf",
    "DejaVuSansMono-BoldOblique.ttf",
    "DejaVuSerif.ttf",
    "DejaVuSerif-Bold.ttf",
    "DejaVuSerif-Italic.ttf",
    "DejaVuSerif-BoldItalic.ttf",
    "STIXGeneral.ttf",
    "STIXGeneralBol.ttf",
    "STIXGeneralItalic.ttf",
    "STIXGeneralBolIta.ttf",
)

# Greek capitals and Cyrillic letters that look like Latin ones (Α Β Ε …, А В Е …), omicron, and
# Cyrillic letters that look like a Greek one (Г Π Ф Л) or a digit (З) are left out on purpose.
CANDIDATES = (
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    "abcdefghijklmnopqrstuvwxyz"
    "0123456789"
    "αβγδεζηθικλμνξπρστυφχψω"
    "ΓΔΘΛΞΠΣΦΨΩ"
    "БДЖИЦЧШЩЪЫЭЮЯ"
    "&@#%?!$§¶£€¥ßÆæØð©®‰"
)

# Render and distortion settings (fractions of the canvas unless said otherwise); see render_glyph.
EM_SIZE = 0.56  # font size (em) / canvas
BASELINE = 0.68  # baseline height / canvas, glyph horizontally centred (anchor "ms")
MAX_ANGLE = 12.0  # degrees
MAX_SHEAR = 0.2
SCALE_RANGE = (0.85, 1.15)
ASPECT_JITTER = 0.1  # anisotropic scale: x and y scales differ by up to ±10 %
MAX_SHIFT = 0.08
ELASTIC_ALPHA = 0.035  # displacement amplitude / canvas
ELASTIC_CELLS = 5  # the displacement field is smooth on a 5 × 5 grid over the canvas
NOISE_STD = 8.0


def font_dir() -> Path:
    """Folder of matplotlib's bundled TrueType fonts."""
    return Path(matplotlib.get_data_path()) / "fonts" / "ttf"


@cache
def font_cmap(font_file: str) -> frozenset[int]:
    """Code points the font maps to a glyph other than ``.notdef`` (fontTools best cmap)."""
    font = TTFont(font_dir() / font_file, lazy=True)
    cmap = font.getBestCmap() or {}
    return frozenset(cp for cp, glyph in cmap.items() if glyph != ".notdef")


@cache
def load_font(font_file: str, size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(str(font_dir() / font_file), size)


def has_ink(character: str, font_file: str, *, size: int = 48) -> bool:
    """Whether ``character`` renders to at least one dark pixel in the font (not an empty glyph)."""
    font = load_font(font_file, size)
    image = Image.new("L", (2 * size, 2 * size), 0)
    ImageDraw.Draw(image).text((size, int(1.4 * size)), character, fill=255, font=font, anchor="ms")
    return bool(np.asarray(image).max() > 128)


def font_coverage(characters: str | Sequence[str] = CANDIDATES, fonts: Sequence[str] = FONT_FILES) -> list[str]:
    """The characters, in order, that every font maps in its cmap and renders with some ink."""
    return list(covered_characters(tuple(characters), tuple(fonts)))


@cache
def covered_characters(characters: tuple[str, ...], fonts: tuple[str, ...]) -> tuple[str, ...]:
    """Cached worker of :func:`font_coverage` (hashable arguments)."""
    return tuple(ch for ch in characters if all(ord(ch) in font_cmap(f) and has_ink(ch, f) for f in fonts))


def glyph_classes(characters: str | Sequence[str] = CANDIDATES) -> list[str]:
    """Class order: the covered characters at even positions (train), then those at odd positions (test)."""
    covered = font_coverage(characters)
    return covered[0::2] + covered[1::2]


def character_name(character: str) -> str:
    """Folder-safe class name ``U<hex>_<UNICODE_NAME>`` (e.g. ``U0041_LATIN_CAPITAL_LETTER_A``)."""
    name = unicodedata.name(character, "UNNAMED").replace(" ", "_").replace("-", "_")
    return f"U{ord(character):04X}_{name}"


@cache
def upsampling_matrix(size: int, cells: int) -> np.ndarray:
    """``size × cells`` matrix of 1-D cubic-spline upsampling (column ``j`` = upsampled unit vector ``e_j``)."""
    return np.stack(
        [ndimage.zoom(np.eye(cells)[j], size / cells, order=3, mode="reflect", grid_mode=True) for j in range(cells)],
        axis=1,
    )


def elastic_field(size: int, rng: np.random.Generator, *, alpha: float, cells: int) -> np.ndarray:
    """``2 × size × size`` smooth random displacement (pixels) in the spirit of Simard et al. (2003):
    white noise on a coarse ``cells × cells`` grid, cubic-spline upsampled to ``size`` (separably,
    ``U @ noise @ Uᵀ``) and scaled so its standard deviation is ``alpha``. Upsampling a coarse grid is
    a cheap stand-in for Gaussian filtering full-size noise, with the same kind of smoothness."""
    up = upsampling_matrix(size, cells)  # size × cells
    field = up @ rng.standard_normal((2, cells, cells)) @ up.T  # 2 × size × size
    return field * (alpha / max(float(field.std()), 1e-8))


def distortion_coordinates(size: int, rng: np.random.Generator) -> np.ndarray:
    """``2 × size × size`` source (row, col) coordinates of the random affine + elastic warp.

    Affine about the centre: rotation ±:data:`MAX_ANGLE`, shear ±:data:`MAX_SHEAR`, scale in
    :data:`SCALE_RANGE` with ±:data:`ASPECT_JITTER` anisotropy, shift ±:data:`MAX_SHIFT`; then an elastic
    field of amplitude :data:`ELASTIC_ALPHA` and smoothness :data:`ELASTIC_CELLS`.
    """
    angle = np.deg2rad(rng.uniform(-MAX_ANGLE, MAX_ANGLE))
    shear = rng.uniform(-MAX_SHEAR, MAX_SHEAR)
    scale = rng.uniform(*SCALE_RANGE) * (1 + rng.uniform(-ASPECT_JITTER, ASPECT_JITTER, size=2))
    shift = rng.uniform(-MAX_SHIFT, MAX_SHIFT, size=2) * size
    rotation = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    forward = rotation @ np.array([[1.0, shear], [0.0, 1.0]]) @ np.diag(scale)  # output = forward @ source
    inverse = np.linalg.inv(forward)
    centre = (size - 1) / 2
    rows, cols = np.mgrid[0:size, 0:size].astype(np.float64)
    out = np.stack([cols - centre - shift[0], rows - centre - shift[1]])  # 2 × H × W, (x, y)
    source = np.tensordot(inverse, out, axes=1) + centre
    source += elastic_field(size, rng, alpha=ELASTIC_ALPHA * size, cells=ELASTIC_CELLS)
    return source[::-1]  # (x, y) → (row, col)


def render_glyph(character: str, font_file: str, rng: np.random.Generator, *, image_size: int = 64) -> np.ndarray:
    """One ``image_size × image_size × 3`` uint8 image of ``character`` in ``font_file``.

    The glyph is drawn at twice the size (em = :data:`EM_SIZE`, baseline at :data:`BASELINE`, so case
    and descenders keep their place), warped by :func:`distortion_coordinates` (bilinear), 2 × 2
    box-averaged, then coloured: a background colour with a vertical gradient (light, mildly tinted),
    a dark tinted ink, and Gaussian pixel noise of std :data:`NOISE_STD`.
    """
    size = 2 * image_size
    mask = Image.new("L", (size, size), 0)
    font = load_font(font_file, round(EM_SIZE * size))
    ImageDraw.Draw(mask).text((size / 2, BASELINE * size), character, fill=255, font=font, anchor="ms")
    warped = ndimage.map_coordinates(
        np.asarray(mask, dtype=np.float64) / 255.0, distortion_coordinates(size, rng), order=1, mode="constant"
    )
    ink_level = warped.reshape(image_size, 2, image_size, 2).mean(axis=(1, 3))[..., None]  # S × S × 1
    top = rng.uniform(175, 250) + rng.normal(0, 12, size=3)
    bottom = rng.uniform(175, 250) + rng.normal(0, 12, size=3)
    t = np.linspace(0.0, 1.0, image_size)[:, None, None]
    background = (1 - t) * top + t * bottom  # S × 1 × 3
    ink = rng.uniform(0, 80) + rng.normal(0, 15, size=3)
    pixels = (
        background * (1 - ink_level) + ink * ink_level + rng.normal(0.0, NOISE_STD, size=(image_size, image_size, 3))
    )
    return np.clip(pixels.round(), 0, 255).astype(np.uint8)


def render_job(job: tuple[str, int, int, int, int]) -> bytes:
    """Worker: PNG bytes of image ``index`` of class ``class_index`` (job = character, seed, class, index, size).

    The font cycles with the index (``FONT_FILES[index % 16]``), so each class sees every font equally.
    """
    character, seed, class_index, index, image_size = job
    font_file = FONT_FILES[index % len(FONT_FILES)]
    return encode_png(render_glyph(character, font_file, image_rng(seed, class_index, index), image_size=image_size))


@dataclass(frozen=True)
class GlyphsGenerator:
    """Glyphs generator for :func:`dmlstudy.data.embedded.ensure_generated`.

    ``num_classes=None`` takes every covered candidate (128); a smaller number takes the first classes
    of the train half and of the test half in equal shares. ``workers`` only changes the speed.
    """

    num_classes: int | None = None
    images_per_class: int = 40
    image_size: int = 64
    workers: int = 2
    name: ClassVar[str] = "glyphs"
    version: ClassVar[str] = "1"

    def characters(self) -> list[str]:
        """The class characters in class-id order (train half first)."""
        classes = glyph_classes()
        if self.num_classes is None:
            return classes
        if not 2 <= self.num_classes <= len(classes):
            raise ValueError(f"GlyphsGenerator: num_classes must be in [2, {len(classes)}], got {self.num_classes}")
        half = len(classes) // 2
        n_train = self.num_classes // 2
        return classes[:n_train] + classes[half : half + self.num_classes - n_train]

    def config(self) -> dict[str, Any]:
        return {
            "characters": "".join(self.characters()),
            "fonts": list(FONT_FILES),
            "images_per_class": self.images_per_class,
            "image_size": self.image_size,
        }

    def generate(self, folder: Path, *, seed: int) -> dict[str, int]:
        """Render all images (class-major order), write the CUB layout and ``characters.json``."""
        if self.images_per_class < 1 or self.image_size < 8:
            raise ValueError(
                f"GlyphsGenerator: need images_per_class >= 1 and image_size >= 8, got {self.images_per_class}, {self.image_size}"
            )
        characters = self.characters()
        jobs = [
            (ch, seed, c, i, self.image_size) for c, ch in enumerate(characters) for i in range(self.images_per_class)
        ]
        images = parallel_map(render_job, jobs, workers=self.workers, progress=f"generating {self.name}")
        labels = [c for c in range(len(characters)) for _ in range(self.images_per_class)]
        n_train = len(characters) // 2
        write_cub_layout(
            folder, images, labels, [character_name(ch) for ch in characters], train_classes=range(n_train)
        )
        records = [
            {
                "class_id": c + 1,
                "character": ch,
                "name": unicodedata.name(ch, ""),
                "split": "train" if c < n_train else "test",
            }
            for c, ch in enumerate(characters)
        ]
        (folder / CHARACTERS_FILE).write_text(
            json.dumps(records, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        return {
            "classes": len(characters),
            "images": len(images),
            "train_classes": n_train,
            "test_classes": len(characters) - n_train,
        }


build = register_generated(
    "glyphs",
    GlyphsGenerator,
    flip_invariant=False,
    summary='Glyphs split ("train": the 64 even-position characters, "test": the 64 others), generated on first use.',
)
