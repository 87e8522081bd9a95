"""Cars196 reader (Krause et al. 2013), zero-shot DML split: classes 1–98 train (8,054 images),
99–196 test (8,131). The ``test`` flag of ``cars_annos.mat`` (the classification split) and the
bounding boxes are ignored: the DML protocol uses whole images.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dmlstudy.data.base import ImageListDataset, register_dataset
from dmlstudy.data.cub import (
    MAX_LISTED_MISSING,
    check_images_exist,
    check_split,
    contiguous_labels,
    layout_error,
    require_paths,
    split_classes,
)

CARS_SPLITS = ("train", "test")
CARS_LAYOUT = """\
<root>/
├── cars_annos.mat     MATLAB file: struct array `annotations` (fields relative_im_path
│                      'car_ims/000001.jpg', bbox_x1, bbox_y1, bbox_x2, bbox_y2, class (1-based), test)
│                      and cell array `class_names`
└── car_ims/000001.jpg ... 016185.jpg"""


def _scalar(value: Any) -> Any:
    """Unwrap what ``loadmat`` makes of a MATLAB scalar or char array (``array([[3]])``,
    ``array(['car_ims/...'])`` or already a Python value) into the bare value."""
    while isinstance(value, np.ndarray):
        if value.size != 1:
            raise ValueError(f"expected a scalar, got an array of shape {value.shape}")
        value = value.reshape(()).item() if value.dtype != object else value.reshape(-1)[0]
    return value.item() if isinstance(value, np.generic) else value


def read_cars_annotations(
    mat_file: Path, *, name: str = "cars196", root: Path | None = None
) -> tuple[list[str], np.ndarray, list[str]]:
    """``(relative paths, 1-based class ids, class names)`` from ``cars_annos.mat``.

    Read with ``squeeze_me=True`` (``annotations`` becomes a 1-D record array, ``class_names`` a 1-D
    object array of ``str``); every value still goes through :func:`_scalar`, so an unsqueezed
    ``1 × N`` struct array of ``1 × 1`` matrices gives the same result.
    """
    from scipy.io import loadmat

    root = root or mat_file.parent
    try:
        mat = loadmat(mat_file, squeeze_me=True)
    except Exception as error:  # scipy raises ValueError/TypeError/MatReadError on a damaged file
        raise layout_error(name, root, CARS_LAYOUT, f"cannot read {mat_file.name}: {error}") from error
    missing = [key for key in ("annotations", "class_names") if key not in mat]
    if missing:
        raise layout_error(
            name,
            root,
            CARS_LAYOUT,
            f"{mat_file.name} has no variable(s) {', '.join(missing)} (found: {', '.join(k for k in mat if not k.startswith('__'))})",
        )
    annotations = np.atleast_1d(mat["annotations"]).reshape(-1)
    fields = annotations.dtype.names or ()
    absent = [f for f in ("relative_im_path", "class") if f not in fields]
    if absent:
        raise layout_error(
            name,
            root,
            CARS_LAYOUT,
            f"{mat_file.name}: `annotations` lacks field(s) {', '.join(absent)} (found: {', '.join(fields)})",
        )
    paths = [str(_scalar(v)) for v in annotations["relative_im_path"]]
    class_ids = np.array([int(_scalar(v)) for v in annotations["class"]], dtype=np.int64)
    class_names = [str(_scalar(v)) for v in np.atleast_1d(mat["class_names"]).reshape(-1)]
    return paths, class_ids, class_names


def read_cars(
    root: str | Path, split: str, *, transform: Callable | None = None, name: str = "cars196"
) -> ImageListDataset:
    """The zero-shot ``split`` of a Cars196 folder.

    Classes are ``1..len(class_names)``; train = the first half, test = the second half. Images keep
    the annotation order. ``class_names[label]`` is the make/model/year string of the class.
    """
    check_split(split, CARS_SPLITS, name=name)
    base = Path(root).expanduser()
    require_paths(base, ["cars_annos.mat"], ["car_ims"], name=name, layout=CARS_LAYOUT)
    rel_paths, class_ids, names = read_cars_annotations(base / "cars_annos.mat", name=name, root=base)
    all_ids = list(range(1, len(names) + 1))
    bad = sorted(set(class_ids.tolist()) - set(all_ids))
    if bad:
        raise layout_error(
            name,
            base,
            CARS_LAYOUT,
            f"cars_annos.mat: class ids {bad[:MAX_LISTED_MISSING]} outside 1..{len(names)} (the number of class_names)",
        )
    split_ids = split_classes(all_ids, split)
    keep = np.isin(class_ids, split_ids)
    paths = [base / p for p, k in zip(rel_paths, keep) if k]
    check_images_exist(paths, name=name, root=base, layout=CARS_LAYOUT)
    return ImageListDataset(
        paths,
        contiguous_labels(class_ids[keep], split_ids),
        class_names=[names[c - 1] for c in split_ids],
        transform=transform,
        name=f"{name}/{split}",
    )


@register_dataset("cars196")
def build(root: str | Path, split: str, transform: Callable | None = None) -> ImageListDataset:
    """Cars196, zero-shot split: classes 1–98 train (8,054 images), 99–196 test (8,131)."""
    return read_cars(root, split, transform=transform)
