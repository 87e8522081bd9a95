"""Benchmark readers against tiny folders written in the official layouts (tests/fixtures_layouts.py).

The ground truth is what the fixture writer wrote (its records), never the reader's own parsing.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from dmlstudy.data import cars, cub, inshop, sop
from dmlstudy.data.base import CorruptImageError, DatasetLayoutError, build_dataset
from tests.fixtures_layouts import Record, decoded_class, write_cars, write_cub, write_inshop, write_sop

CUB_COUNTS = [3, 2, 4, 1, 2, 3]  # classes 1–3 train, 4–6 test
CARS_COUNTS = [2, 3, 1, 2, 2, 3, 1, 2]  # classes 1–4 train, 5–8 test
SOP_COUNTS = [2, 1, 3, 2, 4, 1]  # classes 1–3 train, 4–6 test
INSHOP_ITEMS = [
    ("id_00000001", ["train", "train", "train"]),
    ("id_00000002", ["train", "train"]),
    ("id_00000003", ["query", "query", "gallery", "gallery", "gallery", "query"]),
    ("id_00000004", ["gallery", "query", "gallery"]),
    ("id_00000005", ["gallery", "gallery"]),  # gallery-only item
    ("id_00000006", ["train"]),
    ("id_00000008", ["query", "gallery"]),
]


def expected_split(records: list[Record], split: str) -> tuple[list[Path], list[int], list[str]]:
    """Paths in written order, 0-based labels by sorted original id, and names — computed from the records."""
    chosen = [r for r in records if r.split == split]
    ids = sorted({r.class_id for r in chosen})
    names = {r.class_id: r.class_name for r in chosen}
    return [r.path for r in chosen], [ids.index(r.class_id) for r in chosen], [names[i] for i in ids]


def assert_matches(dataset, records: list[Record], split: str) -> None:
    paths, labels, names = expected_split(records, split)
    assert dataset.paths == paths
    assert dataset.labels.tolist() == labels
    assert dataset.class_names == names
    assert dataset.labels.dtype == np.int64


def assert_decodes_to_its_class(dataset, records: list[Record]) -> None:
    """Every image file's colour encodes the class the writer put it in; its name must agree with its label."""
    class_of_path = {r.path: r.class_id for r in records}
    name_of_class = {r.class_id: r.class_name for r in records}
    for i in range(len(dataset)):
        image, label = dataset[i]
        assert image.mode == "RGB"
        original = class_of_path[dataset.paths[i]]
        assert dataset.class_names[label] == name_of_class[original]
        if isinstance(original, int):
            assert decoded_class(image) == original % 12


def assert_layout_error(excinfo, *fragments: str) -> None:
    message = str(excinfo.value)
    assert "Expected layout" in message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in message:\n{message}"


# ---------------------------------------------------------------------------------------------- CUB
@pytest.fixture
def cub_tree(tmp_path):
    base, records = write_cub(tmp_path, images_per_class=CUB_COUNTS)
    return tmp_path, base, records


@pytest.mark.parametrize("use_parent", [False, True])
def test_cub_splits_labels_names(cub_tree, use_parent):
    parent, base, records = cub_tree
    root = parent if use_parent else base
    train, test = cub.read_cub(root, "train"), cub.read_cub(root, "test")
    assert (len(train), len(test)) == (sum(CUB_COUNTS[:3]), sum(CUB_COUNTS[3:]))
    assert_matches(train, records, "train")
    assert_matches(test, records, "test")
    # the first image of class 4 (the first test class) gets test label 0 and its own name
    class_4_image = next(r.path for r in records if r.class_id == 4)
    assert test.labels[test.paths.index(class_4_image)] == 0 and test.class_names[0] == "004.Bird_Species_4"
    assert not set(train.class_names) & set(test.class_names)
    assert set(train.paths) | set(test.paths) == {r.path for r in records}
    assert not set(train.paths) & set(test.paths)
    assert_decodes_to_its_class(train, records)
    assert_decodes_to_its_class(test, records)


def test_cub_ignores_stray_apple_double_files(cub_tree):
    _, base, records = cub_tree
    strays = list((base / "images").rglob("._*"))
    assert len(strays) == len(records) + len(CUB_COUNTS)  # the fixture really has them
    for split in ("train", "test"):
        dataset = cub.read_cub(base, split)
        assert not any(p.name.startswith("._") for p in dataset.paths)


