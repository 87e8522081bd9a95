"""Emoji: one emoji per class, drawn by nine design families (two of them one lineage), rendered on this machine.

The sets and how they are fetched: :mod:`dmlstudy.data.emoji_sources`; how their icons become classes, and
what is dropped: :mod:`dmlstudy.data.emoji_classes`.

The build's fingerprint: ``fingerprint.tsv`` lists every class with the sha256 of each family's PNG;
:func:`~dmlstudy.data.emoji_checks.fingerprint_difference` compares it with the fingerprint of the published build
(:data:`PUBLISHED_FINGERPRINT`, committed gzipped: 87 KB instead of 213), which ``dmlstudy data generate`` reports.

Images: every design is rendered once with resvg (``resvg-py``) at :data:`IMAGE_SIZE` px on white, the
icon's viewBox ``left top width height`` (else the set's ``width``/``height``, default 16) scaled to fit;
PNGs are encoded with fixed options, so the same package versions give byte-identical files.

Split: class-disjoint, half the classes each (odd count: the extra one to test), by a fixed permutation of
the classes sorted by name, seeded by the dataset seed; class ids 1…n/2 are the train classes, which is the
"first half of the class ids" split of :func:`dmlstudy.data.cub.read_cub`. Validation folds come from the
train classes as for every dataset (:mod:`dmlstudy.data.folds`). Many emoji have a direction (arrows,
pointing hands), so the splits are built with ``flip_invariant=False``. ``designs.json`` records each image's
family and icon name.

"""

from __future__ import annotations

import hashlib
import io
import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import resvg_py
from PIL import Image

from dmlstudy.data.base import ImageListDataset, register_dataset, register_image_credit
from dmlstudy.data.cub import read_cub
from dmlstudy.data.embedded import encode_png, ensure_generated, parallel_map, write_cub_layout
from dmlstudy.data.emoji_checks import (
    NEAR_DUPLICATE_LEVELS,
    build_fingerprint,
    digest_of,
    fingerprint_difference,
    near_identical_designs,
    read_fingerprint,
)
from dmlstudy.data.emoji_classes import MIN_DESIGNS, EmojiClass, icon_sets_by_family, match_classes
from dmlstudy.data.emoji_sources import (
    DESIGNER_TEST_FAMILIES,
    EMOJI_SOURCES,
    SOURCES_FOLDER,
    EmojiFetchError,
    EmojiSource,
    IconSet,
    fetch_sources,
    read_icon_set,
)

IMAGE_SIZE = 128  # pixels per side of the rendered images
MANIFEST_FILE = "manifest.json"
DESIGNS_FILE = "designs.json"
FINGERPRINT_FILE = "fingerprint.tsv"
PUBLISHED_FINGERPRINT = Path(__file__).with_name("emoji_fingerprint.tsv.gz")  # the build results/ was computed from

IMAGE_CHANGES = (
    f"drawings from {len(EMOJI_SOURCES)} emoji sets, rendered to {IMAGE_SIZE} px PNGs on white (changes made); "
    "figures resize them and may add frames, lines and heat-map overlays"
)
register_image_credit("emoji", [source.credit for source in EMOJI_SOURCES], changes=IMAGE_CHANGES)


# ----------------------------------------------------------------------------------------------
# Rendering and the generator
# ----------------------------------------------------------------------------------------------
RENDERER = f"resvg-py {resvg_py.__version__} (resvg {resvg_py.__resvg_version__})"


def render_svg(svg: str) -> bytes:
    """PNG bytes (RGB on white, fixed encoder options) of an SVG document, at the size the document states."""
    png = bytes(resvg_py.svg_to_bytes(svg_string=svg, background="#ffffff", skip_system_fonts=True))
    with Image.open(io.BytesIO(png)) as image:
        return encode_png(image.convert("RGB"))


def class_order(num_classes: int, seed: int) -> np.ndarray:
    """The fixed permutation of the name-sorted classes: its first half are the train classes."""
    return np.random.default_rng(seed).permutation(num_classes)


