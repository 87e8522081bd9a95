"""Shared machinery of the embedded (offline-generated) datasets: CUB layout writer, atomic generation.

The embedded sets (``synbirds``, ``glyphs``) are generated on first use into the CUB-200-2011 on-disk
layout, so the one CUB reader (:func:`dmlstudy.data.cub.read_cub`) reads them:

* :func:`write_cub_layout` writes ``images.txt``, ``image_class_labels.txt``, ``classes.txt``,
  ``train_test_split.txt`` and ``images/<class_folder>/<file>.png`` (ids 1-based, folders ``001.name``).
* :func:`register_generated` registers a generated set by name: its split is generated into ``root`` on first use
  (:func:`ensure_generated`) and read as the first half of the classes (train) or the rest (test).
* :func:`ensure_generated` generates a dataset folder once: into a temporary sibling folder that is
  renamed onto the final path only when complete, with a ``GENERATED.json`` marker written last. A folder
  without the marker is never taken as a dataset, and a folder made with another generator, version,
  seed or configuration raises :class:`GenerationMismatchError` instead of being silently reused.

Determinism: every image is drawn from its own random stream, :func:`image_rng` ``(seed, class, index)``,
and PNGs are encoded with fixed options (:func:`encode_png`), so the same seed gives byte-identical files
whatever the order or the number of worker processes.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
from PIL import Image
from tqdm.auto import tqdm

from dmlstudy.data.base import DatasetLayoutError, ImageListDataset, register_dataset
from dmlstudy.data.cub import read_cub
from dmlstudy.progress_bars import disabled

MARKER = "GENERATED.json"
PARTIAL_TAG = ".partial-"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_COMPRESS_LEVEL = 6
CLASS_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_+\-]+$")

T = TypeVar("T")
R = TypeVar("R")


class GenerationMismatchError(RuntimeError):
    """A generated dataset folder exists but was made by another generator, version, seed or configuration."""


class DatasetGenerator(Protocol):
    """What :func:`ensure_generated` needs from a generator.

    ``name`` and ``version`` identify the procedure (bump ``version`` whenever the output changes);
    ``config()`` returns every parameter other than the seed that changes the output (sizes, counts);
    ``generate(folder, seed=...)`` writes the whole dataset into the existing empty ``folder`` and
    returns counts for the marker (e.g. ``{"classes": 200, "images": 8000}``).
    """

    name: str
    version: str

    def config(self) -> dict[str, Any]: ...

    def generate(self, folder: Path, *, seed: int) -> dict[str, int]: ...


# ----------------------------------------------------------------------------------------------
# Determinism helpers
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SquareImagesGenerator:
    """The fields, checks and writing that SynBirds and the fractals and shapes source sets share: ``num_classes`` classes of
    ``images_per_class`` square images of ``image_size`` pixels; ``workers`` only changes the speed, never the
    output (per-image random streams). A subclass sets ``name``, ``version``, its defaults and ``generate`` (which draws the classes and calls
    :meth:`write_classes`)."""

    num_classes: int = 200
    images_per_class: int = 40
    image_size: int = 64
    workers: int = 2

    def __post_init__(self) -> None:
        if self.num_classes < 2 or self.images_per_class < 1 or self.image_size < 8:
            raise ValueError(
                f"{type(self).__name__}: need num_classes >= 2, images_per_class >= 1, image_size >= 8; "
                f"got {self.config()}"
            )

    def config(self) -> dict[str, Any]:
        return {
            "num_classes": self.num_classes,
            "images_per_class": self.images_per_class,
            "image_size": self.image_size,
        }

    @property
    def train_classes(self) -> int:
        """The first half of the classes are the ``train`` split, the rest ``test``."""
        return self.num_classes // 2

    def write_classes(
        self,
        folder: Path,
        *,
        seed: int,
        specs: Sequence[Any],
        names: Sequence[str],
        render_job: Callable[[tuple], bytes],
        records_file: str,
        records: Sequence[dict[str, Any]],
    ) -> dict[str, int]:
        """What every square-image generator's ``generate`` does once its classes are drawn: render
        ``images_per_class`` images of every class (class-major order; ``render_job`` gets
        ``(spec, seed, class, index, image_size)`` and returns PNG bytes), write the CUB layout (the first
        :attr:`train_classes` classes train) and the class ``records`` as JSON to ``records_file``, and return
        the marker's counts."""
        jobs = [
            (spec, seed, c, i, self.image_size) for c, spec in enumerate(specs) for i in range(self.images_per_class)
        ]
        images = parallel_map(render_job, jobs, workers=self.workers, progress=f"generating {self.name}")
        labels = [c for c in range(self.num_classes) for _ in range(self.images_per_class)]
        write_cub_layout(folder, images, labels, list(names), train_classes=range(self.train_classes))
        (folder / records_file).write_text(json.dumps(list(records), indent=1) + "\n", encoding="utf-8")
        return {
            "classes": self.num_classes,
            "images": len(images),
            "train_classes": self.train_classes,
            "test_classes": self.num_classes - self.train_classes,
        }


