"""Training on cached stem activations (``stem_views``): the cached views are the stem's output of the very
views the tensor pipeline draws, every run reads them from one cache, and a run trains and is read back."""

import numpy as np
import pytest
import torch

from dmlstudy.data.batch_transforms import augment_batch, evaluation_crop, normalize_batch
from dmlstudy.data.folds import split_by_classes
from dmlstudy.data.tensor_cache import TensorImageSplit
from dmlstudy.models import trunk_cache
from dmlstudy.models.trunk_cache import (
    STEM_VIEW_SEED,
    CachedViewEvaluation,
    CachedViewTrain,
    StemActivationSplit,
    StemCachedBackbone,
    stem_activation_split,
)
from dmlstudy.records import seed_everything
from dmlstudy.run import identity
from dmlstudy.run.data import load_datasets
from dmlstudy.run.model import stem_backbone
from dmlstudy.run.regimes import REGIMES, regime_overrides
from dmlstudy.run.train import TrainConfig, run

SIZE = 32


class _Source:
    def __init__(self, count: int, paths) -> None:
        self.labels = np.repeat(np.arange(count // 3), 3)
        self.paths = list(paths)
        self.class_names = [f"class {c}" for c in range(count // 3)]
        self.name, self.flip_invariant = "toy", False


@pytest.fixture(scope="module")
def stem():
    torch.manual_seed(0)
    return StemCachedBackbone(pretrained=False).eval()


@pytest.fixture
def split(tmp_path):
    from PIL import Image

    generator = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (9, 3, 40, 40), dtype=torch.uint8, generator=generator)
    paths = []
    for index, image in enumerate(images):
        path = tmp_path / f"{index}.png"
        Image.fromarray(image.permute(1, 2, 0).numpy()).save(path)
        paths.append(path)
    return TensorImageSplit(_Source(9, paths), images)


def test_cached_views_are_the_stem_output_of_the_pipelines_views(split, stem, tmp_path):
    cached = stem_activation_split(
        split, stem, folder=tmp_path / "cache", dataset_digest="toy", image_size=SIZE, training_views=2, chunk=4
    )
    assert isinstance(cached, StemActivationSplit) and cached.images.shape[:2] == (9, 3)
    for view in range(2):
        expected = stem.stem(
            augment_batch(split.images, list(range(9)), seed=STEM_VIEW_SEED, epoch=view, image_size=SIZE, flip=False)
        )
        torch.testing.assert_close(cached.images[:, view].float(), expected, atol=2e-2, rtol=1e-2)
    test_view = stem.stem(normalize_batch(evaluation_crop(split.images, SIZE)))
    torch.testing.assert_close(cached.images[:, -1].float(), test_view, atol=2e-2, rtol=1e-2)
    assert not torch.equal(cached.images[:, 0], cached.images[:, 1])  # two different crops


def test_a_second_reader_reads_the_cache_without_computing(split, stem, tmp_path, monkeypatch):
    first = stem_activation_split(split, stem, folder=tmp_path, dataset_digest="toy", image_size=SIZE, training_views=2)

    def refuse(*args, **kwargs):
        raise AssertionError("the stem ran again")

    monkeypatch.setattr(trunk_cache, "stem_activations", refuse)
    again = stem_activation_split(split, stem, folder=tmp_path, dataset_digest="toy", image_size=SIZE, training_views=2)
    assert torch.equal(first.images, again.images)
    with pytest.raises(AssertionError, match="ran again"):  # another image size is another key
        stem_activation_split(split, stem, folder=tmp_path, dataset_digest="toy", image_size=24, training_views=2)


def test_epochs_cycle_through_the_views_and_parts_keep_their_type(split, stem, tmp_path):
    cached = stem_activation_split(
        split, stem, folder=tmp_path, dataset_digest="toy", image_size=SIZE, training_views=2
    )
    part = split_by_classes(cached, [2, 0], role="part")
    assert isinstance(part, StemActivationSplit) and list(part.labels) == [1, 1, 1, 0, 0, 0]
    train = CachedViewTrain(part)
    for epoch, view in [(0, 0), (1, 1), (2, 0), (5, 1)]:
        train.set_epoch(epoch)
        activations, labels = train.batch([0, 4], "cpu")
        assert activations.dtype == torch.float32
        torch.testing.assert_close(activations, part.images[[0, 4], view].float())
        assert labels.tolist() == [1, 0]
    evaluation = CachedViewEvaluation(part)
    torch.testing.assert_close(evaluation.batch(slice(0, 6), "cpu"), part.images[:, -1].float())
    picture = np.asarray(part.load_image(3))  # the image file: row 3 of the part is row 6 of the split
    assert picture.shape == (40, 40, 3) and np.array_equal(picture, split.images[6].permute(1, 2, 0).numpy())


def test_stem_views_need_the_tensor_pipeline_and_leave_other_runs_names_alone():
    with pytest.raises(ValueError, match="stem_views"):
        TrainConfig(stem_views=2, input_pipeline="files")
    with pytest.raises(ValueError, match="stem_views"):
        TrainConfig(stem_views=-1)
    plain = TrainConfig().to_dict()
    assert identity.identity_hash(plain) == identity.identity_hash(
        {k: v for k, v in plain.items() if k != "stem_views"}
    )
    assert identity.identity_hash({**plain, "stem_views": 4}) != identity.identity_hash(plain)


def test_the_imagenet_regime_trains_the_last_stage_on_cached_views():
    overrides = regime_overrides("imagenet", backbone="dml_efficientnet_lite0", epochs=10)
    assert overrides["stem_views"] >= 1 and overrides["pretrained"] and overrides["freeze_bn"]
    assert REGIMES["imagenet"].backbone == "dml_efficientnet_lite0"
    with pytest.raises(ValueError, match="dml_efficientnet_lite0"):
        regime_overrides("imagenet", backbone="dml_convnet")


def test_a_run_on_cached_views_trains_only_the_tail_and_reads_back(tiny_config):
    config = tiny_config(
        backbone="dml_efficientnet_lite0", stem_views=2, freeze_bn=True, validation_folds=4, patience=1, epochs=3
    )
    datasets = load_datasets(config)
    assert isinstance(datasets["train"], CachedViewTrain) and isinstance(datasets["query"], CachedViewEvaluation)
    assert datasets["train"].split.training_views == 2 and datasets["validation"].crops.shape[1] == 192
    result = run(config)
    assert 0.0 <= result.metrics["R@1"] <= 1.0
    state = torch.load(config.run_dir / "checkpoint.pt", map_location="cpu", weights_only=False)["method"]
    seed_everything(config.seed)  # the backbone is built right after seeding: its start, again
    start = {f"backbone.{key}": value for key, value in stem_backbone(config).state_dict().items()}
    stem = [key for key in start if key.startswith(("backbone.model.conv_stem", "backbone.model.blocks.5."))]
    tail = [key for key in start if key.startswith("backbone.model.blocks.6.") and key.endswith("weight")]
    assert stem and tail
    assert all(torch.equal(state[key], start[key]) for key in stem)  # frozen
    assert any(not torch.equal(state[key], start[key]) for key in tail)  # trained
    again = run(config)  # a complete run is read back, not trained again
    assert again.metrics == result.metrics


def test_without_conv_head_the_last_blocks_output_is_the_feature_map(stem):
    torch.manual_seed(0)
    short = StemCachedBackbone(pretrained=False, conv_head=False)
    activations = torch.randn(2, 192, 2, 2)
    short.eval()
    features = short(activations)
    assert short.num_features == 320 and features.shape == (2, 320, 2, 2)
    torch.testing.assert_close(features, short.model.blocks[6:](activations))
    assert not any(p.requires_grad for p in [*short.model.conv_head.parameters(), *short.model.bn2.parameters()])
    with pytest.raises(ValueError, match="conv_head"):
        TrainConfig(conv_head=False)
    assert identity.identity_hash({**TrainConfig().to_dict(), "conv_head": True}) == identity.identity_hash(
        {k: v for k, v in TrainConfig().to_dict().items() if k != "conv_head"}
    )


def test_images_go_through_the_frozen_stem_first(stem):
    images = torch.randn(2, 3, SIZE, SIZE)
    torch.testing.assert_close(stem(images), stem(stem.stem(images)))


def test_figures_of_emoji_images_carry_their_attribution(split):
    from dmlstudy.data.base import IMAGE_CREDITS, image_credit

    assert "CC BY-SA 4.0 (https://creativecommons.org/licenses/by-sa/4.0/): OpenMoji" in IMAGE_CREDITS["emoji"]
    split.name = "emoji/test (first 8 classes)"
    assert (
        image_credit(CachedViewEvaluation(StemActivationSplit(split, torch.zeros(9, 1, 2, 1, 1))))
        == IMAGE_CREDITS["emoji"]
    )
    split.name = "synbirds/test"
    assert image_credit(split) == ""
