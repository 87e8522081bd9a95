"""Embedded datasets: CUB layout writer, generate-once marker/atomicity, SynBirds and Glyphs generators."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
from fontTools.ttLib import TTFont
from PIL import Image, ImageDraw

from dmlstudy.data import glyphs, synbirds
from dmlstudy.data.base import DATASETS, DatasetLayoutError, build_dataset
from dmlstudy.data.cub import read_cub
from dmlstudy.data.embedded import (
    MARKER,
    GenerationMismatchError,
    encode_png,
    ensure_generated,
    image_rng,
    write_cub_layout,
)

TINY = {"num_classes": 6, "images_per_class": 3}


def folder_bytes(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` except the marker (which records the wall time) → its bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.name != MARKER
    }


class CountingGenerator:
    """A fast fake generator: two classes of solid-colour images; counts its calls; can fail midway."""

    name = "fake"
    version = "1"

    def __init__(self, *, images_per_class: int = 2, fail: bool = False) -> None:
        self.images_per_class = images_per_class
        self.fail = fail
        self.calls = 0

    def config(self) -> dict:
        return {"images_per_class": self.images_per_class}

    def generate(self, folder: Path, *, seed: int) -> dict[str, int]:
        self.calls += 1
        images = [
            np.full((8, 8, 3), 10 * seed + c, dtype=np.uint8) for c in range(2) for _ in range(self.images_per_class)
        ]
        labels = [c for c in range(2) for _ in range(self.images_per_class)]
        write_cub_layout(folder, images, labels, ["red", "blue"], train_classes=[0])
        if self.fail:
            raise RuntimeError("generator crashed after writing part of the data")
        return {"images": len(images)}


# ----------------------------------------------------------------------------------------------
# Layout writer
# ----------------------------------------------------------------------------------------------
def test_write_cub_layout_files_and_read_back(tmp_path):
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, size=(5, 7, 3), dtype=np.uint8) for _ in range(7)]
    labels = [2, 0, 1, 2, 0, 3, 1]
    names = ["cA", "cB", "cC", "cD"]
    rel = write_cub_layout(tmp_path, images, labels, names, train_classes=[0, 1])

    lines = (tmp_path / "images.txt").read_text().splitlines()
    assert lines == [f"{i + 1} {r}" for i, r in enumerate(rel)]
    assert rel[0] == "003.cC/cC_0000.png" and rel[3] == "003.cC/cC_0001.png"
    assert (tmp_path / "classes.txt").read_text().splitlines() == ["1 001.cA", "2 002.cB", "3 003.cC", "4 004.cD"]
    assert (tmp_path / "image_class_labels.txt").read_text().splitlines() == [
        f"{i + 1} {label + 1}" for i, label in enumerate(labels)
    ]
    assert (tmp_path / "train_test_split.txt").read_text().splitlines() == [
        f"{i + 1} {int(label in (0, 1))}" for i, label in enumerate(labels)
    ]
    for r, image in zip(rel, images):  # lossless round trip
        np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / "images" / r).convert("RGB")), image)

    train, test = read_cub(tmp_path, "train"), read_cub(tmp_path, "test")
    assert train.class_names == ["001.cA", "002.cB"] and test.class_names == ["003.cC", "004.cD"]
    assert sorted(train.labels.tolist()) == [0, 0, 1, 1] and sorted(test.labels.tolist()) == [0, 0, 1]


def test_write_cub_layout_rejects_bad_input(tmp_path):
    image = np.zeros((4, 4, 3), np.uint8)
    with pytest.raises(ValueError, match="labels"):
        write_cub_layout(tmp_path, [image], [2], ["a", "b"], train_classes=[0])
    with pytest.raises(ValueError, match="no spaces"):
        write_cub_layout(tmp_path, [image], [0], ["a b", "c"], train_classes=[0])
    with pytest.raises(ValueError, match="distinct"):
        write_cub_layout(tmp_path, [image], [0], ["ab", "AB"], train_classes=[0])


def test_encode_png_is_deterministic_and_lossless():
    image = np.random.default_rng(1).integers(0, 256, size=(9, 9, 3), dtype=np.uint8)
    data = encode_png(image)
    assert data == encode_png(image.copy()) == encode_png(Image.fromarray(image))
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(data))), image)


# ----------------------------------------------------------------------------------------------
# Generate once, atomically, with a marker
# ----------------------------------------------------------------------------------------------
def test_ensure_generated_once_and_marker(tmp_path):
    root = tmp_path / "fake"
    generator = CountingGenerator()
    assert ensure_generated(root, generator, seed=3) == root
    ensure_generated(root, generator, seed=3)
    assert generator.calls == 1
    marker = json.loads((root / MARKER).read_text())
    assert marker["generator"] == "fake" and marker["version"] == "1" and marker["seed"] == 3
    assert marker["counts"] == {"images": 4} and marker["config"] == {"images_per_class": 2} and marker["seconds"] >= 0
    assert [p.name for p in tmp_path.iterdir()] == ["fake"]  # no temporary folder left behind


@pytest.mark.parametrize("change", ["seed", "config", "version"])
def test_ensure_generated_refuses_mismatch(tmp_path, change):
    root = tmp_path / "fake"
    ensure_generated(root, CountingGenerator(), seed=0)
    before = folder_bytes(root)
    other = CountingGenerator(images_per_class=3 if change == "config" else 2)
    if change == "version":
        other.version = "2"
    with pytest.raises(GenerationMismatchError, match=f"{change}: folder has"):
        ensure_generated(root, other, seed=1 if change == "seed" else 0)
    assert folder_bytes(root) == before and other.calls == 0


def test_ensure_generated_cleans_leftover_partial_and_ignores_live_one(tmp_path):
    root = tmp_path / "fake"
    stale = tmp_path / ".fake.partial-999999999-deadbeef"  # pid above any pid_max: writer is gone
    live = tmp_path / f".fake.partial-{os.getppid()}-cafecafe"  # our parent process is alive
    for folder in (stale, live):
        (folder / "images").mkdir(parents=True)
        (folder / "images.txt").write_text("1 half/written.png\n")
    generator = CountingGenerator()
    ensure_generated(root, generator, seed=0)
    assert generator.calls == 1 and (root / MARKER).is_file()
    assert not stale.exists() and live.exists()
    assert len(read_cub(root, "train")) == 2


def test_ensure_generated_failure_leaves_nothing(tmp_path):
    root = tmp_path / "fake"
    with pytest.raises(RuntimeError, match="crashed"):
        ensure_generated(root, CountingGenerator(fail=True), seed=0)
    assert list(tmp_path.iterdir()) == []
    generator = CountingGenerator()
    ensure_generated(root, generator, seed=0)  # a later call starts afresh
    assert generator.calls == 1


def test_ensure_generated_root_without_marker(tmp_path):
    root = tmp_path / "fake"
    (root / "images").mkdir(parents=True)  # e.g. a copy interrupted half-way
    with pytest.raises(DatasetLayoutError, match=MARKER):
        ensure_generated(root, CountingGenerator(), seed=0)
    empty = tmp_path / "empty"
    empty.mkdir()
    ensure_generated(empty, CountingGenerator(), seed=0)  # an empty folder is simply filled
    assert (empty / MARKER).is_file()


# ----------------------------------------------------------------------------------------------
# SynBirds
# ----------------------------------------------------------------------------------------------
def test_class_attributes_distinct_and_nearest_differ_in_one_or_two_parts():
    classes = synbirds.class_attributes(200, seed=0)
    parts = list(synbirds.PARTS)
    assert len(classes) == 200 and len({c["name"] for c in classes}) == 200
    assert len({tuple(c["attributes"][p] for p in parts) for c in classes}) == 200
    for c in classes:
        assert set(c["attributes"]) == set(parts) and all(c["attributes"][p] in synbirds.PARTS[p] for p in parts)
    for i in range(0, 200, 7):  # brute-force distances for a sample of classes
        distances = [sum(classes[i]["attributes"][p] != other["attributes"][p] for p in parts) for other in classes]
        nearest = min(d for j, d in enumerate(distances) if j != i)
        assert nearest in (1, 2)
        found = synbirds.nearest_classes(classes, i, k=3)
        expected = sorted((d, j) for j, d in enumerate(distances) if j != i)[:3]
        assert [(n["distance"], n["index"]) for n in found] == expected
        assert all(len(n["differing"]) == n["distance"] for n in found)
    for c in classes:  # the family fixes the structure
        family = [o for o in classes if o["family"] == c["family"]]
        assert all(o["attributes"][p] == c["attributes"][p] for o in family for p in synbirds.STRUCTURE_PARTS)
    assert synbirds.class_attributes(200, seed=1) != classes
    assert synbirds.class_attributes(200, seed=0) == classes


def test_class_attributes_small_counts():
    for n in (2, 6, 7, 11):
        classes = synbirds.class_attributes(n, seed=5)
        distances = synbirds.attribute_distances(classes) + np.eye(n, dtype=int) * 99
        assert len(classes) == n and distances.min(axis=1).max() <= 2 and distances.min() >= 1


def test_synbirds_deterministic_and_reads_back(tmp_path):
    generator = synbirds.SynBirdsGenerator(**TINY, workers=2)
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    ensure_generated(a, generator, seed=0)
    ensure_generated(b, synbirds.SynBirdsGenerator(**TINY, workers=1), seed=0)
    ensure_generated(c, generator, seed=1)
    files_a, files_c = folder_bytes(a), folder_bytes(c)
    assert files_a == folder_bytes(b)
    pngs = [k for k in files_a if k.endswith(".png")]
    assert len(pngs) == 18 and all(files_a[k] != files_c[k] for k in pngs)

    classes = synbirds.class_attributes(6, seed=0)
    pixels = np.asarray(Image.open(a / pngs[0]))
    np.testing.assert_array_equal(pixels, synbirds.render_bird(classes[0]["attributes"], image_rng(0, 0, 0)))
    assert [r["attributes"] for r in synbirds.load_class_attributes(a)] == [c["attributes"] for c in classes]

    train = synbirds.build(a, "train", seed=0, **TINY)
    test = build_dataset("synbirds", a, split="test", seed=0, **TINY)
    assert len(train) == len(test) == 9 and train.flip_invariant
    assert sorted(set(train.labels.tolist())) == sorted(set(test.labels.tolist())) == [0, 1, 2]
    assert not set(train.class_names) & set(test.class_names)
    image, label = test[4]
    assert image.size == (64, 64) and image.mode == "RGB" and label == 1
    with pytest.raises(GenerationMismatchError):
        synbirds.build(a, "train", seed=2, **TINY)


# ----------------------------------------------------------------------------------------------
# Glyphs
# ----------------------------------------------------------------------------------------------
def test_glyph_classes_exist_in_every_font():
    characters = glyphs.glyph_classes()
    assert len(characters) == len(set(characters)) == 128
    missing = chr(0x10FFFD)  # a private-use code point no font maps: renders as the .notdef box
    for font_file in glyphs.FONT_FILES:
        cmap = TTFont(glyphs.font_dir() / font_file, lazy=True).getBestCmap()
        assert ord(missing) not in cmap
        font = glyphs.load_font(font_file, 32)

        def bitmap(ch: str, font=font) -> np.ndarray:
            image = Image.new("L", (64, 64), 0)
            ImageDraw.Draw(image).text((32, 44), ch, fill=255, font=font, anchor="ms")
            return np.asarray(image)

        tofu = bitmap(missing)
        for ch in characters:
            assert ord(ch) in cmap and cmap[ord(ch)] != ".notdef", (ch, font_file)
            drawn = bitmap(ch)
            assert drawn.max() > 128 and not np.array_equal(drawn, tofu), (ch, font_file)


def test_font_coverage_drops_characters_a_font_lacks():
    assert glyphs.font_coverage("A\u4e00b\u0f00") == ["A", "b"]  # CJK and Tibetan are not in DejaVu/STIX


def test_glyphs_deterministic_and_reads_back(tmp_path):
    generator = glyphs.GlyphsGenerator(**TINY)
    ensure_generated(tmp_path / "a", generator, seed=0)
    ensure_generated(tmp_path / "b", generator, seed=0)
    ensure_generated(tmp_path / "c", generator, seed=7)
    files_a, files_c = folder_bytes(tmp_path / "a"), folder_bytes(tmp_path / "c")
    assert files_a == folder_bytes(tmp_path / "b")
    pngs = [k for k in files_a if k.endswith(".png")]
    assert len(pngs) == 18 and all(files_a[k] != files_c[k] for k in pngs)

    every = glyphs.glyph_classes()
    chars = generator.characters()
    assert chars == every[:3] + every[64:67]  # train classes from the train half, test from the test half
    train = glyphs.build(tmp_path / "a", "train", **TINY)
    test = glyphs.build(tmp_path / "a", "test", **TINY)
    assert not train.flip_invariant and not test.flip_invariant
    assert len(train) == len(test) == 9 and sorted(set(test.labels.tolist())) == [0, 1, 2]
    assert test.class_names == [f"{4 + i:03d}.{glyphs.character_name(ch)}" for i, ch in enumerate(chars[3:])]
    records = json.loads((tmp_path / "a" / glyphs.CHARACTERS_FILE).read_text(encoding="utf-8"))
    assert [r["character"] for r in records] == chars
    image, _ = train[0]
    assert image.size == (64, 64) and image.mode == "RGB"


def test_registered_builders():
    assert "synbirds" in DATASETS and "glyphs" in DATASETS