def image_rng(seed: int, class_index: int, image_index: int, *, stream: int = 0) -> np.random.Generator:
    """Independent random stream of one image: ``PCG64(SeedSequence([seed, class, index, stream]))``.

    Depends only on its arguments, so images can be drawn in any order or process.
    """
    for what, value in (("seed", seed), ("class_index", class_index), ("image_index", image_index), ("stream", stream)):
        if int(value) < 0:
            raise ValueError(f"image_rng: {what} must be >= 0, got {value}")
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(class_index), int(image_index), int(stream)]))


def encode_png(image: np.ndarray | Image.Image) -> bytes:
    """PNG bytes of an RGB image (``H × W × 3`` uint8 array or PIL image) with fixed options.

    Fixed ``compress_level``, no ``optimize`` and no metadata chunks, so equal pixels give equal bytes.
    """
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            raise ValueError(
                f"encode_png: expected an H × W × 3 uint8 array, got shape {image.shape} dtype {image.dtype}"
            )
        image = Image.fromarray(np.ascontiguousarray(image))
    elif isinstance(image, Image.Image):
        image = image.convert("RGB")
    else:
        raise TypeError(f"encode_png: expected a numpy array or PIL image, got {type(image).__name__}")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=PNG_COMPRESS_LEVEL, optimize=False)
    return buffer.getvalue()


def parallel_map(
    function: Callable[[T], R], items: Sequence[T], *, workers: int = 2, chunksize: int = 8, progress: str = ""
) -> list[R]:
    """``[function(x) for x in items]`` over ``workers`` processes, results in input order.

    ``function`` must be a module-level function. Uses ``forkserver`` where the platform has it, ``spawn``
    otherwise: never a plain ``fork``, which copies the caller's locks as they are. In a Jupyter kernel (ZMQ
    threads) or beside tqdm's monitor thread a forked child could start with a lock held and wait forever; a
    CI run hung so in ``test_smoke_plan`` (the kernel generating the datasets, 2026-11-26). ``workers <= 1``
    runs in this process.
    ``progress``: the description of a tqdm bar over the items (none when empty).
    """
    with tqdm(total=len(items), desc=progress, unit="item", disable=disabled(not progress)) as bar:
        if workers <= 1 or len(items) <= chunksize:
            results = []
            for item in items:
                results.append(function(item))
                bar.update()
            return results
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        with context.Pool(processes=min(workers, len(items))) as pool:
            results = []
            for result in pool.imap(function, items, chunksize=chunksize):  # imap keeps the input order
                results.append(result)
                bar.update()
            return results


# ----------------------------------------------------------------------------------------------
# CUB layout writer
# ----------------------------------------------------------------------------------------------
def class_folder_name(class_index: int, class_name: str) -> str:
    """CUB-style class folder ``"{id:03d}.{name}"`` for the 0-based ``class_index`` (id = index + 1)."""
    if not CLASS_NAME_PATTERN.match(class_name):
        raise ValueError(
            f"class name {class_name!r} (class index {class_index}) must match {CLASS_NAME_PATTERN.pattern}: no spaces, dots or slashes"
        )
    return f"{class_index + 1:03d}.{class_name}"


