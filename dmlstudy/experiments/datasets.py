"""The dataset tour (``notebooks/00_datasets.ipynb``): example grids, class definitions, nearest classes,
and the raw-pixel kNN baseline that shows how hard each embedded set is."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from dmlstudy import metrics as metric_functions
from dmlstudy import plots
from dmlstudy.config import TypedConfig
from dmlstudy.data import ImageListDataset, build_dataset
from dmlstudy.paths import data_root


@dataclass
class DatasetTour(TypedConfig):
    """Parameters of the dataset tour."""

    data_root: str = ""  # default: <project>/data
    datasets: list = field(
        default_factory=lambda: ["synbirds", "glyphs"]
    )  # sets to show: synbirds, glyphs, emoji (built by `dmlstudy data generate emoji`)
    classes_shown: int = 6  # classes per example grid
    images_per_class: int = 8  # images per class in the grids
    knn_sizes: list = field(default_factory=lambda: [64, 32])  # pixel sizes for the raw-pixel kNN baseline
    knn_classes: int = 0  # 0: all test classes in the raw-pixel kNN; n: the first n (CI-sized)
    seed: int = 0  # which images are shown

    def root(self, name: str) -> Path:
        return Path(self.data_root or data_root()) / name


def emoji_card(tour: DatasetTour) -> pd.DataFrame:
    """The emoji dataset's card, from the manifest its build wrote: one row per npm package of designs, with its
    pinned version, licence, attribution and the images it gave (docs/datasets/emoji.md says what was dropped)."""
    manifest = json.loads((tour.root("emoji") / "manifest.json").read_text())
    columns = ["package", "version", "licence", "images", "attribution"]
    return pd.DataFrame([{key: source.get(key, "") for key in columns} for source in manifest["sources"]])


def load_splits(tour: DatasetTour, name: str) -> dict[str, ImageListDataset]:
    """Train and test splits of an embedded dataset (generated on first use)."""
    return {split: build_dataset(name, tour.root(name), split) for split in ("train", "test")}


def example_grid(dataset: ImageListDataset, *, classes: list[int], images_per_class: int, seed: int = 0):
    """One row per class, ``images_per_class`` random images of it."""
    rng = np.random.default_rng(seed)
    images, row_labels = [], []
    for label in classes:
        members = np.flatnonzero(dataset.labels == label)
        chosen = rng.choice(members, size=min(images_per_class, len(members)), replace=False)
        images += [np.asarray(dataset.load_image(int(i))) for i in chosen]
        images += [np.ones_like(images[-1]) * 255] * (images_per_class - len(chosen))
        row_labels.append(dataset.class_names[label].split(".", 1)[-1][:22])
    return plots.credit(plots.image_grid(images, columns=images_per_class, row_labels=row_labels), dataset)


def pixel_matrix(dataset: ImageListDataset, *, size: int, classes: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Flattened RGB pixels (resized to ``size``) of the first ``classes`` classes (all when 0)."""
    keep = np.flatnonzero(dataset.labels < classes) if classes else np.arange(len(dataset))
    rows = [
        np.asarray(dataset.load_image(int(i)).resize((size, size), Image.BILINEAR), dtype=np.float32).ravel() / 255.0
        for i in keep
    ]
    return np.stack(rows), dataset.labels[keep]


def pixel_knn_table(tour: DatasetTour) -> pd.DataFrame:
    """Raw-pixel cosine kNN retrieval on the test classes: the floor a learned embedding must beat."""
    rows = []
    for name in tour.datasets:
        test = load_splits(tour, name)["test"]
        for size in tour.knn_sizes:
            pixels, labels = pixel_matrix(test, size=size, classes=tour.knn_classes)
            values = metric_functions.retrieval_metrics(pixels, labels, ks=(1, 2, 4, 8))
            rows.append(
                {
                    "dataset": name,
                    "pixels": f"{size}×{size}×3",
                    "test images": len(labels),
                    "classes": len(np.unique(labels)),
                    **{
                        key: round(100 * value, 1)
                        for key, value in values.items()
                        if key in ("R@1", "R@2", "R@4", "R@8", "MAP@R")
                    },
                }
            )
    return pd.DataFrame(rows)


def summary_table(tour: DatasetTour) -> pd.DataFrame:
    """Images and classes per split of each embedded dataset."""
    rows = []
    for name in tour.datasets:
        splits = load_splits(tour, name)
        for split, dataset in splits.items():
            counts = np.bincount(dataset.labels)
            rows.append(
                {
                    "dataset": name,
                    "split": split,
                    "classes": dataset.num_classes,
                    "images": len(dataset),
                    "images per class": f"{counts.min()}–{counts.max()}",
                    "size": "×".join(map(str, dataset.load_image(0).size)),
                }
            )
    return pd.DataFrame(rows)


def class_definition_table(tour: DatasetTour, *, class_index: int = 100) -> pd.DataFrame:
    """The part attributes that define one SynBirds class and its nearest classes (differing parts marked)."""
    from dmlstudy.data.synbirds import load_class_attributes, nearest_classes

    classes = load_class_attributes(tour.root("synbirds"))
    neighbours = nearest_classes(classes, class_index, k=3)
    columns = {classes[class_index]["name"]: classes[class_index]["attributes"]}
    for neighbour in neighbours:
        attributes = classes[neighbour["index"]]["attributes"]
        columns[neighbour["name"]] = {
            part: (f"**{value}**" if part in neighbour["differing"] else value) for part, value in attributes.items()
        }
    return pd.DataFrame(columns)


def nearest_classes_figure(tour: DatasetTour, *, class_index: int = 100, images_per_class: int = 6):
    """Images of one SynBirds test class (top row) and of its three nearest classes by attributes, each row
    labelled with the parts in which it differs from the top class."""
    from dmlstudy.data.synbirds import load_class_attributes, nearest_classes

    classes = load_class_attributes(tour.root("synbirds"))
    test = load_splits(tour, "synbirds")["test"]
    by_name = {name.split(".", 1)[-1]: label for label, name in enumerate(test.class_names)}
    rows = [(classes[class_index]["name"], "reference")]
    rows += [
        (n["name"], ", ".join(f"{part}: {new}" for part, (_, new) in n["differing"].items()))
        for n in nearest_classes(classes, class_index, k=3)
    ]
    rng = np.random.default_rng(tour.seed)
    images, labels = [], []
    for name, difference in rows:
        if name not in by_name:
            continue
        members = np.flatnonzero(test.labels == by_name[name])
        images += [
            np.asarray(test.load_image(int(i)))
            for i in rng.choice(members, size=min(images_per_class, len(members)), replace=False)
        ]
        labels.append(f"{name}\n({difference})")
    return plots.image_grid(images, columns=images_per_class, row_labels=labels, size=1.3)