@dataclass(frozen=True)
class EmojiGenerator:
    """Emoji generator for :func:`dmlstudy.data.embedded.ensure_generated`.

    ``sources`` are the pinned packages (tarballs fetched into ``cache_dir``); ``workers`` and ``cache_dir``
    change only the speed and where the downloads are kept, never the output.
    """

    cache_dir: Path
    sources: tuple[EmojiSource, ...] = EMOJI_SOURCES
    image_size: int = IMAGE_SIZE
    min_designs: int = MIN_DESIGNS
    near_duplicate_levels: int = NEAR_DUPLICATE_LEVELS
    test_families: tuple[str, ...] = ()
    workers: int = 2
    name: ClassVar[str] = "emoji"
    version: ClassVar[str] = "2"

    def config(self) -> dict[str, Any]:
        return {
            "sources": [f"{s.spec} {s.integrity}" for s in self.sources],
            "image_size": self.image_size,
            "min_designs": self.min_designs,
            "near_duplicate_levels": self.near_duplicate_levels,
            "renderer": RENDERER,
        } | ({"test_families": sorted(self.test_families)} if self.test_families else {})

    def load_sets(self) -> list[IconSet]:
        """The verified sets (downloaded when missing).

        The licence a package's metadata declares must be the recorded metadata licence (``source.licence``),
        else the recorded facts are stale and the build stops. The drawings' licence is a separate recorded fact
        (``source.image_licence``, sourced by ``source.licence_source`` where it differs from the metadata): a
        package cannot declare it, so it is not read from the tarball.
        """
        tarballs = fetch_sources(self.cache_dir, self.sources)
        icon_sets = []
        for source in self.sources:
            icon_set = read_icon_set(tarballs[source.family], source.family)
            if icon_set.licence != source.licence:
                raise EmojiFetchError(
                    f"emoji: {source.spec}'s metadata declares the licence {icon_set.licence!r}, but "
                    f"{source.licence!r} is recorded as its metadata licence; the dataset card and attribution "
                    "would be wrong, so nothing was built."
                )
            icon_sets.append(icon_set)
        return icon_sets

    def generate(self, folder: Path, *, seed: int) -> dict[str, int]:
        """Fetch, match, render, drop near-identical renders, write the CUB layout (class-major order),
        ``designs.json``, ``fingerprint.tsv`` and ``manifest.json``."""
        icon_sets = self.load_sets()
        by_family = icon_sets_by_family(icon_sets)
        matched, dropped = match_classes(icon_sets, min_designs=self.min_designs)
        designs = [(emoji.name, family, icon) for emoji in matched for family, icon in emoji.designs.items()]
        svgs = [by_family[family].svg(icon, self.image_size) for _, family, icon in designs]
        rendered = parallel_map(render_svg, svgs, workers=self.workers, progress=f"rendering {self.name}")
        png = {(name, family): image for (name, family, _), image in zip(designs, rendered)}

        pairs = near_identical_designs(png, levels=self.near_duplicate_levels)
        near = {design for pair in pairs for design in pair}
        dropped["counts"][f"near-identical renders (≤ {self.near_duplicate_levels} of 255 levels apart)"] = len(near)
        dropped["near_identical_pairs"] = [
            f"{family}: {first} / {second}" for (first, family), (second, _) in sorted(pairs, key=lambda p: p[0][::-1])
        ]
        thinned = [
            EmojiClass(c.name, c.keys, {f: icon for f, icon in c.designs.items() if (c.name, f) not in near})
            for c in matched
        ]
        kept = [c for c in thinned if len(c.designs) >= self.min_designs]
        dropped["counts"][f"emoji with fewer than {self.min_designs} designs after near-identical renders"] = len(
            thinned
        ) - len(kept)

        classes = [kept[i] for i in class_order(len(kept), seed)]
        n_train = len(classes) // 2
        if self.test_families:
            classes, n_train = designer_split(classes, n_train, self.test_families, dropped["counts"])
        layout = [(c, family, icon) for c, emoji in enumerate(classes) for family, icon in emoji.designs.items()]
        images = [png[classes[c].name, family] for c, family, _ in layout]
        labels = [c for c, _, _ in layout]
        files = write_cub_layout(folder, images, labels, [c.name for c in classes], train_classes=range(n_train))
        records = [
            {"image": file, "class_id": c + 1, "family": family, "icon": icon}
            for file, (c, family, icon) in zip(files, layout)
        ]
        (folder / DESIGNS_FILE).write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
        fingerprint = build_fingerprint(
            {emoji.name: emoji.designs for emoji in classes}, {key: digest_of(image) for key, image in png.items()}
        )
        (folder / FINGERPRINT_FILE).write_text(fingerprint, encoding="utf-8")
        per_family = Counter(family for _, family, _ in layout)
        counts = {
            "classes": len(classes),
            "images": len(images),
            "train_classes": n_train,
            "test_classes": len(classes) - n_train,
            "train_images": sum(len(c.designs) for c in classes[:n_train]),
            "test_images": sum(len(c.designs) for c in classes[n_train:]),
        }
        manifest = {
            "dataset": self.name,
            "version": self.version,
            "seed": int(seed),
            "image_size": self.image_size,
            "min_designs": self.min_designs,
            "near_duplicate_levels": self.near_duplicate_levels,
            "test_families": sorted(self.test_families),
            "renderer": RENDERER,
            "fingerprint": hashlib.sha256(fingerprint.encode("utf-8")).hexdigest(),
            "sources": [
                {
                    "package": s.package,
                    "version": s.version,
                    "integrity": s.integrity,
                    "licence": s.licence,
                    "drawings_licence": s.image_licence,
                    "licence_url": s.credit.url,
                    "licence_source": s.licence_source,
                    "title": s.credit.title,
                    "authors": s.credit.authors,
                    "project_url": s.project_url,
                    "attribution": s.attribution,
                    "images": per_family[s.family],
                }
                for s in self.sources
            ],
            "counts": counts,
            "classes_by_designs": dict(sorted(Counter(len(c.designs) for c in classes).items())),
            "dropped": dropped,
        }
        (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        return counts


def designer_split(
    classes: Sequence[EmojiClass], n_train: int, test_families: Sequence[str], counts: dict[str, int]
) -> tuple[list[EmojiClass], int]:
    """The unseen-designers split of the class-disjoint halves ``classes[:n_train]`` / ``classes[n_train:]``:
    the training classes keep the designs of the families outside ``test_families``, the test classes those of
    ``test_families`` only; a class left with fewer than 2 designs on its side is dropped (a test query needs
    a positive, a training class a pair). Returns the classes and the new number of training classes; ``counts``
    gets what was dropped."""
    unknown = sorted(set(test_families) - {source.family for source in EMOJI_SOURCES})
    if unknown:
        raise ValueError(f"emoji: unknown test families {unknown}; valid: {[s.family for s in EMOJI_SOURCES]}")

    def side(emoji: EmojiClass, test: bool) -> EmojiClass:
        designs = {f: icon for f, icon in emoji.designs.items() if (f in test_families) == test}
        return EmojiClass(emoji.name, emoji.keys, designs)

    train = [side(c, test=False) for c in classes[:n_train]]
    test = [side(c, test=True) for c in classes[n_train:]]
    kept_train, kept_test = [c for c in train if len(c.designs) >= 2], [c for c in test if len(c.designs) >= 2]
    counts["training classes with fewer than 2 designs of the training families"] = len(train) - len(kept_train)
    counts["test classes with fewer than 2 designs of the test families"] = len(test) - len(kept_test)
    return kept_train + kept_test, len(kept_train)


def fingerprint_report(folder: str | Path, published: str | Path = PUBLISHED_FINGERPRINT) -> str:
    """One line saying whether the build in ``folder`` is the published build that results/ was computed from."""
    folder = Path(folder)
    built_file, published = folder / FINGERPRINT_FILE, Path(published)
    if not built_file.is_file():
        return f"emoji: {built_file} is missing, so this build cannot be compared with the published one"
    built = built_file.read_text(encoding="utf-8")
    digest = hashlib.sha256(built.encode("utf-8")).hexdigest()[:16]
    if not published.is_file():
        return f"emoji: build fingerprint {digest}; no published fingerprint ({published}) to compare with"
    difference = fingerprint_difference(built, read_fingerprint(published))
    if not difference:
        return f"emoji: this build matches the published build (fingerprint {digest}) that results/ was computed from"
    return (
        f"emoji: this build (fingerprint {digest}) DIFFERS from the published build that results/ was computed "
        f"from: {difference}. Check the renderer and package versions in {folder / MANIFEST_FILE}."
    )


def default_cache(root: str | Path) -> Path:
    """Where the npm tarballs are kept: ``emoji-npm`` beside the dataset folder (``<data root>/emoji-npm``)."""
    return Path(root).parent / SOURCES_FOLDER


@register_dataset("emoji")
def build(
    root: str | Path,
    split: str,
    transform: Callable | None = None,
    seed: int = 0,
    *,
    image_size: int = IMAGE_SIZE,
    min_designs: int = MIN_DESIGNS,
    sources: Sequence[EmojiSource] = EMOJI_SOURCES,
    cache_dir: str | Path | None = None,
    test_families: Sequence[str] = (),
    name: str = "emoji",
) -> ImageListDataset:
    """Emoji by nine design families (one class per emoji, half the classes train, half test), fetched from npm and rendered on first use."""
    generator = EmojiGenerator(
        cache_dir=Path(cache_dir) if cache_dir is not None else default_cache(root),
        sources=tuple(sources),
        image_size=image_size,
        min_designs=min_designs,
        test_families=tuple(test_families),
    )
    ensure_generated(root, generator, seed=seed)
    manifest = json.loads((Path(root) / MANIFEST_FILE).read_text(encoding="utf-8"))
    return read_cub(
        root,
        split,
        transform=transform,
        name=name,
        flip_invariant=False,
        train_classes=manifest["counts"]["train_classes"],
    )


EMOJI_VARIANTS: dict[str, dict[str, Any]] = {
    # the robustness study's perturbations of the default build (docs/protocol.md)
    "emoji_p1": {"seed": 1},  # another fixed partition of the classes into train / test
    "emoji_p2": {"seed": 2},
    "emoji_designers": {
        "test_families": DESIGNER_TEST_FAMILIES
    },  # test images drawn by families no training image came from
    "emoji224": {"image_size": 224},  # rendered at 224 px: 7 × 7 maps at the last stage
}


def _register_variant(variant: str, settings: Mapping[str, Any]) -> None:
    def build_variant(root: str | Path, split: str, transform: Callable | None = None, **kwargs) -> ImageListDataset:
        return build(root, split, transform, **(dict(settings) | kwargs), name=variant)

    build_variant.__doc__ = (
        f"Emoji, {', '.join(f'{k} = {v}' for k, v in settings.items())}: a perturbation of the default build."
    )
    register_dataset(variant)(build_variant)
    register_image_credit(variant, [source.credit for source in EMOJI_SOURCES], changes=IMAGE_CHANGES)


for _variant, _settings in EMOJI_VARIANTS.items():
    _register_variant(_variant, _settings)


def test_split_families(dataset: str, data_root: str | Path) -> list[str]:
    """The design family of every image of ``dataset``'s test split under ``data_root``, in the split's order
    (``designs.json``)."""
    from dmlstudy.data import build_dataset

    root = Path(data_root) / dataset
    split = build_dataset(dataset, root, "test")
    family = {record["image"]: record["family"] for record in json.loads((root / "designs.json").read_text())}
    return [family[str(Path(path).relative_to(root / "images"))] for path in split.paths]