def write_cub_layout(
    root: str | Path,
    images: Sequence[bytes | np.ndarray | Image.Image],
    labels: Sequence[int] | np.ndarray,
    class_names: Sequence[str],
    *,
    train_classes: Collection[int],
) -> list[str]:
    """Write images and their labels as a CUB-200-2011 folder; return the relative image paths.

    Args:
        root: folder to write into (created if missing; existing index files are overwritten).
        images: per image, PNG bytes (written verbatim) or an RGB image/array (encoded by :func:`encode_png`).
        labels: per image, the 0-based index of its class in ``class_names``.
        class_names: class names without spaces or dots; folder of class ``c`` is ``f"{c+1:03d}.{name}"``.
        train_classes: 0-based indices of the training classes (``train_test_split.txt`` says 1 for
            their images, 0 otherwise). The DML reader ignores that file and splits by class id halves.

    Layout: ``images.txt`` "<id> <class_folder>/<file>", ``image_class_labels.txt`` "<id> <class_id>",
    ``classes.txt`` "<class_id> <class_folder>", ``train_test_split.txt`` "<id> <0|1>", ids 1-based in
    the order of ``images``; files are ``images/<class_folder>/<name>_<k:04d>.png`` with ``k`` the
    running index of the image within its class.
    """
    root = Path(root)
    labels = np.asarray(labels, dtype=np.int64)
    if len(images) != len(labels):
        raise ValueError(f"write_cub_layout: {len(images)} images but {len(labels)} labels")
    if len(labels) and (labels.min() < 0 or labels.max() >= len(class_names)):
        raise ValueError(
            f"write_cub_layout: labels must lie in [0, {len(class_names)}), got range [{labels.min()}, {labels.max()}]"
        )
    train = {int(c) for c in train_classes}
    if any(c < 0 or c >= len(class_names) for c in train):
        raise ValueError(
            f"write_cub_layout: train_classes must be class indices in [0, {len(class_names)}), got {sorted(train)}"
        )
    folders = [class_folder_name(c, name) for c, name in enumerate(class_names)]
    if len(set(name.lower() for name in class_names)) != len(class_names):
        raise ValueError(
            "write_cub_layout: class names must be distinct (case-insensitively, for case-insensitive file systems)"
        )

    for folder in folders:
        (root / "images" / folder).mkdir(parents=True, exist_ok=True)
    running = np.zeros(len(class_names), dtype=np.int64)
    relative: list[str] = []
    for image, label in zip(images, labels):
        rel = f"{folders[label]}/{class_names[label]}_{running[label]:04d}.png"
        running[label] += 1
        data = image if isinstance(image, bytes) else encode_png(image)
        if not data.startswith(PNG_SIGNATURE):
            raise ValueError(f"write_cub_layout: image bytes for {rel} are not a PNG file")
        (root / "images" / rel).write_bytes(data)
        relative.append(rel)

    ids = range(1, len(relative) + 1)
    write_lines(root / "images.txt", (f"{i} {rel}" for i, rel in zip(ids, relative)))
    write_lines(root / "image_class_labels.txt", (f"{i} {label + 1}" for i, label in zip(ids, labels)))
    write_lines(root / "classes.txt", (f"{c + 1} {folder}" for c, folder in enumerate(folders)))
    write_lines(root / "train_test_split.txt", (f"{i} {int(int(label) in train)}" for i, label in zip(ids, labels)))
    return relative


def write_lines(path: Path, lines: Iterable[str]) -> None:
    """Write ``lines`` with ``\\n`` endings (UTF-8, no platform newline translation)."""
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        for line in lines:
            handle.write(line + "\n")


# ----------------------------------------------------------------------------------------------
# Generate once, atomically
# ----------------------------------------------------------------------------------------------
def expected_marker(generator: DatasetGenerator, seed: int) -> dict[str, Any]:
    """The marker fields that must match for an existing folder to be reused."""
    return {"generator": generator.name, "version": generator.version, "seed": int(seed), "config": generator.config()}


def read_marker(root: Path) -> dict[str, Any] | None:
    """The parsed ``GENERATED.json`` of ``root``, or ``None`` when there is none."""
    path = root / MARKER
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise DatasetLayoutError(f"{path} is not valid JSON ({error}); delete {root} to regenerate it") from error


def check_marker(root: Path, marker: dict[str, Any], generator: DatasetGenerator, seed: int) -> None:
    """Raise :class:`GenerationMismatchError` naming every field of ``marker`` that differs from what is asked."""
    wanted = expected_marker(generator, seed)
    # JSON round trip so tuples/lists and int/float keys compare the way they were stored.
    wanted = json.loads(json.dumps(wanted))
    differing = [
        f"{key}: folder has {marker.get(key)!r}, asked for {value!r}"
        for key, value in wanted.items()
        if marker.get(key) != value
    ]
    if differing:
        raise GenerationMismatchError(
            f"{root} was generated with different settings ({'; '.join(differing)}). "
            f"Refusing to mix datasets: delete {root} to regenerate it, or use another root."
        )


