"""The tensor input pipeline: cached uint8 datasets, per-sample batched augmentation on the device,
the evaluation geometry, fallbacks to the file pipeline, cache invalidation and the compute fast path."""

import hashlib
import logging
import os
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import Subset
from torchvision.transforms.v2 import functional as TF

from dmlstudy.data import build_dataset, build_transforms
from dmlstudy.data.batch_transforms import (
    axis_aligned_grid,
    crop_thetas,
    normalize_batch,
    random_resized_crop_boxes,
    sample_uniforms,
)
from dmlstudy.data.loading import evaluation_batches
from dmlstudy.data.tensor_cache import (
    CACHE_FOLDER,
    BatchAugmentedTrain,
    DifferentImageSizes,
    EvaluationImages,
    TensorImageSplit,
    cache_key,
    cached_images,
    stored_side,
    tensor_layout,
)
from tests.fixtures_layouts import mixed_size, write_cub

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def smooth_image(height: int = 48, width: int = 64, seed: int = 0) -> np.ndarray:
    """An H × W × 3 uint8 image with structure at every scale but no pixel-level noise (so resampling methods agree)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    rng = np.random.default_rng(seed)
    channels = [
        127 + 60 * np.sin(x / rng.uniform(4, 9) + rng.uniform(0, 6)) + 60 * np.cos(y / rng.uniform(4, 9))
        for _ in range(3)
    ]
    return np.clip(np.stack(channels, axis=2), 0, 255).astype(np.uint8)


def box_centroid(image: torch.Tensor) -> tuple[float, float]:
    weights = image.float().sum(0)
    y, x = torch.meshgrid(torch.arange(image.shape[-2]).float(), torch.arange(image.shape[-1]).float(), indexing="ij")
    return float((weights * y).sum() / weights.sum()), float((weights * x).sum() / weights.sum())


@pytest.mark.parametrize("flip", [False, True])
def test_a_crop_box_lands_where_the_pil_pipeline_puts_it(flip):
    pixels = smooth_image()
    picture = Image.fromarray(pixels)
    tensor = torch.from_numpy(pixels).permute(2, 0, 1)[None]
    boxes = random_resized_crop_boxes(sample_uniforms(3, 1, np.arange(12)), 48, 64)
    theta = crop_thetas(boxes, np.full(len(boxes), flip), 48, 64)
    grid = F.affine_grid(theta, [len(boxes), 3, 32, 32], align_corners=False)
    ours = F.grid_sample(tensor.float().expand(len(boxes), -1, -1, -1), grid, mode="bilinear", align_corners=False)
    for row, (top, left, height, width) in enumerate(boxes):
        reference = TF.pil_to_tensor(
            TF.resized_crop(picture, int(top), int(left), int(height), int(width), [32, 32], antialias=True)
        ).float()
        if flip:
            reference = TF.horizontal_flip(reference)
        assert (ours[row] - reference).abs().mean() < 4.0, (
            row,
            boxes[row],
        )  # intensity levels; a 1-px shift costs ≈ 15
        marked = torch.zeros(1, 3, 48, 64)
        marked[..., 20:26, 30:34] = 255.0  # a square inside every box is placed where the crop maps it
        if top <= 20 and top + height >= 26 and left <= 30 and left + width >= 34:
            mapped = F.grid_sample(marked, grid[row : row + 1], mode="bilinear", align_corners=False)[0]
            expected_y = (23 - top) * 32 / height - 0.5
            expected_x = (32 - left) * 32 / width - 0.5
            expected_x = 31 - expected_x if flip else expected_x
            assert np.allclose(box_centroid(mapped), (expected_y, expected_x), atol=0.3)


def test_the_broadcast_grid_equals_affine_grid():
    boxes = random_resized_crop_boxes(sample_uniforms(1, 0, np.arange(16)), 48, 64)
    theta = crop_thetas(boxes, np.arange(16) % 2 == 0, 48, 64)
    torch.testing.assert_close(axis_aligned_grid(theta, 24), F.affine_grid(theta, [16, 3, 24, 24], align_corners=False))


def test_crop_boxes_follow_the_random_resized_crop_ranges():
    boxes = random_resized_crop_boxes(sample_uniforms(0, 0, np.arange(4000)), 64, 64)
    top, left, height, width = boxes.T
    assert (top >= 0).all() and (left >= 0).all() and (top + height <= 64).all() and (left + width <= 64).all()
    area = height * width / 64**2
    assert area.min() >= 0.2 - 0.03 and area.max() <= 1.0
    assert 0.5 < np.median(area) < 0.7  # U(0.2, 1) before the rejections of boxes wider or taller than the image
    assert (width / height).min() >= 0.75 - 0.06 and (width / height).max() <= 4 / 3 + 0.06


def test_per_sample_parameters_depend_on_seed_epoch_and_index_only():
    first = sample_uniforms(7, 2, [5, 11, 3])
    again = sample_uniforms(7, 2, [3, 99, 5, 11])
    np.testing.assert_array_equal(first, again[[2, 3, 0]])
    assert not np.array_equal(sample_uniforms(7, 3, [5]), first[:1]) and not np.array_equal(
        sample_uniforms(8, 2, [5]), first[:1]
    )
    images = torch.from_numpy(np.stack([smooth_image(seed=s) for s in range(4)])).permute(0, 3, 1, 2).contiguous()
    split = TensorImageSplit(_metadata(4), images)
    view = BatchAugmentedTrain(split, seed=7, image_size=32)
    batch, _ = view.batch([0, 1, 2, 3], "cpu")
    shuffled, _ = view.batch([3, 1], "cpu")
    torch.testing.assert_close(shuffled, batch[[3, 1]])
    torch.testing.assert_close(view[2][0], batch[2])


def _metadata(count: int, *, flip_invariant: bool = True) -> SimpleNamespace:
    """The metadata a TensorImageSplit copies from its ImageListDataset."""
    return SimpleNamespace(
        labels=np.arange(count) % 2,
        paths=[f"image{i}.png" for i in range(count)],
        class_names=["a", "b"],
        name="synthetic/train",
        flip_invariant=flip_invariant,
    )


@pytest.mark.parametrize("flip_invariant", [False, True])
def test_no_flip_ever_reaches_a_flip_sensitive_dataset(flip_invariant):
    ramp = (
        torch.arange(64, dtype=torch.float32).mul(4).to(torch.uint8).expand(1, 3, 64, 64).contiguous()
    )  # brighter to the right
    split = TensorImageSplit(_metadata(1, flip_invariant=flip_invariant), ramp)
    view = BatchAugmentedTrain(split, seed=0, image_size=32)
    slopes = []
    for epoch in range(50):
        view.set_epoch(epoch)
        images, _ = view.batch([0], "cpu")
        slopes.append(float(images[0, :, :, -4:].mean() - images[0, :, :, :4].mean()))
    flipped = sum(slope < 0 for slope in slopes)
    if flip_invariant:
        assert 10 < flipped < 40  # p = 0.5 per draw: the test can see a flip
    else:
        assert flipped == 0


def test_the_glyphs_training_view_never_flips(tmp_path, tiny_config, monkeypatch):
    from dmlstudy.data import DATASETS
    from dmlstudy.run import data as run_data

    def small_glyphs(name, root, split):
        return DATASETS[name](root=root, split=split, num_classes=8, images_per_class=4)

    monkeypatch.setattr(run_data, "build_dataset", small_glyphs)
    train = run_data.load_datasets(tiny_config(data_root=str(tmp_path), dataset="glyphs"))["train"]
    assert isinstance(train, BatchAugmentedTrain) and train.split.flip_invariant is False
    train.split.images = (
        torch.arange(64, dtype=torch.float32).mul(4).to(torch.uint8).expand(len(train), 3, 64, 64).contiguous()
    )  # brighter to the right
    images, _ = train.batch(list(range(len(train))), "cpu")
    assert (images[..., -4:].mean(dim=(1, 2, 3)) > images[..., :4].mean(dim=(1, 2, 3))).all()


def test_evaluation_view_matches_the_test_transform(tiny_data_root):
    split = build_dataset("cub200", tiny_data_root / "cub200", "test")
    images = torch.from_numpy(cached_images(split, tiny_data_root / "cub200"))
    view = EvaluationImages(TensorImageSplit(split, images), 40)
    transform = build_transforms(40, train=False)
    for index in (0, 7, len(split) - 1):
        reference = transform(split.load_image(index))
        assert view[index][0].shape == reference.shape == (3, 40, 40)
        assert (view[index][0] - reference).abs().mean() < 0.03  # ≈ 2 intensity levels of resampling difference
    torch.testing.assert_close(view.batch(slice(0, 3), "cpu"), torch.stack([view[i][0] for i in range(3)]))
    torch.testing.assert_close(normalize_batch(images[:1]), normalize_batch(images[:1].float()))


def test_evaluation_batches_read_either_pipeline_in_the_order_asked(tiny_data_root):
    """The one batching path of every embedding pass (run_evaluation.embed, DIML's grid embeddings): a Subset of the
    tensor view is unwrapped to rows of the cropped tensor, a file split goes through a DataLoader."""
    split = build_dataset("cub200", tiny_data_root / "cub200", "test")
    view = EvaluationImages(
        TensorImageSplit(split, torch.from_numpy(cached_images(split, tiny_data_root / "cub200"))), 40
    )
    rows = [1, 2, 3, 4, 5, 6, 7]
    indices = np.array([5, 0, 3, 4, 1])  # unsorted, across batch boundaries
    from_tensor = torch.cat(list(evaluation_batches(Subset(view, rows), indices, batch_size=2, device="cpu")))
    torch.testing.assert_close(from_tensor, torch.stack([view[rows[i]][0] for i in indices]))
    split.transform = build_transforms(40, train=False)
    from_files = torch.cat(list(evaluation_batches(split, indices, batch_size=2, device="cpu")))
    torch.testing.assert_close(from_files, torch.stack([split[i][0] for i in indices]))


def test_cache_is_reused_without_decoding(tiny_data_root, monkeypatch):
    root = tiny_data_root / "cub200"
    split = build_dataset("cub200", root, "train")
    first = cached_images(split, root)
    monkeypatch.setattr(
        type(split), "read_image", lambda self, index: pytest.fail("decoded although the cache is current")
    )
    np.testing.assert_array_equal(cached_images(split, root), first)
    assert first.shape == (len(split), 3, 64, 64) and first.dtype == np.uint8
    np.testing.assert_array_equal(first[5].transpose(1, 2, 0), np.asarray(Image.open(split.paths[5]).convert("RGB")))


def test_stale_or_corrupt_cache_is_rebuilt_with_a_warning_and_nothing_else_lost(tiny_data_root, tmp_path):
    root = tmp_path / "cub200"
    shutil.copytree(tiny_data_root / "cub200", root)
    split = build_dataset("cub200", root, "train")
    reference = cached_images(split, root)
    array_file = next((root / CACHE_FOLDER).glob("*train.npy"))
    untouched = root / CACHE_FOLDER / "notes.txt"
    untouched.write_text("keep me")
    files_before = {p: p.read_bytes() for p in (root / "images").rglob("*.png")}

    data = bytearray(array_file.read_bytes())
    data[-100] ^= 0xFF
    array_file.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="corrupt"):
        np.testing.assert_array_equal(cached_images(split, root), reference)
    array_file.write_bytes(array_file.read_bytes()[:200])  # truncated
    with pytest.warns(UserWarning, match="corrupt"):
        np.testing.assert_array_equal(cached_images(split, root), reference)

    changed = split.paths[3]
    Image.fromarray(smooth_image(64, 64)).save(changed)
    os.utime(changed, ns=(changed.stat().st_atime_ns, changed.stat().st_mtime_ns + 10**9))
    with pytest.warns(UserWarning, match="stale"):
        rebuilt = cached_images(split, root)
    np.testing.assert_array_equal(rebuilt[3].transpose(1, 2, 0), smooth_image(64, 64))
    np.testing.assert_array_equal(np.delete(rebuilt, 3, axis=0), np.delete(reference, 3, axis=0))
    assert untouched.read_text() == "keep me"
    assert {p for p in (root / "images").rglob("*.png")} == set(files_before)


def test_over_budget_dataset_falls_back_to_files_with_a_logged_message(tiny_config, caplog):
    from dmlstudy.run.data import SeededAugmentation, load_datasets

    with caplog.at_level(logging.INFO, logger="dmlstudy.run.data"):
        datasets = load_datasets(tiny_config(tensor_budget_gib=1e-6))
    assert isinstance(datasets["train"], SeededAugmentation)
    assert "over tensor_budget_gib" in caplog.text and "reading image files instead" in caplog.text
    with pytest.raises(ValueError, match="input_pipeline='tensor' is not possible"):
        load_datasets(tiny_config(tensor_budget_gib=1e-6, input_pipeline="tensor"))
    assert isinstance(load_datasets(tiny_config())["train"], BatchAugmentedTrain)


def test_images_of_different_sizes_fall_back_to_files(tiny_data_root, tmp_path, tiny_config, caplog):
    from dmlstudy.run.data import SeededAugmentation, load_datasets

    root = tmp_path / "data" / "cub200"
    shutil.copytree(tiny_data_root / "cub200", root)
    first = build_dataset("cub200", root, "test").paths[0]
    Image.fromarray(smooth_image(50, 70)).save(first)
    with caplog.at_level(logging.INFO, logger="dmlstudy.run.data"):
        datasets = load_datasets(tiny_config(data_root=str(tmp_path / "data")))
    assert isinstance(datasets["train"], SeededAugmentation) and "differ in size" in caplog.text


@pytest.mark.parametrize("pipeline", ["tensor", "files"])
def test_same_seed_gives_identical_metrics_with_0_and_2_workers(tiny_config, pipeline):
    from dmlstudy.run.train import run

    results = [
        run(tiny_config(run_name=f"{pipeline}-{workers}", input_pipeline=pipeline, num_workers=workers, epochs=1))
        for workers in (0, 2)
    ]
    assert results[0].metrics["R@1"] == results[1].metrics["R@1"]
    np.testing.assert_array_equal(results[0].embeddings["embeddings"], results[1].embeddings["embeddings"])


def test_autocast_defaults_to_bfloat16_on_cuda_only(tiny_config):
    from dmlstudy.run.compute import autocast_dtype

    assert autocast_dtype(tiny_config(), torch.device("cpu")) is None
    assert autocast_dtype(tiny_config(), torch.device("cuda")) is torch.bfloat16
    assert autocast_dtype(tiny_config(autocast="off"), torch.device("cuda")) is None
    assert autocast_dtype(tiny_config(autocast="bf16"), torch.device("cpu")) is torch.bfloat16
    with pytest.raises(ValueError, match="autocast"):
        tiny_config(autocast="fp8")
    with pytest.raises(ValueError, match="input_pipeline"):
        tiny_config(input_pipeline="gpu")


@pytest.mark.parametrize("name", ["ms", "crt", "diml", "cross_attention", "dgcrl"])
def test_embeddings_do_not_depend_on_the_evaluation_batch_size(name):
    """The evaluation batch size is a speed choice only (EVAL_BATCH_SIZE): in eval mode every image's embedding
    is computed on its own, so 64 and 256 images per pass agree (to float rounding on any BLAS)."""
    from dmlstudy.methods import EVAL_BATCH_SIZE, build_method
    from dmlstudy.models import build_backbone
    from dmlstudy.run.evaluation import embed

    torch.manual_seed(0)
    method = build_method(name, backbone=build_backbone("dml_convnet"), embedding_dim=16, num_classes=4)
    for module in method.modules():  # away from the identity statistics of a fresh BatchNorm
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.normal_()
            module.running_var.uniform_(0.5, 2.0)
    images = torch.utils.data.TensorDataset(torch.rand(300, 3, 32, 32), torch.zeros(300, dtype=torch.long))
    small, large = embed(method, images, batch_size=EVAL_BATCH_SIZE), embed(method, images, batch_size=256)
    assert small.shape == (300, 16)
    np.testing.assert_allclose(small, large, rtol=0, atol=1e-6)
    assert not np.allclose(small[:150], small[150:], atol=1e-3)  # the images differ, so must their embeddings


def test_baseline_training_step_has_no_graph_break():
    from dmlstudy.methods import build_method
    from dmlstudy.models import build_backbone

    method = build_method("ms", backbone=build_backbone("dml_convnet", image_size=32), embedding_dim=16, num_classes=4)
    images, labels = torch.randn(8, 3, 32, 32), torch.arange(4).repeat_interleave(2)
    explanation = torch._dynamo.explain(method.loss)(images, labels)
    assert explanation.graph_break_count == 0, explanation.break_reasons


@needs_cuda
def test_cuda_batches_equal_cpu_batches_and_stay_resident():
    images = torch.from_numpy(np.stack([smooth_image(seed=s) for s in range(4)])).permute(0, 3, 1, 2).contiguous()
    cpu = BatchAugmentedTrain(TensorImageSplit(_metadata(4), images.clone()), seed=1, image_size=32)
    gpu = BatchAugmentedTrain(TensorImageSplit(_metadata(4), images.clone()), seed=1, image_size=32).to("cuda")
    assert gpu.split.images.is_cuda
    on_gpu, labels = gpu.batch([2, 0, 3], "cuda")
    assert on_gpu.is_cuda and labels.is_cuda
    torch.testing.assert_close(on_gpu.cpu(), cpu.batch([2, 0, 3], "cpu")[0], atol=1e-3, rtol=1e-3)


@needs_cuda
def test_cuda_runs_train_on_both_pipelines_with_default_bfloat16(tiny_config):
    from dmlstudy.run.train import run

    result = run(tiny_config(run_name="cuda", device="cuda", epochs=1))
    assert np.isfinite(result.metrics["R@1"]) and next(result.method.parameters()).is_cuda
    files = run(tiny_config(run_name="cuda-files", device="cuda", epochs=1, input_pipeline="files", num_workers=2))
    assert np.isfinite(files.metrics["R@1"])


# ------------------------------------------------------------------------------------ images of different sizes


def _key_as_of_format_1(split, root) -> str:
    """The tensor cache key written out by hand: format, split name, generator marker, then every file's
    (relative path, size, mtime); what every cached embedded set on disk is stored under."""
    digest = hashlib.sha256(f"format 1\n{split.name}\n".encode())
    digest.update((root / "GENERATED.json").read_bytes())
    for path in split.paths:
        stat = path.stat()
        digest.update(f"\n{path.relative_to(root).as_posix()} {stat.st_size} {stat.st_mtime_ns}".encode())
    return digest.hexdigest()


def test_images_of_one_size_keep_their_cache_key_file_and_bytes_when_a_side_is_asked(tiny_data_root):
    root = tiny_data_root / "cub200"
    split = build_dataset("cub200", root, "test")
    stored = cached_images(split, root)
    for side in (None, stored_side(32), stored_side(128)):
        layout = tensor_layout(split, root, side=side)
        assert layout.side is None and layout.key == cache_key(split, root) == _key_as_of_format_1(split, root)
        assert (layout.height, layout.width, layout.nbytes) == (64, 64, stored.nbytes)
        np.testing.assert_array_equal(cached_images(split, root, layout), stored)
    assert not list((root / CACHE_FOLDER).glob("*px.*"))  # no resized copy beside the stored one


def _shifted_difference(image: torch.Tensor, reference: torch.Tensor) -> float:
    """The least mean absolute difference of two C × S × S images over shifts of at most one pixel each way
    (centre crops of a centre crop can land one pixel from the centre crop of the whole, by rounding)."""
    size = image.shape[-1]
    return min(
        float((image[:, 1 + dy : size - 1 + dy, 1 + dx : size - 1 + dx] - reference[:, 1:-1, 1:-1]).abs().mean())
        for dy in (-1, 0, 1)
        for dx in (-1, 0, 1)
    )


@pytest.fixture(scope="module")
def mixed_root(tmp_path_factory):
    """A data root whose ``cub200`` holds 8 classes × 6 images of different sizes in the CUB layout, each a
    smooth picture (structure at every scale, so a one-pixel shift of a crop shows)."""
    parent = tmp_path_factory.mktemp("mixed") / "cub200"
    base, records = write_cub(parent, images_per_class=[6] * 8, mixed_sizes=True)
    for image_id, record in enumerate(records, start=1):
        width, height = mixed_size(image_id)
        Image.fromarray(smooth_image(height, width, seed=image_id)).save(record.path, quality=95)
    return parent.parent


def test_images_of_different_sizes_are_cached_as_the_centre_square_of_the_test_resize(mixed_root, monkeypatch):
    root = mixed_root / "cub200"
    split = build_dataset("cub200", root, "test")
    assert len({Image.open(path).size for path in split.paths}) > 1
    with pytest.raises(DifferentImageSizes, match="differ in size"):
        cached_images(split, root)  # without a side, nothing is resized silently
    side = stored_side(32)
    layout = tensor_layout(split, root, side=side)
    assert side == round(32 * 8 / 7) == 37 and (layout.height, layout.width, layout.side) == (37, 37, 37)
    assert layout.key != cache_key(split, root) and layout.nbytes == len(split) * 3 * 37 * 37
    images = cached_images(split, root, layout)
    assert images.shape == (len(split), 3, 37, 37) and images.dtype == np.uint8
    assert (root / CACHE_FOLDER / "cub200-test-37px.npy").is_file()
    view = EvaluationImages(TensorImageSplit(split, torch.from_numpy(images)), 32)
    transform = build_transforms(32, train=False)  # the per-item test transform, on the photo as stored
    for index in range(len(split)):
        assert _shifted_difference(view[index][0], transform(split.load_image(index))) < 0.03, index
    monkeypatch.setattr(type(split), "read_image", lambda self, index: pytest.fail("decoded although cached"))
    monkeypatch.setattr(Image, "open", lambda *args, **kwargs: pytest.fail("a header read although cached"))
    again = tensor_layout(split, root, side=side)
    assert again == layout
    np.testing.assert_array_equal(cached_images(split, root, again), images)


def test_images_of_different_sizes_take_the_tensor_pipeline_when_asked(mixed_root, tiny_config, caplog):
    from dmlstudy.run.data import SeededAugmentation, load_datasets

    with caplog.at_level(logging.INFO, logger="dmlstudy.run.data"):
        assert isinstance(load_datasets(tiny_config(data_root=str(mixed_root)))["train"], SeededAugmentation)
        datasets = load_datasets(tiny_config(data_root=str(mixed_root), input_pipeline="tensor"))
    assert "differ in size" in caplog.text and "resized to 37 px" in caplog.text
    assert isinstance(datasets["train"], BatchAugmentedTrain) and datasets["train"].split.images.shape[-2:] == (37, 37)
    images, _ = datasets["train"].batch([0, 1, 2], "cpu")
    assert images.shape == (3, 3, 32, 32)


def test_an_imagenet_regime_run_trains_on_the_stem_cache_of_images_of_different_sizes(mixed_root, tiny_config):
    from dmlstudy.models.trunk_cache import CachedViewTrain
    from dmlstudy.run.data import load_datasets
    from dmlstudy.run.regimes import regime_overrides
    from dmlstudy.run.train import run

    overrides = regime_overrides("imagenet", backbone="dml_efficientnet_lite0", epochs=1)
    config = tiny_config(data_root=str(mixed_root), backbone="dml_efficientnet_lite0", epochs=1, **overrides)
    datasets = load_datasets(config)
    assert isinstance(datasets["train"], CachedViewTrain)
    assert datasets["train"].split.training_views == overrides["stem_views"]
    assert len(list((mixed_root / "cub200" / CACHE_FOLDER / "stem").glob("stem-*.safetensors"))) == (
        overrides["stem_views"] + 1 + 1  # the training views and the test view of train, the test view of test
    )
    result = run(config)
    assert np.isfinite(result.metrics["R@1"]) and 0.0 <= result.metrics["R@1"] <= 1.0
