"""In-Shop Clothes Retrieval reader (DeepFashion, Liu et al., CVPR 2016): the official partition
``train`` (3,997 items, 25,882 images), ``query`` (14,218 images) and ``gallery`` (12,612 images),
query and gallery sharing 3,985 items.

Query and gallery are labelled with ONE mapping built over the union of their item ids, so
``query label == gallery label`` exactly when both images show the same item; both datasets have
the same ``class_names`` (some classes may have no image in one of the two).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dmlstudy.data.base import EvaluationProtocol, ImageListDataset, register_dataset
from dmlstudy.data.cub import (
    MAX_LISTED_MISSING,
    check_images_exist,
    check_split,
    contiguous_labels,
    layout_error,
    read_id_table,
)

INSHOP_SPLITS = ("train", "query", "gallery")
PARTITION_FILE = "list_eval_partition.txt"
INSHOP_LAYOUT = """\
<root>/
├── list_eval_partition.txt   line 1: number of images; line 2: "image_name item_id evaluation_status";
│                             rows "img/WOMEN/Dresses/id_00000002/02_1_front.jpg id_00000002 train"
└── img/<GENDER>/<Category>/<item_id>/<NN>_<k>_<view>.jpg
or the release's tree: <root>/Eval/list_eval_partition.txt and <root>/Img/img/..."""


def locate_inshop(root: Path, *, name: str) -> tuple[Path, Path]:
    """``(partition file, folder holding img/)``: the flat layout or the release's Eval/ + Img/ tree."""
    partition = next((p for p in (root / PARTITION_FILE, root / "Eval" / PARTITION_FILE) if p.is_file()), None)
    image_base = next((b for b in (root, root / "Img") if (b / "img").is_dir()), None)
    if not root.is_dir():
        raise layout_error(name, root, INSHOP_LAYOUT, f"dataset folder does not exist: {root}")
    missing = []
    if partition is None:
        missing.append(f"file {PARTITION_FILE} (looked in {root} and {root / 'Eval'})")
    if image_base is None:
        missing.append(f"folder img/ (looked in {root} and {root / 'Img'})")
    if missing:
        raise layout_error(name, root, INSHOP_LAYOUT, "missing " + "; ".join(missing))
    return partition, image_base


def read_partition(partition: Path, *, name: str, root: Path) -> list[list[str]]:
    """Rows ``[image_name, item_id, status]``; checks the count line, the header and the statuses."""
    with open(partition, encoding="utf-8") as handle:
        head = [handle.readline().strip() for _ in range(2)]
    if not head[0].isdigit():
        raise layout_error(
            name, root, INSHOP_LAYOUT, f"{PARTITION_FILE} line 1 should be the number of images, got {head[0]!r}"
        )
    if not head[1].startswith("image_name"):
        raise layout_error(
            name,
            root,
            INSHOP_LAYOUT,
            f"{PARTITION_FILE} line 2 should be the header 'image_name item_id evaluation_status', got {head[1]!r}",
        )
    rows = read_id_table(partition, name=name, root=root, layout=INSHOP_LAYOUT, columns=3, skip=2)
    if len(rows) != int(head[0]):
        raise layout_error(
            name,
            root,
            INSHOP_LAYOUT,
            f"{PARTITION_FILE} announces {head[0]} images on line 1 but lists {len(rows)} (truncated file?)",
        )
    unknown = sorted({r[2] for r in rows} - set(INSHOP_SPLITS))
    if unknown:
        raise layout_error(
            name,
            root,
            INSHOP_LAYOUT,
            f"{PARTITION_FILE}: unknown evaluation_status {unknown[:MAX_LISTED_MISSING]}; expected one of {', '.join(INSHOP_SPLITS)}",
        )
    return rows


def read_inshop(
    root: str | Path, split: str, *, transform: Callable | None = None, name: str = "inshop"
) -> ImageListDataset:
    """The ``split`` ("train", "query" or "gallery") of an In-Shop folder.

    Labels: sorted item ids of the train rows for ``train``; sorted item ids of the query ∪ gallery
    rows for both ``query`` and ``gallery``. ``class_names[label]`` is the item id
    (``"id_00000002"``). Images keep the file's order.
    """
    check_split(split, INSHOP_SPLITS, name=name)
    base = Path(root).expanduser()
    partition, image_base = locate_inshop(base, name=name)
    rows = read_partition(partition, name=name, root=base)
    label_statuses = {"train"} if split == "train" else {"query", "gallery"}
    vocabulary = sorted({item for _, item, status in rows if status in label_statuses})
    selected = [(image, item) for image, item, status in rows if status == split]
    paths = [image_base / image for image, _ in selected]
    check_images_exist(paths, name=name, root=base, layout=INSHOP_LAYOUT)
    return ImageListDataset(
        paths,
        contiguous_labels([item for _, item in selected], vocabulary),
        class_names=vocabulary,
        transform=transform,
        name=f"{name}/{split}",
    )


@register_dataset(
    "inshop",
    protocol=EvaluationProtocol(query_split="query", gallery_split="gallery", recall_ks=(1, 10, 20, 30, 40, 50)),
)
def build(root: str | Path, split: str, transform: Callable | None = None) -> ImageListDataset:
    """In-Shop Clothes Retrieval: train 3,997 items; query 14,218 / gallery 12,612 images of 3,985 items."""
    return read_inshop(root, split, transform=transform)