def partial_folders(root: Path) -> list[Path]:
    """Temporary sibling folders ``.<name>.partial-<pid>-<tag>`` left by generations of ``root``."""
    if not root.parent.is_dir():
        return []
    prefix = f".{root.name}{PARTIAL_TAG}"
    return sorted(p for p in root.parent.iterdir() if p.name.startswith(prefix) and p.is_dir())


def process_alive(pid: int) -> bool:
    """Whether a process with this id runs on this machine (``os.kill(pid, 0)``)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OverflowError:
        return False
    return True


def remove_stale_partials(root: Path) -> list[Path]:
    """Delete leftover temporary folders of ``root`` whose writing process is gone; return them.

    A folder whose process still runs (a concurrent generation) is left alone; one whose name has no
    parseable pid is treated as stale.
    """
    removed: list[Path] = []
    prefix = f".{root.name}{PARTIAL_TAG}"
    for folder in partial_folders(root):
        pid_text = folder.name[len(prefix) :].split("-", 1)[0]
        if pid_text.isdigit() and int(pid_text) != os.getpid() and process_alive(int(pid_text)):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def ensure_generated(root: str | Path, generator: DatasetGenerator, *, seed: int) -> Path:
    """Generate the dataset into ``root`` unless a complete, matching one is there; return ``root``.

    * ``root/GENERATED.json`` present and matching (generator, version, seed, config): nothing to do.
    * present but different: :class:`GenerationMismatchError` (never mix two datasets).
    * ``root`` exists, non-empty, without a marker: :class:`DatasetLayoutError` (not ours to overwrite).
    * otherwise: stale temporary siblings are deleted, the generator writes into a new sibling
      ``.<name>.partial-<pid>-<tag>``, the marker (name, version, seed, config, counts, seconds) is
      written last and the folder is renamed onto ``root`` (atomic on one file system). If another
      process completed ``root`` meanwhile, its marker is checked and our copy is dropped.
    """
    root = Path(root)
    marker = read_marker(root)
    if marker is not None:
        check_marker(root, marker, generator, seed)
        return root
    if root.exists():
        if root.is_dir() and not any(root.iterdir()):
            root.rmdir()
        else:
            raise DatasetLayoutError(
                f"{root} exists but has no {MARKER}: it is not a complete {generator.name} dataset "
                f"(an interrupted copy, or another folder). Delete it to let it be generated."
            )
    root.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(root)
    partial = root.parent / f".{root.name}{PARTIAL_TAG}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    partial.mkdir()
    try:
        start = time.perf_counter()
        counts = generator.generate(partial, seed=seed)
        record = expected_marker(generator, seed) | {"counts": counts, "seconds": round(time.perf_counter() - start, 3)}
        (partial / MARKER).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        try:
            os.rename(partial, root)
        except OSError:
            if read_marker(root) is None:
                raise
            shutil.rmtree(partial, ignore_errors=True)  # another process finished first
            check_marker(root, read_marker(root) or {}, generator, seed)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return root


def register_generated(
    name: str, generator: Callable[..., DatasetGenerator], *, flip_invariant: bool, summary: str
) -> Callable[..., ImageListDataset]:
    """Register the generated dataset ``name``: its builder makes ``generator(**options)`` (the generator's own
    defaults, e.g. ``num_classes``, unless a caller gives them), generates it into ``root`` on first use with
    ``seed`` (:func:`ensure_generated`) and reads ``split`` from the CUB layout (the first half of the class ids
    train, the rest test), cached, with ``flip_invariant`` augmentation. ``summary`` is the builder's docstring,
    the line ``dmlstudy list datasets`` prints."""

    def build(
        root: str | Path, split: str, transform: Callable | None = None, seed: int = 0, **options: Any
    ) -> ImageListDataset:
        ensure_generated(root, generator(**options), seed=seed)
        return read_cub(root, split, transform=transform, name=name, cache=True, flip_invariant=flip_invariant)

    build.__doc__ = summary
    return register_dataset(name)(build)
