"""Writers of tiny benchmark folders in the official layouts, quirks included, for the reader tests.

Every writer returns the folder a user would pass as ``root`` and the list of :class:`Record` it
wrote: the independent ground truth the tests compare the readers against. Each image is a small
real JPEG whose grey level encodes its class (:func:`class_colour`), so a test can check that a decoded
file belongs to the label the reader gave it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

IMAGE_SIZE = (10, 8)  # W × H


@dataclass(frozen=True)
class Record:
    path: Path  # absolute path of the image file
    class_id: int | str  # original id (int for CUB/Cars/SOP, item id string for In-Shop)
    class_name: str
    split: str  # the split the record belongs to under the DML protocol


def class_colour(k: int) -> tuple[int, int, int]:
    """A grey level from which ``k % 12`` can be recovered after JPEG compression (20·(k % 12) + 10);
    grey so that the single-channel variant keeps it."""
    level = 20 * (k % 12) + 10
    return (level, level, level)


def decoded_class(image: Image.Image) -> int:
    """Inverse of :func:`class_colour` on a decoded (RGB) image: ``k % 12``."""
    red = float(np.asarray(image.convert("RGB"), dtype=np.float64)[..., 0].mean())
    return int(round((red - 10) / 20))


def write_image(path: Path, k: int, *, grayscale: bool = False, size: tuple[int, int] = IMAGE_SIZE) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.new("RGB", size, class_colour(k))
    if grayscale:  # CUB has a few single-channel JPEGs; the reader must still give RGB
        image = image.convert("L")
    image.save(path, format="JPEG", quality=95)


def write_apple_double(path: Path) -> None:
    """A macOS ``._name`` AppleDouble file: not an image, must never be listed or opened."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        " + bytes(64))


# ----------------------------------------------------------------------------------------------
def mixed_size(image_id: int) -> tuple[int, int]:
    """W × H of image ``image_id`` in a folder whose images differ in size, as CUB's photos do: landscape and
    portrait, 36 to 80 px a side, no two neighbours alike."""
    return 48 + 8 * (image_id % 5), 36 + 11 * (image_id % 4)


def write_cub(
    parent: Path, *, images_per_class: Sequence[int], stray: bool = True, mixed_sizes: bool = False
) -> tuple[Path, list[Record]]:
    """``parent/CUB_200_2011/`` with ``len(images_per_class)`` classes (ids 1..K, first half train).

    Quirks: 1-based ids, a grayscale JPEG, ``._*`` files next to the images and the class folders,
    ``train_test_split.txt`` that disagrees with the DML split; with ``mixed_sizes``, images of different
    sizes (:func:`mixed_size`), else all :data:`IMAGE_SIZE`. Returns ``(parent/CUB_200_2011, records)``.
    """
    base = parent / "CUB_200_2011"
    (base / "images").mkdir(parents=True)
    n_classes = len(images_per_class)
    records: list[Record] = []
    images_lines, label_lines, split_lines = [], [], []
    image_id = 0
    for class_id, count in enumerate(images_per_class, start=1):
        folder = f"{class_id:03d}.Bird_Species_{class_id}"
        for k in range(count):
            image_id += 1
            rel = f"{folder}/Bird_Species_{class_id}_{1000 + image_id}_{k}.jpg"
            path = base / "images" / rel
            size = mixed_size(image_id) if mixed_sizes else IMAGE_SIZE
            write_image(path, class_id, grayscale=(image_id == 2), size=size)
            if stray:
                write_apple_double(path.parent / f"._{path.name}")
            images_lines.append(f"{image_id} {rel}")
            label_lines.append(f"{image_id} {class_id}")
            split_lines.append(f"{image_id} {image_id % 2}")
            split = "train" if class_id <= n_classes // 2 else "test"
            records.append(Record(path, class_id, folder, split))
        if stray:
            write_apple_double(base / "images" / f"._{folder}")
    (base / "images.txt").write_text("\n".join(images_lines) + "\n")
    (base / "image_class_labels.txt").write_text("\n".join(label_lines) + "\n")
    (base / "train_test_split.txt").write_text("\n".join(split_lines) + "\n")
    classes = [f"{c} {c:03d}.Bird_Species_{c}" for c in range(1, n_classes + 1)]
    (base / "classes.txt").write_text("\n".join(classes) + "\n")
    return base, records


# ----------------------------------------------------------------------------------------------
CARS_FIELDS = ("relative_im_path", "bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2", "class", "test")


