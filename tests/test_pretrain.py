"""The pretrained regime: the shapes source set (and the fractals set it replaced), ``dmlstudy pretrain``, the committed weights and their card,
and the refusal of bad checkpoints by ``load_backbone_checkpoint``.

The full-size rebuild (``make pretrain-check``: minutes) is not run here. What makes it reproduce the committed
file is tested instead: a CI-sized pretraining run twice gives bit-identical weights.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch

from dmlstudy import cli
from dmlstudy.data import fractals, glyphs, shapes, synbirds
from dmlstudy.data.embedded import MARKER, GenerationMismatchError, ensure_generated
from dmlstudy.models.backbones import CheckpointError, build_backbone, load_backbone_checkpoint
from dmlstudy.models.cards import card_path, read_card, write_card
from dmlstudy.models.convnet import DMLConvNet
from dmlstudy.run.pretrain import PretrainConfig, pretrain

REPO = Path(__file__).resolve().parents[1]
COMMITTED = REPO / "weights" / "dml_convnet_shapes.safetensors"
TINY = {"num_classes": 6, "images_per_class": 4, "image_size": 32}


def folder_bytes(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.name != MARKER
    }


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ----------------------------------------------------------------------------------------------
# The source set
# ----------------------------------------------------------------------------------------------
def test_fractal_classes_are_distinct_contractive_attractors():
    """Every class is what the disjointness argument says it is: an IFS of contractive maps whose attractor
    fills its bounding box, no two classes alike (checked here from the parameters, independently)."""
    classes = fractals.class_parameters(40, seed=0)
    for maps in classes:
        assert len(maps) in (2, 3, 4) and maps.shape[1] == 6
        assert np.abs(maps).max() <= 1.0
        singular = np.linalg.svd(maps[:, :4].reshape(-1, 2, 2), compute_uv=False).max()
        assert singular <= fractals.MAX_SINGULAR + 1e-12
        points = fractals.chaos_game(maps, np.random.default_rng(1))
        assert np.isfinite(points).all()
        # Independent fill rate: the share of 32 × 32 bounding-box cells hit, at least the generator's bar halved
        # (another chain of points, so a little below the bar is possible).
        cells = np.floor((points - points.min(0)) / (np.ptp(points, 0) + 1e-12) * 31.999).astype(int)
        assert len({tuple(c) for c in cells}) / 32**2 >= fractals.MIN_FILL / 2
    for i, a in enumerate(classes):
        for b in classes[:i]:
            assert a.shape != b.shape or np.abs(a - b).max() >= fractals.MIN_CLASS_DISTANCE


def test_fractal_classes_are_disjoint_from_the_study_sets():
    """Disjoint by construction: the generator shares no code, renderer, font or palette with SynBirds or
    Glyphs (its only project import is the generated sets' common module: layout, random streams, registration),
    and no class name is shared."""
    tree = ast.parse(inspect.getsource(fractals))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)} | {
        alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    project = {name for name in imported if name and name.startswith("dmlstudy")}
    assert project == {"dmlstudy.data.embedded"}
    assert not {"PIL", "matplotlib", "fontTools"} & {name.split(".")[0] for name in imported if name}

    names = {
        fractals.class_name(c, maps).lower()
        for c, maps in enumerate(fractals.class_parameters(fractals.DEFAULT_CLASSES, seed=0))
    }
    assert len(names) == fractals.DEFAULT_CLASSES
    bird_names = {cls["name"].lower() for cls in synbirds.class_attributes(200, seed=0)}
    glyph_names = {glyphs.character_name(ch).lower() for ch in glyphs.glyph_classes()}
    assert len(bird_names) == 200 and len(glyph_names) == 128
    assert not names & bird_names and not names & glyph_names


def test_fractals_generation_is_deterministic_and_versioned(tmp_path):
    one = ensure_generated(tmp_path / "a", fractals.FractalsGenerator(**TINY, workers=1), seed=3)
    two = ensure_generated(tmp_path / "b", fractals.FractalsGenerator(**TINY, workers=2), seed=3)
    other = ensure_generated(tmp_path / "c", fractals.FractalsGenerator(**TINY, workers=1), seed=4)
    assert folder_bytes(one) == folder_bytes(two)
    assert folder_bytes(one) != folder_bytes(other)
    marker = json.loads((one / MARKER).read_text())
    assert (marker["generator"], marker["version"], marker["counts"]["images"]) == (
        "fractals",
        fractals.FractalsGenerator.version,
        24,
    )
    stored = json.loads((one / fractals.PARAMETERS_FILE).read_text())
    assert [len(r["maps"]) for r in stored] == [len(m) for m in fractals.class_parameters(6, seed=3)]

    marker["version"] = "0"  # a folder from another generator version is never reused
    (one / MARKER).write_text(json.dumps(marker))
    with pytest.raises(GenerationMismatchError, match="version"):
        ensure_generated(one, fractals.FractalsGenerator(**TINY, workers=1), seed=3)


def test_fractals_registered_and_readable(tmp_path):
    from dmlstudy.data import build_dataset

    train = build_dataset("fractals", tmp_path / "fractals", "train", **TINY)
    test = build_dataset("fractals", tmp_path / "fractals", "test", **TINY)
    assert (train.num_classes, test.num_classes, len(train), len(test)) == (3, 3, 12, 12)
    assert train.load_image(0).size == (32, 32)


def test_shape_classes_are_distinct_layouts_disjoint_from_the_study_sets():
    classes = shapes.class_parameters(shapes.DEFAULT_CLASSES, seed=0)
    for primitives in classes:
        assert len(primitives) in shapes.PRIMITIVE_COUNTS
        assert all(p["kind"] in shapes.KINDS and set(p) == set(shapes.FIELDS) for p in primitives)
    for i, a in enumerate(classes):  # independent check of the distance filter
        for b in classes[:i]:
            if [(p["kind"], p["filled"]) for p in a] == [(p["kind"], p["filled"]) for p in b]:
                gap = max(abs(p[k] - q[k]) for p, q in zip(a, b) for k in ("x", "y", "size", "aspect"))
                assert gap >= shapes.MIN_CLASS_DISTANCE
    tree = ast.parse(inspect.getsource(shapes))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    project = {name for name in imported if name and name.startswith("dmlstudy")}
    assert project == {"dmlstudy.data.embedded", "dmlstudy.data.fractals"}
    assert "ImageFont" not in inspect.getsource(shapes)  # no font: no glyph
    names = {shapes.class_name(c, p).lower() for c, p in enumerate(classes)}
    assert len(names) == shapes.DEFAULT_CLASSES
    bird_names = {cls["name"].lower() for cls in synbirds.class_attributes(200, seed=0)}
    glyph_names = {glyphs.character_name(ch).lower() for ch in glyphs.glyph_classes()}
    assert not names & bird_names and not names & glyph_names


def test_shapes_generation_is_deterministic_and_readable(tmp_path):
    from dmlstudy.data import build_dataset

    one = ensure_generated(tmp_path / "a", shapes.ShapesGenerator(**TINY, workers=1), seed=3)
    two = ensure_generated(tmp_path / "b", shapes.ShapesGenerator(**TINY, workers=2), seed=3)
    other = ensure_generated(tmp_path / "c", shapes.ShapesGenerator(**TINY, workers=1), seed=4)
    assert folder_bytes(one) == folder_bytes(two) and folder_bytes(one) != folder_bytes(other)
    train = build_dataset("shapes", tmp_path / "a", "train", seed=3, **TINY)
    assert (train.num_classes, len(train), train.load_image(0).size) == (3, 12, (32, 32))
    image = np.asarray(train.load_image(0))
    assert image.std() > 5  # a drawn image, not a flat canvas


# ----------------------------------------------------------------------------------------------
# dmlstudy pretrain
# ----------------------------------------------------------------------------------------------
def tiny_pretrain_options(tmp_path: Path, out: str) -> dict:
    return dict(
        num_classes=6,
        source_classes=0,
        images_per_class=8,
        holdout_per_class=2,
        image_size=32,
        epochs=2,
        batch_size=12,
        data_root=str(tmp_path / "shapes"),
        out=str(tmp_path / out),
    )


def test_pretrain_writes_loadable_weights_and_card_bit_identically(tmp_path):
    options = tiny_pretrain_options(tmp_path, "w1/tiny.safetensors")
    argv = ["pretrain"] + [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
    assert cli.main(argv) == 0
    first = Path(options["out"])
    second = pretrain(
        PretrainConfig(**(options | {"out": str(tmp_path / "w2" / "tiny.safetensors")})), log=lambda _: None
    )

    assert sha256(first) == sha256(second.weights) == second.sha256
    card = read_card(card_path(first))
    assert card["sha256"] == sha256(first)
    assert card["backbone"] == "dml_convnet" and card["source_dataset"] == "shapes"
    assert card["source_generator_version"] == shapes.ShapesGenerator.version
    assert (card["epochs"], card["image_size"], card["seed"], card["source_classes"]) == (2, 32, 0, 6)
    assert 0.0 <= card["source_accuracy"] <= 1.0 and card["torch_version"] == str(torch.__version__)
    assert card["command"].startswith("dmlstudy pretrain") and "--epochs 2" in card["command"]

    stored = safetensors.torch.load_file(str(first))
    assert not any(key.startswith("head") for key in stored)
    backbone = build_backbone("dml_convnet", checkpoint_path=first)
    for key, value in backbone.model.state_dict().items():
        assert torch.equal(value, stored[key]), key


# ----------------------------------------------------------------------------------------------
# Bad checkpoints: named errors, nothing half-loaded
# ----------------------------------------------------------------------------------------------
def fresh_model() -> torch.nn.Module:
    return build_backbone("dml_convnet").model


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {key: value.clone() for key, value in model.state_dict().items()}


def assert_unchanged(model: torch.nn.Module, before: dict[str, torch.Tensor]) -> None:
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), f"{key} was changed by a refused checkpoint"


@pytest.fixture
def good_checkpoint(tmp_path) -> Path:
    torch.manual_seed(7)
    path = tmp_path / "good.safetensors"
    safetensors.torch.save_file({k: v.contiguous() for k, v in fresh_model().state_dict().items()}, str(path))
    return path


def test_checkpoint_of_another_backbone_is_refused_untouched(tmp_path):
    wider = DMLConvNet(widths=(32, 64, 128, 256))  # same keys, other shapes: torch alone would load the first layers
    path = tmp_path / "wider.safetensors"
    safetensors.torch.save_file({k: v.contiguous() for k, v in wider.state_dict().items()}, str(path))
    model = fresh_model()
    before = snapshot(model)
    with pytest.raises(CheckpointError, match=r"wider\.safetensors.*dml_convnet.*features\.9\.weight"):
        load_backbone_checkpoint(model, path, name="dml_convnet")
    assert_unchanged(model, before)

    other = tmp_path / "resnet.pth"
    import timm

    torch.save(timm.create_model("resnet10t", num_classes=0).state_dict(), other)
    with pytest.raises(CheckpointError, match=r"resnet\.pth.*missing \['features"):
        load_backbone_checkpoint(model, other, name="dml_convnet")
    assert_unchanged(model, before)


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_truncated_checkpoint_is_refused_untouched(tmp_path, suffix):
    path = tmp_path / f"cut{suffix}"
    state = {k: v.contiguous() for k, v in fresh_model().state_dict().items()}
    safetensors.torch.save_file(state, str(path)) if suffix == ".safetensors" else torch.save(state, path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    model = fresh_model()
    before = snapshot(model)
    with pytest.raises(CheckpointError, match=rf"cut\{suffix} cannot be read as a state dict.*dml_convnet"):
        load_backbone_checkpoint(model, path, name="dml_convnet")
    assert_unchanged(model, before)


def test_card_hash_or_backbone_mismatch_is_refused_untouched(good_checkpoint):
    model = fresh_model()
    before = snapshot(model)
    wrong = "0" * 64
    write_card(good_checkpoint, {"backbone": "dml_convnet", "sha256": wrong, "command": "make pretrain"})
    with pytest.raises(
        CheckpointError,
        match=rf"good\.safetensors: SHA-256 {sha256(good_checkpoint)} does not match {wrong}.*good\.md.*make pretrain",
    ):
        load_backbone_checkpoint(model, good_checkpoint, name="dml_convnet")
    assert_unchanged(model, before)

    write_card(good_checkpoint, {"backbone": "resnet18", "sha256": sha256(good_checkpoint)})
    with pytest.raises(CheckpointError, match=r"good\.safetensors holds backbone 'resnet18'.*expected 'dml_convnet'"):
        load_backbone_checkpoint(model, good_checkpoint, name="dml_convnet")
    assert_unchanged(model, before)

    card_path(good_checkpoint).write_text("no front matter\n")
    with pytest.raises(CheckpointError, match=r"good\.md cannot be read"):
        load_backbone_checkpoint(model, good_checkpoint, name="dml_convnet")
    assert_unchanged(model, before)

    write_card(good_checkpoint, {"backbone": "dml_convnet", "sha256": sha256(good_checkpoint)})
    load_backbone_checkpoint(model, good_checkpoint, name="dml_convnet")
    stored = safetensors.torch.load_file(str(good_checkpoint))
    assert all(torch.equal(value, stored[key]) for key, value in model.state_dict().items())


# ----------------------------------------------------------------------------------------------
# The committed weights
# ----------------------------------------------------------------------------------------------
def test_committed_weights_match_their_card_and_load():
    card = read_card(card_path(COMMITTED))
    assert card["sha256"] == sha256(COMMITTED)
    assert card["file"] == COMMITTED.name and card["backbone"] == "dml_convnet"
    assert card["source_generator_version"] == shapes.ShapesGenerator.version, "generator changed: run make pretrain"
    assert PretrainConfig(**card["config"]).command() == card["command"]
    backbone = build_backbone("dml_convnet", checkpoint_path=COMMITTED)
    assert not torch.equal(backbone.model.features[0].weight, fresh_model().features[0].weight)


def test_pretrain_config_names_bad_settings():
    with pytest.raises(ValueError, match=r"source_classes=500"):
        PretrainConfig(source_classes=500)
    with pytest.raises(ValueError, match=r"out='w\.pt' \(must end in \.safetensors\)"):
        PretrainConfig(out="w.pt")
    with pytest.raises(ValueError, match=r"device='gpu' \(must be cpu, cuda, cuda:<i> or auto\)"):
        PretrainConfig(device="gpu")


def test_pretraining_on_a_missing_gpu_fails_before_reading_the_source(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = PretrainConfig(device="cuda", data_root=str(tmp_path / "absent"), out=str(tmp_path / "w.safetensors"))
    with pytest.raises(RuntimeError, match="device 'cuda' requested but CUDA is not available"):
        pretrain(config, log=lambda line: None)
    assert not (tmp_path / "absent").exists() and not (tmp_path / "w.safetensors").exists()
