"""Image-list datasets, layout errors and the dataset registry.

Every reader (real benchmarks and the embedded sets) returns an :class:`ImageListDataset`: a list of
image files with 0-based class labels that are contiguous *within the split* (what proxy and
classifier losses need), plus the original class names/ids so nothing is lost.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError


class DatasetLayoutError(FileNotFoundError):
    """A dataset folder does not have the expected layout; the message shows the layout and what is missing."""


class CorruptImageError(OSError):
    """An image file could not be decoded; the message names the file."""


class ImageListDataset(torch.utils.data.Dataset):
    """Images listed by path with integer labels.

    Args:
        paths: image files.
        labels: class index per image, 0-based and contiguous within this split.
        class_names: ``class_names[label]`` is the human-readable name (or original id) of a class.
        transform: applied to the RGB ``PIL.Image``.
        name: dataset name and split, for messages.
        cache: keep decoded images in memory after the first read (small embedded sets).
        flip_invariant: whether a horizontal flip keeps the class (False for glyphs: b/d).
    """

    def __init__(
        self,
        paths: Sequence[str | Path],
        labels: Sequence[int] | np.ndarray,
        *,
        class_names: Sequence[str] | None = None,
        transform: Callable | None = None,
        name: str = "",
        cache: bool = False,
        flip_invariant: bool = True,
    ) -> None:
        self.paths = [Path(p) for p in paths]
        self.labels = np.asarray(labels, dtype=np.int64)
        if len(self.paths) != len(self.labels):
            raise ValueError(f"{name}: {len(self.paths)} paths but {len(self.labels)} labels")
        n_classes = int(self.labels.max()) + 1 if len(self.labels) else 0
        self.class_names = list(class_names) if class_names is not None else [str(c) for c in range(n_classes)]
        self.transform = transform
        self.name = name
        self.flip_invariant = flip_invariant
        self._cache: dict[int, Image.Image] | None = {} if cache else None
        self._items: dict[int, tuple[Any, int]] | None = None

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def __len__(self) -> int:
        return len(self.paths)

    def load_image(self, index: int) -> Image.Image:
        """The RGB image at ``index``; a file that cannot be decoded raises :class:`CorruptImageError`."""
        if self._cache is not None and index in self._cache:
            return self._cache[index]
        image = self.read_image(index)
        if self._cache is not None:
            self._cache[index] = image
        return image

    def read_image(self, index: int) -> Image.Image:
        """Decode the RGB image at ``index`` from its file, bypassing the in-memory cache (used to build the tensor cache)."""
        path = self.paths[index]
        try:
            with Image.open(path) as handle:
                image = handle.convert("RGB")
        except FileNotFoundError as error:
            raise DatasetLayoutError(f"{self.name}: image file listed but missing: {path}") from error
        except (UnidentifiedImageError, OSError, SyntaxError) as error:
            raise CorruptImageError(f"{self.name}: cannot decode image file {path}: {error}") from error
        return image

    def memoize_items(self) -> None:
        """Keep every transformed item after its first load. Only for a deterministic ``transform`` (the test
        transforms) on a split that fits in memory: evaluating after every epoch then decodes and transforms
        each image once per run (on SynBirds that was ≈ 70 % of an evaluation's time)."""
        self._items = {}

    @property
    def is_memoized(self) -> bool:
        """Whether :meth:`memoize_items` was called (DataLoader workers would fill and drop their own copies)."""
        return self._items is not None

    def __getitem__(self, index: int):
        if self._items is not None and index in self._items:
            return self._items[index]
        image = self.load_image(index)
        if self.transform is not None:
            image = self.transform(image)
        item = image, int(self.labels[index])
        if self._items is not None:
            self._items[index] = item
        return item


_VERIFIED: set[tuple[str, int, int]] = set()  # (path, size, mtime_ns) of files verified in this process


def _image_problem(path: Path) -> str:
    """Why ``path`` is not a readable image ("" when it is): a cheap check, no pixel decoding."""
    try:
        with Image.open(path) as handle:
            kind = handle.format
            if kind == "PNG":
                handle.verify()  # walks every chunk and checks its CRC: finds truncated and damaged files
        if kind == "JPEG":
            with open(path, "rb") as raw:
                raw.seek(-2, 2)
                if raw.read(2) != b"\xff\xd9":
                    return "truncated JPEG (no end-of-image marker)"
    except FileNotFoundError:
        return "missing"
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    return ""


def verify_images(dataset: ImageListDataset) -> None:
    """Check every image file of a split before training reads it, and raise one
    :class:`CorruptImageError` listing the bad files.

    Decision, from a measurement on SynBirds' 8,000 64-px PNGs (one CPU core, files in the page cache):
    opening every header took 0.65 s, ``Image.verify()`` (PNG chunk CRCs, no decompression) 1.2 s, a full
    decode 3.4 s. ``verify()`` finds truncated and damaged PNGs at a third of the decode cost; for JPEG
    (where PIL's ``verify`` checks little) the header is opened and the end-of-image marker is checked, which
    finds truncated files. Pixel-level damage that still decodes is out of reach of any check short of a
    decode. Files that passed (same path, size and modification time) are not checked again in this process.
    """
    bad = []
    for path in dataset.paths:
        try:
            status = path.stat()
        except FileNotFoundError:
            bad.append((path, "missing"))
            continue
        key = (str(path), status.st_size, status.st_mtime_ns)
        if key in _VERIFIED:
            continue
        problem = "empty file" if status.st_size == 0 else _image_problem(path)
        if problem:
            bad.append((path, problem))
        else:
            _VERIFIED.add(key)
    if bad:
        shown = "; ".join(f"{path} ({problem})" for path, problem in bad[:10])
        more = f" and {len(bad) - 10} more" if len(bad) > 10 else ""
        raise CorruptImageError(
            f"{dataset.name}: {len(bad)} of {len(dataset)} image files cannot be read: {shown}{more}"
        )


DatasetBuilder = Callable[..., ImageListDataset]
DATASETS: dict[str, DatasetBuilder] = {}


@dataclass(frozen=True)
class EvaluationProtocol:
    """How a dataset is evaluated: the query split, the gallery split (None: all-vs-all within the query
    split, self excluded) and the Recall@K list of the papers for it."""

    query_split: str = "test"
    gallery_split: str | None = None
    recall_ks: tuple[int, ...] = (1, 2, 4, 8)


PROTOCOLS: dict[str, EvaluationProtocol] = {}
IMAGE_CREDITS: dict[str, str] = {}  # dataset name → the attribution a figure showing its images carries
IMAGE_SETS: dict[str, tuple] = {}  # dataset name → its ImageSetCredit per set of images
NOTICES_FILE = "THIRD_PARTY_NOTICES.md"  # the full notices and licence texts, at the project root


@dataclass(frozen=True)
class Licence:
    """A licence by its SPDX id: the ``name`` a credit shows, the ``url`` of its text, and whether it is
    ShareAlike (an adaptation may be shared only under the same licence)."""

    spdx: str
    name: str
    url: str
    share_alike: bool = False


LICENCES: dict[str, Licence] = {
    licence.spdx: licence
    for licence in (
        Licence("CC-BY-4.0", "CC BY 4.0", "https://creativecommons.org/licenses/by/4.0/"),
        Licence("CC-BY-SA-4.0", "CC BY-SA 4.0", "https://creativecommons.org/licenses/by-sa/4.0/", share_alike=True),
        Licence("Apache-2.0", "Apache-2.0", "https://www.apache.org/licenses/LICENSE-2.0"),
        Licence("MIT", "MIT", "https://opensource.org/license/mit"),
    )
}


def licence(spdx: str) -> Licence:
    """The :class:`Licence` of an SPDX id; an id without an entry in :data:`LICENCES` is an error."""
    if spdx not in LICENCES:
        raise ValueError(f"unknown licence {spdx!r}: expected one of {sorted(LICENCES)} (add it to LICENCES)")
    return LICENCES[spdx]


@dataclass(frozen=True)
class ImageSetCredit:
    """Who made one set of images and under which licence: ``title`` by ``authors``, licence ``spdx`` whose text
    is at ``licence_url`` (the licence's own page unless the upstream names another, e.g. its MIT file)."""

    title: str
    authors: str
    spdx: str
    licence_url: str = ""

    @property
    def licence(self) -> Licence:
        return licence(self.spdx)

    @property
    def url(self) -> str:
        return self.licence_url or self.licence.url


def credit_text(dataset: str, sets: Sequence[ImageSetCredit], *, changes: str) -> str:
    """The attribution a figure showing images of ``dataset`` carries: ``changes`` (what was modified, as CC BY
    4.0 § 3(a)(1)(B) asks), every set's title and authors grouped under its licence name and link, and, when a
    set is ShareAlike, the statement that a figure showing its images is an adaptation licensed under that
    same licence (CC BY-SA 4.0 § 3(b)). The full notices are in :data:`NOTICES_FILE`."""
    groups: dict[tuple[str, str], list[str]] = {}
    for image_set in sets:
        groups.setdefault((image_set.licence.name, image_set.url), []).append(
            f"{image_set.title} by {image_set.authors}"
        )
    parts = [f"Images: {dataset}, {changes}."]
    parts += [f"{name} ({url}): {'; '.join(titles).rstrip('.')}." for (name, url), titles in groups.items()]
    for spdx in dict.fromkeys(s.spdx for s in sets if s.licence.share_alike):
        titles = " or ".join(s.title for s in sets if s.spdx == spdx)
        parts.append(
            f"Where this figure shows {titles} drawings it is an adaptation of them, licensed {licence(spdx).name}."
        )
    parts.append(f"Full notices: {NOTICES_FILE}.")
    return " ".join(parts)


def register_image_credit(dataset: str, sets: Sequence[ImageSetCredit], *, changes: str) -> str:
    """Record the credit of ``dataset``'s images (:func:`credit_text`) in :data:`IMAGE_CREDITS` and its sets in
    :data:`IMAGE_SETS`; returns the text."""
    IMAGE_SETS[dataset] = tuple(sets)
    IMAGE_CREDITS[dataset] = credit_text(dataset, sets, changes=changes)
    return IMAGE_CREDITS[dataset]


def adaptation_licence(dataset: str) -> str:
    """The licence a figure showing ``dataset``'s images must carry as an adaptation: the name of the
    ShareAlike licence of one of its sets (all ShareAlike sets of a dataset share one here), else ""."""
    names = {s.licence.name for s in IMAGE_SETS.get(dataset, ()) if s.licence.share_alike}
    if len(names) > 1:
        raise ValueError(f"{dataset}: images under several ShareAlike licences {sorted(names)} cannot share a figure")
    return names.pop() if names else ""


def image_credit(dataset) -> str:
    """The attribution of the images of ``dataset`` (a split, a part of one, a Subset or a wrapper of a split,
    matched by its dataset name), ``""`` for images that need none (the generated sets)."""
    while not isinstance(getattr(dataset, "name", None), str):
        inner = getattr(dataset, "split", None) or getattr(dataset, "dataset", None)
        if inner is None:
            return ""
        dataset = inner
    return IMAGE_CREDITS.get(dataset.name.split(" (", 1)[0].split("/", 1)[0], "")  # "emoji/test (first 8 classes)"


def register_dataset(
    name: str, *, protocol: EvaluationProtocol = EvaluationProtocol()
) -> Callable[[DatasetBuilder], DatasetBuilder]:
    """Decorator: ``@register_dataset("cub200") def build(root, split, transform=None) -> ImageListDataset``."""

    def decorator(builder: DatasetBuilder) -> DatasetBuilder:
        if name in DATASETS:
            raise ValueError(f"dataset {name!r} registered twice")
        DATASETS[name] = builder
        PROTOCOLS[name] = protocol
        return builder

    return decorator


def evaluation_protocol(name: str) -> EvaluationProtocol:
    """The evaluation protocol of a registered dataset."""
    if name not in PROTOCOLS:
        raise KeyError(f"unknown dataset {name!r}; valid names: {', '.join(list_datasets())}")
    return PROTOCOLS[name]


def list_datasets() -> list[str]:
    return sorted(DATASETS)


def build_dataset(
    name: str, root: str | Path | None = None, split: str = "train", transform: Callable | None = None, **kwargs
) -> ImageListDataset:
    """Build a registered dataset split. ``root=None`` means ``data/<name>`` (embedded sets are generated there)."""
    if name not in DATASETS:
        raise KeyError(f"unknown dataset {name!r}; valid names: {', '.join(list_datasets())}")
    root = Path(root) if root is not None else Path("data") / name
    return DATASETS[name](root=root, split=split, transform=transform, **kwargs)