def test_cub_registered_builder_and_read_cub_options(cub_tree):
    _, base, _ = cub_tree
    built = build_dataset("cub200", base, "test")
    direct = cub.read_cub(base, "test")
    assert built.paths == direct.paths and built.labels.tolist() == direct.labels.tolist()
    assert built.name == "cub200/test"
    custom = cub.read_cub(base, "train", name="glyphs", cache=True, flip_invariant=False, transform=np.asarray)
    assert custom.name == "glyphs/train" and custom.flip_invariant is False
    assert custom.load_image(0) is custom.load_image(0)  # cached object
    assert custom[0][0].shape == (8, 10, 3)  # transform applied to the RGB image


@pytest.mark.parametrize(
    "piece", ["images.txt", "image_class_labels.txt", "classes.txt", "train_test_split.txt", "images"]
)
def test_cub_missing_piece_is_named(cub_tree, piece):
    parent, base, _ = cub_tree
    target = base / piece
    if target.is_dir():
        shutil.rmtree(target)
    else:
        target.unlink()
    for root in (base, parent):
        with pytest.raises(DatasetLayoutError) as excinfo:
            cub.read_cub(root, "train")
        assert_layout_error(excinfo, f"missing {'folder' if piece == 'images' else 'file'} {piece}", "└── images/")


def test_cub_missing_images_counted_with_first_few(cub_tree):
    _, base, records = cub_tree
    test_records = [r for r in records if r.split == "test"]
    for r in test_records[-2:]:
        r.path.unlink()
    cub.read_cub(base, "train")  # the train split is complete
    with pytest.raises(DatasetLayoutError) as excinfo:
        cub.read_cub(base, "test")
    assert_layout_error(excinfo, f"2 of {len(test_records)} listed images are missing", test_records[-2].path.name)


def test_cub_wrong_root_and_unknown_split(tmp_path):
    with pytest.raises(DatasetLayoutError) as excinfo:
        cub.read_cub(tmp_path, "train")
    assert_layout_error(excinfo, "images.txt", "classes.txt", "folder images")
    with pytest.raises(DatasetLayoutError, match="does not exist"):
        cub.read_cub(tmp_path / "nowhere", "train")
    with pytest.raises(ValueError, match="valid splits: train, test"):
        cub.read_cub(tmp_path, "val")


