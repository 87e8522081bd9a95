"""Stanford Online Products reader (Oh Song et al., CVPR 2016): the official DML split,
``Ebay_train.txt`` (11,318 classes, 59,551 images) and ``Ebay_test.txt`` (11,316 classes, 60,502).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from dmlstudy.data.base import EvaluationProtocol, ImageListDataset, register_dataset
from dmlstudy.data.cub import (
    check_images_exist,
    check_split,
    contiguous_labels,
    layout_error,
    parse_int,
    read_id_table,
    require_paths,
    resolve_root,
)

SOP_SPLITS = ("train", "test")
SOP_DIR = "Stanford_Online_Products"
SOP_LAYOUT = """\
<root>/                      (or its parent, holding Stanford_Online_Products/)
├── Ebay_train.txt           header "image_id class_id super_class_id path", then
├── Ebay_test.txt            rows "1 1 1 bicycle_final/111085122871_0.JPG"
└── <super_class>_final/<product>_<k>.JPG   (bicycle_final/, cabinet_final/, ...)"""


def read_sop(root: str | Path, split: str, *, transform: Callable | None = None, name: str = "sop") -> ImageListDataset:
    """The ``split`` ("train" or "test") listed in ``Ebay_<split>.txt``.

    Labels are the file's ``class_id`` made 0-based contiguous in sorted id order;
    ``class_names[label]`` is the original ``class_id`` as a string. Images keep the file's order.
    The super-class ids are kept as ``dataset.super_labels`` (original 1-based ids).
    """
    check_split(split, SOP_SPLITS, name=name)
    list_file = f"Ebay_{split}.txt"
    base = resolve_root(root, SOP_DIR, list_file)
    require_paths(base, [list_file], [], name=name, layout=SOP_LAYOUT)
    rows = read_id_table(base / list_file, name=name, root=base, layout=SOP_LAYOUT, columns=4, skip=1)
    if not rows:
        raise layout_error(name, base, SOP_LAYOUT, f"{list_file} lists no images")

    def as_int(text: str, row: int) -> int:
        return parse_int(text, where=f"{list_file} data row {row}", name=name, root=base, layout=SOP_LAYOUT)

    class_ids = np.array([as_int(row[1], i + 1) for i, row in enumerate(rows)], dtype=np.int64)
    super_ids = np.array([as_int(row[2], i + 1) for i, row in enumerate(rows)], dtype=np.int64)
    paths = [base / row[3] for row in rows]
    check_images_exist(paths, name=name, root=base, layout=SOP_LAYOUT)
    vocabulary = np.unique(class_ids).tolist()
    dataset = ImageListDataset(
        paths,
        contiguous_labels(class_ids, vocabulary),
        class_names=[str(c) for c in vocabulary],
        transform=transform,
        name=f"{name}/{split}",
    )
    dataset.super_labels = super_ids
    return dataset


@register_dataset(
    "sop", protocol=EvaluationProtocol(query_split="test", gallery_split=None, recall_ks=(1, 10, 100, 1000))
)
def build(root: str | Path, split: str, transform: Callable | None = None) -> ImageListDataset:
    """Stanford Online Products: 11,318 train / 11,316 test classes (59,551 / 60,502 images)."""
    return read_sop(root, split, transform=transform)
