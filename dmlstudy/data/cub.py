"""CUB-200-2011 reader (zero-shot DML split) and the small layout helpers the other readers reuse.

DML split (Wah et al. 2011 data; split of Oh Song et al., CVPR 2016): the first half of the class ids
(1–100, 5,864 images) is train, the second half (101–200, 5,924 images) is test. The official
``train_test_split.txt`` is the *classification* split: it must be present (it is part of the layout)
but is not used.

``read_cub`` is also used for the embedded datasets, which are written in the same layout.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from dmlstudy.data.base import DatasetLayoutError, ImageListDataset, register_dataset

CUB_SPLITS = ("train", "test")
CUB_DIR = "CUB_200_2011"
CUB_FILES = ("images.txt", "image_class_labels.txt", "classes.txt", "train_test_split.txt")
CUB_LAYOUT = """\
<root>/                        (or its parent, holding CUB_200_2011/)
├── images.txt                 "<image_id> <class_folder>/<file>.jpg"
├── image_class_labels.txt     "<image_id> <class_id>"
├── classes.txt                "<class_id> <class_folder>"
├── train_test_split.txt       "<image_id> <0|1>"   (classification split, required but unused)
└── images/<class_folder>/<file>.jpg"""

MAX_LISTED_MISSING = 5


# ----------------------------------------------------------------------------------------------
# Helpers shared by the benchmark readers (cars.py, sop.py, inshop.py import them).
# ----------------------------------------------------------------------------------------------
def check_split(split: str, valid: Sequence[str], *, name: str) -> None:
    """Raise ``ValueError`` listing the valid splits when ``split`` is not one of them."""
    if split not in valid:
        raise ValueError(f"{name}: unknown split {split!r}; valid splits: {', '.join(valid)}")


def layout_error(name: str, root: Path, layout: str, problem: str) -> DatasetLayoutError:
    """A :class:`DatasetLayoutError` whose message says what is wrong and shows the expected tree."""
    return DatasetLayoutError(f"{name}: {problem}\n(dataset root: {root})\nExpected layout:\n{layout}")


def require_paths(base: Path, files: Iterable[str], dirs: Iterable[str], *, name: str, layout: str) -> None:
    """Raise a layout error listing every missing file (``files``) and folder (``dirs``) under ``base``."""
    if not base.is_dir():
        raise layout_error(name, base, layout, f"dataset folder does not exist: {base}")
    missing = [f"file {f}" for f in files if not (base / f).is_file()]
    missing += [f"folder {d}/" for d in dirs if not (base / d).is_dir()]
    if missing:
        raise layout_error(name, base, layout, "missing " + ", ".join(missing) + f" in {base}")


def resolve_root(root: str | Path, subdir: str, marker: str) -> Path:
    """``root`` if it holds ``marker``, else ``root/subdir`` if that holds it, else ``root/subdir`` when
    that folder exists (so its missing pieces get reported), else ``root``."""
    root = Path(root).expanduser()
    if (root / marker).exists():
        return root
    nested = root / subdir
    if (nested / marker).exists() or nested.is_dir():
        return nested
    return root


def check_images_exist(paths: Sequence[Path], *, name: str, root: Path, layout: str) -> None:
    """Raise a layout error saying how many listed images are missing, with the first few.

    Each folder is listed once (``os.scandir``) instead of one ``stat`` per image; only the listed
    names are looked up, so stray files (macOS ``._*``) in the folders are never touched.
    """
    by_folder: dict[Path, list[Path]] = defaultdict(list)
    for path in paths:
        by_folder[path.parent].append(path)
    missing: list[Path] = []
    for folder, members in by_folder.items():
        try:
            with os.scandir(folder) as entries:
                present = {entry.name for entry in entries}
        except (FileNotFoundError, NotADirectoryError):
            present = set()
        missing.extend(p for p in members if p.name not in present)
    if missing:
        missing.sort()
        shown = ", ".join(
            str(p.relative_to(root)) if p.is_relative_to(root) else str(p) for p in missing[:MAX_LISTED_MISSING]
        )
        more = " ..." if len(missing) > MAX_LISTED_MISSING else ""
        raise layout_error(
            name, root, layout, f"{len(missing)} of {len(paths)} listed images are missing, first: {shown}{more}"
        )


def read_id_table(path: Path, *, name: str, root: Path, layout: str, columns: int, skip: int = 0) -> list[list[str]]:
    """Whitespace-separated rows of ``path`` after ``skip`` header lines; blank lines are dropped.

    The last column keeps any inner whitespace (``split(maxsplit=columns - 1)``). A row with fewer
    than ``columns`` fields is a layout error naming the file and line.
    """
    rows: list[list[str]] = []
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if line_no <= skip or not line.strip():
                continue
            fields = line.split(maxsplit=columns - 1)
            if len(fields) != columns:
                raise layout_error(
                    name, root, layout, f"{path.name} line {line_no}: expected {columns} fields, got {line.rstrip()!r}"
                )
            rows.append([f.strip() for f in fields])
    return rows


def parse_int(text: str, *, where: str, name: str, root: Path, layout: str) -> int:
    """``int(text)`` or a layout error saying where a non-integer id was found."""
    try:
        return int(text)
    except ValueError:
        raise layout_error(name, root, layout, f"{where}: expected an integer id, got {text!r}") from None


def split_classes(class_ids: Sequence[int], split: str, train_count: int | None = None) -> list[int]:
    """Zero-shot class split: train = the first ``train_count`` of the sorted ids (default ``n // 2``), test = the rest."""
    ordered = sorted(class_ids)
    half = len(ordered) // 2 if train_count is None else train_count
    return ordered[:half] if split == "train" else ordered[half:]


def contiguous_labels(original: Sequence[int] | np.ndarray, vocabulary: Sequence[int]) -> np.ndarray:
    """Position of each ``original`` id in the sorted ``vocabulary`` (0-based contiguous labels)."""
    vocab = np.asarray(sorted(vocabulary))
    original = np.asarray(original)
    if original.size == 0:
        return np.zeros(0, dtype=np.int64)
    labels = np.searchsorted(vocab, original)
    if labels.max() >= len(vocab) or not np.array_equal(vocab[labels], original):
        raise ValueError("contiguous_labels: some ids are not in the vocabulary")
    return labels.astype(np.int64)


# ----------------------------------------------------------------------------------------------
# CUB-200-2011
# ----------------------------------------------------------------------------------------------
def read_cub(
    root: str | Path,
    split: str,
    *,
    transform: Callable | None = None,
    name: str = "cub200",
    cache: bool = False,
    flip_invariant: bool = True,
    train_classes: int | None = None,
) -> ImageListDataset:
    """Read a CUB-200-2011-layout folder and return the zero-shot ``split`` ("train" or "test").

    Classes are those of ``classes.txt``; train = the first half of the sorted class ids, test = the
    second half (odd count: the extra class goes to test); ``train_classes``: the first that many ids instead. Images keep the order of their ids.
    Labels are 0-based within the split; ``class_names[label]`` is the ``classes.txt`` folder name
    (e.g. ``"101.Sooty_Albatross"``). ``root`` may be ``CUB_200_2011/`` or its parent.
    """
    check_split(split, CUB_SPLITS, name=name)
    base = resolve_root(root, CUB_DIR, "images.txt")
    require_paths(base, CUB_FILES, ["images"], name=name, layout=CUB_LAYOUT)

    def table(filename: str) -> list[list[str]]:
        return read_id_table(base / filename, name=name, root=base, layout=CUB_LAYOUT, columns=2)

    def as_int(text: str, filename: str) -> int:
        return parse_int(text, where=filename, name=name, root=base, layout=CUB_LAYOUT)

    class_name_by_id = {as_int(cid, "classes.txt"): cname for cid, cname in table("classes.txt")}
    if len(class_name_by_id) < 2:
        raise layout_error(
            name,
            base,
            CUB_LAYOUT,
            f"classes.txt lists {len(class_name_by_id)} class(es); need at least 2 for a train/test split",
        )
    file_by_image = {as_int(iid, "images.txt"): rel for iid, rel in table("images.txt")}
    class_by_image = {
        as_int(iid, "image_class_labels.txt"): as_int(cid, "image_class_labels.txt")
        for iid, cid in table("image_class_labels.txt")
    }

    unlabelled = sorted(set(file_by_image) - set(class_by_image))
    if unlabelled:
        raise layout_error(
            name,
            base,
            CUB_LAYOUT,
            f"{len(unlabelled)} image ids of images.txt have no line in image_class_labels.txt, first: {unlabelled[:MAX_LISTED_MISSING]}",
        )
    unknown = sorted({c for c in class_by_image.values()} - set(class_name_by_id))
    if unknown:
        raise layout_error(
            name,
            base,
            CUB_LAYOUT,
            f"image_class_labels.txt uses class ids absent from classes.txt: {unknown[:MAX_LISTED_MISSING]}",
        )

    split_ids = split_classes(list(class_name_by_id), split, train_classes)
    keep = set(split_ids)
    image_ids = sorted(i for i in file_by_image if class_by_image[i] in keep)
    paths = [base / "images" / file_by_image[i] for i in image_ids]
    check_images_exist(paths, name=name, root=base, layout=CUB_LAYOUT)
    labels = contiguous_labels([class_by_image[i] for i in image_ids], split_ids)
    return ImageListDataset(
        paths,
        labels,
        class_names=[class_name_by_id[c] for c in split_ids],
        transform=transform,
        name=f"{name}/{split}",
        cache=cache,
        flip_invariant=flip_invariant,
    )


@register_dataset("cub200")
def build(root: str | Path, split: str, transform: Callable | None = None) -> ImageListDataset:
    """CUB-200-2011, zero-shot split: classes 1–100 train (5,864 images), 101–200 test (5,924)."""
    return read_cub(root, split, transform=transform, name="cub200")