def write_cars(root: Path, *, images_per_class: Sequence[int], seed: int = 0) -> tuple[Path, list[Record]]:
    """``root/cars_annos.mat`` + ``root/car_ims/NNNNNN.jpg`` as in the official release.

    ``annotations`` is a 1 × N MATLAB struct array (fields :data:`CARS_FIELDS`, scalars stored as
    1 × 1 uint8/uint16 matrices, paths as char arrays), ``class_names`` a 1 × K cell array. The
    annotation order is shuffled and the ``test`` flag random: the reader must rely on neither.
    """
    from scipy.io import savemat

    rng = np.random.default_rng(seed)
    n_classes = len(images_per_class)
    class_ids = np.repeat(np.arange(1, n_classes + 1), images_per_class)
    rng.shuffle(class_ids)
    dtype = [(field, object) for field in CARS_FIELDS]
    annotations = np.zeros((1, len(class_ids)), dtype=dtype)
    names = [f"Make{c} Model {c} {2000 + c}" for c in range(1, n_classes + 1)]
    records: list[Record] = []
    for i, class_id in enumerate(class_ids):
        rel = f"car_ims/{i + 1:06d}.jpg"
        write_image(root / rel, int(class_id))
        annotations[0, i] = (
            rel,
            np.array([[3]], dtype=np.uint16),
            np.array([[2]], dtype=np.uint16),
            np.array([[9]], dtype=np.uint16),
            np.array([[7]], dtype=np.uint16),
            np.array([[class_id]], dtype=np.uint8),
            np.array([[rng.integers(0, 2)]], dtype=np.uint8),
        )
        split = "train" if class_id <= n_classes // 2 else "test"
        records.append(Record(root / rel, int(class_id), names[class_id - 1], split))
    class_names = np.empty((1, n_classes), dtype=object)
    for c, name in enumerate(names):
        class_names[0, c] = name
    savemat(root / "cars_annos.mat", {"annotations": annotations, "class_names": class_names})
    return root, records


# ----------------------------------------------------------------------------------------------
SOP_SUPER = ("bicycle", "cabinet", "chair")


def write_sop(parent: Path, *, images_per_class: Sequence[int]) -> tuple[Path, list[Record]]:
    """``parent/Stanford_Online_Products/`` with ``Ebay_train.txt`` / ``Ebay_test.txt`` (header line,
    1-based ids, ``.JPG`` files under ``<super>_final/``); classes 1..K, first half train."""
    base = parent / "Stanford_Online_Products"
    n_classes = len(images_per_class)
    header = "image_id class_id super_class_id path"
    lines: dict[str, list[str]] = {"train": [header], "test": [header]}
    info = ["image_id class_id super_class_id path"]
    records: list[Record] = []
    image_id = 0
    for class_id, count in enumerate(images_per_class, start=1):
        super_id = (class_id - 1) % len(SOP_SUPER) + 1
        split = "train" if class_id <= n_classes // 2 else "test"
        for k in range(count):
            image_id += 1
            rel = f"{SOP_SUPER[super_id - 1]}_final/{111085120000 + class_id}_{k}.JPG"
            write_image(base / rel, class_id)
            row = f"{image_id} {class_id} {super_id} {rel}"
            lines[split].append(row)
            info.append(row)
            records.append(Record(base / rel, class_id, str(class_id), split))
    for split in ("train", "test"):
        (base / f"Ebay_{split}.txt").write_text("\n".join(lines[split]) + "\n")
    (base / "Ebay_info.txt").write_text("\n".join(info) + "\n")
    return base, records


# ----------------------------------------------------------------------------------------------
def write_inshop(
    root: Path, *, items: Sequence[tuple[str, Sequence[str]]], official_tree: bool = False
) -> tuple[Path, list[Record]]:
    """In-Shop ``list_eval_partition.txt`` (count line, header line, space-padded rows, CRLF ends) and
    ``img/<GENDER>/<Category>/<item_id>/NN_K_view.jpg``.

    ``items``: ``(item_id, statuses)`` with one status ("train"/"query"/"gallery") per image.
    ``official_tree``: the release's tree (``Eval/list_eval_partition.txt``, ``Img/img/...``)
    instead of the flat one (``list_eval_partition.txt``, ``img/...``).
    """
    eval_dir = root / "Eval" if official_tree else root
    image_base = root / "Img" if official_tree else root
    rows: list[str] = []
    records: list[Record] = []
    views = ("front", "side", "back", "full", "additional")
    for index, (item_id, statuses) in enumerate(items):
        gender, category = ("WOMEN", "Dresses") if index % 2 == 0 else ("MEN", "Denim")
        for k, status in enumerate(statuses):
            rel = f"img/{gender}/{category}/{item_id}/{k // 5 + 1:02d}_{k % 5 + 1}_{views[k % 5]}.jpg"
            write_image(image_base / rel, index)
            rows.append(f"{rel:<50}{item_id:<20}{status}")
            records.append(Record(image_base / rel, item_id, item_id, status))
    eval_dir.mkdir(parents=True, exist_ok=True)
    text = "\r\n".join([str(len(rows)), "image_name item_id evaluation_status", *rows]) + "\r\n"
    (eval_dir / "list_eval_partition.txt").write_bytes(text.encode())
    return root, records