def test_cub_inconsistent_tables(cub_tree):
    _, base, _ = cub_tree
    (base / "image_class_labels.txt").write_text("1 1\n")
    with pytest.raises(DatasetLayoutError, match="no line in image_class_labels.txt"):
        cub.read_cub(base, "train")


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_image_raises_naming_file(cub_tree, damage):
    _, base, records = cub_tree
    victim = records[1].path
    data = victim.read_bytes()
    victim.write_bytes(b"this is not a jpeg" if damage == "garbage" else data[: len(data) // 2])
    dataset = cub.read_cub(base, "train")
    index = dataset.paths.index(victim)
    dataset[0]  # an intact image still loads
    with pytest.raises(CorruptImageError, match=victim.name):
        dataset[index]


# --------------------------------------------------------------------------------------------- Cars
@pytest.fixture
def cars_tree(tmp_path):
    return write_cars(tmp_path, images_per_class=CARS_COUNTS)


def test_cars_fixture_has_the_official_mat_structure(cars_tree):
    from scipy.io import loadmat

    root, records = cars_tree
    mat = loadmat(root / "cars_annos.mat")
    annotations = mat["annotations"]
    assert annotations.shape == (1, len(records))
    assert set(annotations.dtype.names) == {
        "relative_im_path",
        "bbox_x1",
        "bbox_y1",
        "bbox_x2",
        "bbox_y2",
        "class",
        "test",
    }
    assert annotations["relative_im_path"][0, 0].tolist() == ["car_ims/000001.jpg"]
    assert annotations["class"][0, 0].shape == (1, 1)
    assert mat["class_names"].shape == (1, len(CARS_COUNTS))


def test_cars_splits_labels_names(cars_tree):
    root, records = cars_tree
    train, test = cars.read_cars(root, "train"), cars.read_cars(root, "test")
    assert (len(train), len(test)) == (sum(CARS_COUNTS[:4]), sum(CARS_COUNTS[4:]))
    assert_matches(train, records, "train")
    assert_matches(test, records, "test")
    assert test.class_names[0] == "Make5 Model 5 2005"
    class_5_image = next(r.path for r in records if r.class_id == 5)
    assert test.labels[test.paths.index(class_5_image)] == 0
    assert not set(train.paths) & set(test.paths)
    assert_decodes_to_its_class(train, records)
    assert_decodes_to_its_class(test, records)
    assert build_dataset("cars196", root, "test").labels.tolist() == test.labels.tolist()


def test_cars_scalar_unwraps_loadmat_shapes():
    assert cars._scalar(np.array([[7]], dtype=np.uint8)) == 7
    assert cars._scalar(np.array(["car_ims/000001.jpg"])) == "car_ims/000001.jpg"
    wrapped = np.empty((1, 1), dtype=object)
    wrapped[0, 0] = np.array(["Audi R8"])
    assert cars._scalar(wrapped) == "Audi R8"
    assert cars._scalar(np.uint16(3)) == 3 and cars._scalar("x") == "x"
    with pytest.raises(ValueError, match="scalar"):
        cars._scalar(np.zeros((2, 2)))


def test_cars_missing_pieces_and_bad_class(cars_tree, tmp_path_factory):
    root, _ = cars_tree
    empty = tmp_path_factory.mktemp("empty")
    with pytest.raises(DatasetLayoutError) as excinfo:
        cars.read_cars(empty, "train")
    assert_layout_error(excinfo, "file cars_annos.mat", "folder car_ims/")
    (root / "car_ims" / "000003.jpg").unlink()
    with pytest.raises(DatasetLayoutError, match="listed images are missing, first: car_ims/000003.jpg"):
        for split in ("train", "test"):
            cars.read_cars(root, split)
    with pytest.raises(ValueError, match="valid splits: train, test"):
        cars.read_cars(root, "query")


def test_cars_class_id_outside_names(tmp_path):
    from scipy.io import loadmat, savemat

    root, _ = write_cars(tmp_path, images_per_class=[1, 1])
    mat = loadmat(root / "cars_annos.mat")
    mat["annotations"]["class"][0, 0] = np.array([[9]], dtype=np.uint8)
    savemat(root / "cars_annos.mat", {"annotations": mat["annotations"], "class_names": mat["class_names"]})
    with pytest.raises(DatasetLayoutError, match=r"class ids \[9\] outside 1..2"):
        cars.read_cars(root, "train")


# ---------------------------------------------------------------------------------------------- SOP
@pytest.mark.parametrize("use_parent", [False, True])
def test_sop_splits_labels_names(tmp_path, use_parent):
    base, records = write_sop(tmp_path, images_per_class=SOP_COUNTS)
    root = tmp_path if use_parent else base
    train, test = sop.read_sop(root, "train"), sop.read_sop(root, "test")
    assert (len(train), len(test)) == (sum(SOP_COUNTS[:3]), sum(SOP_COUNTS[3:]))
    assert_matches(train, records, "train")
    assert_matches(test, records, "test")
    assert test.class_names[0] == "4" and test.labels[0] == 0  # class 4 is the first test row
    assert not set(train.class_names) & set(test.class_names)
    assert test.super_labels.tolist() == [(r.class_id - 1) % 3 + 1 for r in records if r.split == "test"]
    assert_decodes_to_its_class(train, records)
    assert_decodes_to_its_class(test, records)
    assert build_dataset("sop", root, "train").paths == train.paths


def test_sop_missing_pieces(tmp_path):
    base, records = write_sop(tmp_path, images_per_class=SOP_COUNTS)
    (base / "Ebay_test.txt").unlink()
    assert len(sop.read_sop(tmp_path, "train")) == sum(SOP_COUNTS[:3])
    with pytest.raises(DatasetLayoutError) as excinfo:
        sop.read_sop(tmp_path, "test")
    assert_layout_error(excinfo, "missing file Ebay_test.txt")
    records[0].path.unlink()
    with pytest.raises(DatasetLayoutError, match="1 of 6 listed images are missing, first: bicycle_final/"):
        sop.read_sop(base, "train")
    with pytest.raises(ValueError, match="valid splits: train, test"):
        sop.read_sop(base, "gallery")


# ------------------------------------------------------------------------------------------ In-Shop
@pytest.mark.parametrize("official_tree", [False, True])
def test_inshop_splits_and_shared_query_gallery_labels(tmp_path, official_tree):
    root, records = write_inshop(tmp_path, items=INSHOP_ITEMS, official_tree=official_tree)
    data = {s: inshop.read_inshop(root, s) for s in ("train", "query", "gallery")}
    for split, dataset in data.items():
        chosen = [r for r in records if r.split == split]
        assert dataset.paths == [r.path for r in chosen]
        assert_decodes_to_its_class(dataset, records)
    assert [len(data[s]) for s in ("train", "query", "gallery")] == [6, 5, 8]
    assert data["train"].class_names == ["id_00000001", "id_00000002", "id_00000006"]
    assert data["train"].labels.tolist() == [0, 0, 0, 1, 1, 2]
    assert (
        data["query"].class_names
        == data["gallery"].class_names
        == ["id_00000003", "id_00000004", "id_00000005", "id_00000008"]
    )
    item = {r.path: r.class_id for r in records}
    query, gallery = data["query"], data["gallery"]
    for qi, qp in enumerate(query.paths):  # brute force over all query–gallery pairs
        for gi, gp in enumerate(gallery.paths):
            assert (query.labels[qi] == gallery.labels[gi]) == (item[qp] == item[gp])
    assert not set(data["train"].class_names) & set(query.class_names)


def test_inshop_layout_errors(tmp_path):
    root, records = write_inshop(tmp_path, items=INSHOP_ITEMS)
    partition = root / "list_eval_partition.txt"
    lines = partition.read_bytes().decode().splitlines()
    partition.write_text("\n".join([lines[0], *lines[1:-1]]) + "\n")  # count line now one too many
    with pytest.raises(DatasetLayoutError, match="announces 19 images on line 1 but lists 18"):
        inshop.read_inshop(root, "train")
    partition.write_text("\n".join(lines[1:]) + "\n")  # count line dropped
    with pytest.raises(DatasetLayoutError, match="line 1 should be the number of images"):
        inshop.read_inshop(root, "train")
    partition.unlink()
    with pytest.raises(DatasetLayoutError) as excinfo:
        inshop.read_inshop(root, "query")
    assert_layout_error(excinfo, "missing file list_eval_partition.txt")
    shutil.rmtree(root / "img")
    with pytest.raises(DatasetLayoutError, match="folder img/"):
        inshop.read_inshop(root, "query")
    with pytest.raises(ValueError, match="valid splits: train, query, gallery"):
        inshop.read_inshop(root, "test")


def test_inshop_missing_images(tmp_path):
    root, records = write_inshop(tmp_path, items=INSHOP_ITEMS)
    gallery = [r for r in records if r.split == "gallery"]
    for r in gallery[:3]:
        r.path.unlink()
    assert len(inshop.read_inshop(root, "query")) == 5
    with pytest.raises(DatasetLayoutError, match=f"3 of {len(gallery)} listed images are missing, first: img/"):
        inshop.read_inshop(root, "gallery")


# ------------------------------------------------------------------------ real data (optional)
REAL_DATA = os.environ.get("DMLSTUDY_REAL_DATA")
REAL_COUNTS = {  # (dataset, split): (images, classes) of the published protocols
    ("cub200", "train"): (5864, 100),
    ("cub200", "test"): (5924, 100),
    ("cars196", "train"): (8054, 98),
    ("cars196", "test"): (8131, 98),
    ("sop", "train"): (59551, 11318),
    ("sop", "test"): (60502, 11316),
    ("inshop", "train"): (25882, 3997),
    ("inshop", "query"): (14218, 3985),
    ("inshop", "gallery"): (12612, 3985),
}


@pytest.mark.skipif(not REAL_DATA, reason="set DMLSTUDY_REAL_DATA to a folder with cub200/, cars196/, sop/, inshop/")
@pytest.mark.parametrize("key", list(REAL_COUNTS))
def test_real_dataset_sizes(key):
    name, split = key
    root = Path(REAL_DATA) / name
    if not root.exists():
        pytest.skip(f"{root} not present")
    dataset = build_dataset(name, root, split)
    assert (len(dataset), dataset.num_classes) == REAL_COUNTS[key]


def test_registered_evaluation_protocols():
    from dmlstudy.data.base import evaluation_protocol

    for name in ("cub200", "cars196"):
        protocol = evaluation_protocol(name)
        assert (protocol.query_split, protocol.gallery_split, protocol.recall_ks) == ("test", None, (1, 2, 4, 8))
    assert evaluation_protocol("sop").recall_ks == (1, 10, 100, 1000)
    protocol = evaluation_protocol("inshop")
    assert (protocol.query_split, protocol.gallery_split, protocol.recall_ks) == (
        "query",
        "gallery",
        (1, 10, 20, 30, 40, 50),
    )
