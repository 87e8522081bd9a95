"""Transforms (against a hand-built PIL/numpy pipeline and closed forms) and the P × M batch sampler."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from PIL import Image

from dmlstudy.data.sampler import ClassBalancedBatchSampler
from dmlstudy.data.transforms import IMAGENET_MEAN, IMAGENET_STD, build_transforms, denormalize

MEAN = np.array(IMAGENET_MEAN).reshape(3, 1, 1)
STD = np.array(IMAGENET_STD).reshape(3, 1, 1)


def noise_image(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8))


def gradient_image(width: int = 128, height: int = 96) -> Image.Image:
    """Brightness strictly increasing from left to right: any crop keeps left < right unless flipped."""
    row = np.linspace(0, 255, width).round().astype(np.uint8)
    return Image.fromarray(np.repeat(np.tile(row, (height, 1))[..., None], 3, axis=2))


# ----------------------------------------------------------------------------------------- transforms
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("size", [(37, 53), (300, 200)])
def test_output_shape_and_dtype(train, size):
    out = build_transforms(64, train=train)(noise_image(*size))
    assert out.shape == (3, 64, 64) and out.dtype == torch.float32


@pytest.mark.parametrize("train", [True, False])
def test_constant_image_maps_to_normalised_value(train):
    rgb = (200, 100, 50)
    out = build_transforms(32, train=train)(Image.new("RGB", (70, 50), rgb))
    expected = (np.array(rgb).reshape(3, 1, 1) / 255 - MEAN) / STD
    np.testing.assert_allclose(out.numpy(), np.broadcast_to(expected, (3, 32, 32)), atol=1e-5)
    np.testing.assert_allclose(
        denormalize(out).numpy(), np.broadcast_to(np.array(rgb).reshape(3, 1, 1) / 255, (3, 32, 32)), atol=1e-5
    )


def test_test_transform_equals_resize_then_center_crop_by_hand():
    image = noise_image(150, 100, seed=3)
    out = build_transforms(56, train=False)(image)  # shorter side → round(56 · 8/7) = 64
    resized = image.resize((96, 64), Image.Resampling.BILINEAR)  # 150 × 100 → 96 × 64
    crop = np.asarray(resized, dtype=np.float64)[4:60, 20:76].transpose(2, 0, 1) / 255  # centre 56 × 56
    np.testing.assert_allclose(out.numpy(), (crop - MEAN) / STD, atol=1e-5)


def test_test_transform_is_deterministic():
    transform = build_transforms(48, train=False)
    image = noise_image(90, 70, seed=1)
    torch.manual_seed(0)
    first = transform(image)
    torch.manual_seed(1)
    assert torch.equal(first, transform(image))


def test_train_transform_is_random():
    torch.manual_seed(0)
    transform = build_transforms(48, train=True)
    image = noise_image(90, 70, seed=2)
    assert not torch.equal(transform(image), transform(image))


def count_flipped(transform, draws: int) -> int:
    image = gradient_image()
    flipped = 0
    for _ in range(draws):
        out = transform(image)[0]  # H × W
        left, right = out[:, 0].mean().item(), out[:, -1].mean().item()
        assert left != right
        flipped += left > right
    return flipped


def test_hflip_false_never_flips_and_true_does():
    torch.manual_seed(0)
    assert count_flipped(build_transforms(32, train=True, hflip=False), 60) == 0
    flipped = count_flipped(build_transforms(32, train=True, hflip=True), 60)
    assert 12 <= flipped <= 48  # Binomial(60, 1/2): outside this range has probability < 1e-5


def test_full_crop_scale_keeps_whole_square_image():
    """crop_scale=(1, 1) on a square image can only crop the whole image: train == plain resize."""
    image = noise_image(64, 64, seed=4)
    out = build_transforms(32, train=True, hflip=False, crop_scale=(1.0, 1.0))(image)
    resized = np.asarray(image.resize((32, 32), Image.Resampling.BILINEAR), dtype=np.float64).transpose(2, 0, 1) / 255
    np.testing.assert_allclose(out.numpy(), (resized - MEAN) / STD, atol=1e-5)


def test_denormalize_batch_clamp_and_errors():
    batch = torch.randn(2, 3, 5, 5) * 10
    out = denormalize(batch)
    assert out.shape == batch.shape and out.min() >= 0 and out.max() <= 1
    inner = torch.zeros(3, 2, 2)
    np.testing.assert_allclose(denormalize(inner).numpy(), np.broadcast_to(MEAN, (3, 2, 2)), atol=1e-7)
    with pytest.raises(ValueError, match=r"\(\.\.\., 3, H, W\)"):
        denormalize(torch.zeros(4, 5, 5))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(image_size=0), "image_size"),
        (dict(image_size=32, resize_ratio=0.9), "resize_ratio"),
        (dict(image_size=32, crop_scale=(0.5, 0.2)), "crop_scale"),
        (dict(image_size=32, crop_scale=(0.0, 1.0)), "crop_scale"),
    ],
)
def test_transform_argument_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_transforms(train=True, **kwargs)


# -------------------------------------------------------------------------------------------- sampler
SIZES = [8, 5, 3, 12, 6, 2, 7, 9, 4, 10]  # two classes smaller than M = 4


def make_labels(sizes=SIZES, seed: int = 0) -> np.ndarray:
    """Shuffled labels with arbitrary (non-contiguous) class values ``7·c + 3``."""
    labels = np.repeat(7 * np.arange(len(sizes)) + 3, sizes)
    return np.random.default_rng(seed).permutation(labels)


def batches(sampler: ClassBalancedBatchSampler) -> list[list[int]]:
    return [list(b) for b in sampler]


def test_batch_composition():
    labels = make_labels()
    sampler = ClassBalancedBatchSampler(labels, classes_per_batch=4, samples_per_class=4, num_batches=200)
    counts = Counter(labels.tolist())
    for batch in batches(sampler):
        assert len(batch) == 16 and all(0 <= i < len(labels) for i in batch)
        batch_labels = labels[batch]
        assert sorted(Counter(batch_labels.tolist()).values()) == [4, 4, 4, 4]
        for block in np.split(np.array(batch), 4):  # laid out class by class
            assert len(set(labels[block].tolist())) == 1
            if counts[labels[block[0]]] >= 4:
                assert len(set(block.tolist())) == 4  # without replacement


def test_classes_and_members_drawn_uniformly():
    labels = make_labels()
    sampler = ClassBalancedBatchSampler(labels, classes_per_batch=4, samples_per_class=4, num_batches=3000)
    class_hits, index_hits = Counter(), Counter()
    for batch in sampler:
        class_hits.update(set(labels[batch].tolist()))
        index_hits.update(batch)
    for c in set(labels.tolist()):
        assert abs(class_hits[c] / 3000 - 0.4) < 0.04  # P / C = 4 / 10; 4 s.d. ≈ 0.036
    big = np.flatnonzero(labels == 7 * 3 + 3)  # the class of 12: each member picked w.p. 0.4 · 4/12
    rates = np.array([index_hits[i] for i in big]) / 3000
    assert np.all(np.abs(rates - 0.4 * 4 / 12) < 0.04)


def test_length_default_and_explicit():
    labels = make_labels()
    sampler = ClassBalancedBatchSampler(labels, classes_per_batch=4, samples_per_class=4)
    assert len(sampler) == len(labels) // 16 == len(batches(sampler))
    sampler = ClassBalancedBatchSampler(labels, classes_per_batch=2, samples_per_class=3, num_batches=25)
    assert len(sampler) == 25 == len(batches(sampler))


def test_determinism_per_seed_and_epoch():
    labels = make_labels()

    def make(seed=0):
        return ClassBalancedBatchSampler(labels, classes_per_batch=3, samples_per_class=2, num_batches=20, seed=seed)

    first, again = make(), make()
    assert batches(first) == batches(again) == batches(first)  # re-iterating repeats the epoch
    epoch0 = batches(first)
    first.set_epoch(1)
    assert batches(first) != epoch0
    again.set_epoch(1)
    assert batches(first) == batches(again)
    first.set_epoch(0)
    assert batches(first) == epoch0
    assert batches(make(seed=1)) != epoch0
    as_tensor = ClassBalancedBatchSampler(
        torch.as_tensor(labels), classes_per_batch=3, samples_per_class=2, num_batches=20
    )
    assert batches(as_tensor) == epoch0


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_rank_shares_are_disjoint_and_union_is_global_batch(world_size):
    labels = make_labels(sizes=[5, 6, 4, 9, 7, 8])  # every class has >= M images: no repeated index
    common = dict(classes_per_batch=4, samples_per_class=4, num_batches=30, seed=5)
    single = ClassBalancedBatchSampler(labels, **common)
    single.set_epoch(3)
    shards = [ClassBalancedBatchSampler(labels, rank=r, world_size=world_size, **common) for r in range(world_size)]
    for shard in shards:
        shard.set_epoch(3)
        assert len(shard) == 30
    per_rank = [batches(s) for s in shards]
    for b, global_batch in enumerate(batches(single)):
        parts = [per_rank[r][b] for r in range(world_size)]
        assert all(len(p) == 16 // world_size for p in parts)
        assert sum(parts, []) == global_batch
        for r in range(world_size):
            for q in range(r + 1, world_size):
                assert not set(parts[r]) & set(parts[q])


def test_works_as_dataloader_batch_sampler():
    labels = make_labels()
    dataset = torch.utils.data.TensorDataset(torch.as_tensor(labels))
    sampler = ClassBalancedBatchSampler(labels, classes_per_batch=2, samples_per_class=3, num_batches=5)
    loaded = [b[0] for b in torch.utils.data.DataLoader(dataset, batch_sampler=sampler)]
    assert len(loaded) == 5
    for got, indices in zip(loaded, sampler):
        assert got.tolist() == labels[indices].tolist()


@pytest.mark.parametrize(
    "labels, kwargs, message",
    [
        (make_labels(), dict(classes_per_batch=11, samples_per_class=2), "10 classes, fewer than classes_per_batch=11"),
        (make_labels(), dict(classes_per_batch=3, samples_per_class=3, world_size=2), "not divisible by world_size=2"),
        (make_labels(), dict(classes_per_batch=2, samples_per_class=2, rank=2, world_size=2), "0 <= rank < world_size"),
        (make_labels(), dict(classes_per_batch=0, samples_per_class=2), "must be >= 1"),
        (make_labels(), dict(classes_per_batch=2, samples_per_class=2, num_batches=0), "num_batches must be >= 1"),
        ([], dict(classes_per_batch=2, samples_per_class=2), "non-empty 1-D"),
        ([0.5, 1.5], dict(classes_per_batch=2, samples_per_class=1), "integers"),
        ([0, 1, 1], dict(classes_per_batch=2, samples_per_class=2), "fewer than one batch"),
    ],
)
def test_sampler_errors(labels, kwargs, message):
    with pytest.raises(ValueError, match=message):
        ClassBalancedBatchSampler(labels, **kwargs)


def test_set_epoch_rejects_negative():
    sampler = ClassBalancedBatchSampler(make_labels(), classes_per_batch=2, samples_per_class=2)
    with pytest.raises(ValueError, match="epoch must be >= 0"):
        sampler.set_epoch(-1)
