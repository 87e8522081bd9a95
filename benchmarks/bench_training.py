"""Training input pipeline and compute path, old against new, side by side in one process.

Run: ``.venv/bin/python benchmarks/bench_training.py [--dataset synbirds] [--threads 1 2] [--epochs 3]``
(``--compile`` adds the compiled variant; ``--augment`` adds the batch-augmentation micro-benchmark;
``--quality`` runs the R@1 check instead, see below). Results go to ``benchmarks/README.md``.

Speed: for each device (CPU at every ``--threads`` count, and CUDA when present) the same MS run is trained
through ``dmlstudy.run.train.run`` with

* ``old``: ``input_pipeline="files"`` (PNG decoding and per-item PIL transforms in the main process,
  ``num_workers=0``), ``channels_last=False``, no compile, 256 images per evaluation pass: the first pipeline;
* ``new``: the defaults (``input_pipeline="auto"`` → the cached uint8 tensor with batched augmentation,
  ``eval_batch_size=64``; ``channels_last`` off, as by default; bf16 autocast on CUDA only);
* ``new+compile`` (with ``--compile``): ``new`` with ``compile=True``; its first epoch holds the compile time;
* ``new+bf16`` (with ``--bf16``): ``new`` with ``autocast="bf16"`` (bfloat16 autocast, on the CPU too).

evaluated after every epoch. Per variant: the first epoch (old: it decodes every PNG; compile: it compiles),
the mean of the later ("steady") epochs, evaluation seconds (mean over evaluations after the first, which
for ``old`` decodes and memoizes the test images), training images/s in the steady epochs, and the process
CPU seconds of the same (history columns ``train_cpu_seconds``/``eval_cpu_seconds``, all threads of the
process: on a shared, overloaded machine wall time measures the neighbours as much as the code). The tensor cache
is built (or found) once before the runs; its build time is printed.

Quality (``--quality``): final R@1 of MS for each of ``--variants`` (default old and new), ``--seeds`` ×
``--datasets``, with the study's 6-epoch settings, printed as mean ± standard deviation over seeds.

Evaluation (``--evaluation``): one evaluation of the test split by the same model (MS, seed 0, trained for
``--epochs`` first: k-means NMI converges faster on an untrained model's embeddings), median of
``--repeats`` after one warm-up evaluation (which the old pipeline spends decoding and memoizing the test
images): the old pipeline with every metric (what
each per-epoch evaluation cost with the first pipeline), the new pipeline with every metric (a run's final
evaluation), and the new pipeline with the retrieval metrics only (``full=False``: what each per-epoch
evaluation of the study's protocol computes, on its validation classes).

Embedding (``--embedding``): CPU seconds to embed the test split at each ``--eval-batch-sizes`` for each of
``--methods`` (median of ``--repeats``, first ``--threads`` count), and whether the embeddings equal those at
the largest size: the measurement behind ``EVAL_BATCH_SIZE``.

Optimizer (``--optimizer``): one full training step (loss, backward, AdamW step) of each of ``--methods`` on a
random 64-px batch, with AdamW's multi-tensor (``foreach``) and its fused kernel, interleaved for ``--repeats``
rounds after one warm-up round, first ``--threads`` count: median milliseconds per step and of the optimizer
step alone; the measurement behind ``dmlstudy.run.train.OPTIMIZERS``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from dmlstudy.data import build_dataset, build_transforms
from dmlstudy.data.batch_transforms import augment_batch
from dmlstudy.data.tensor_cache import cached_images
from dmlstudy.paths import data_root
from dmlstudy.run.train import TrainConfig, run

OLD = {"input_pipeline": "files", "channels_last": False, "compile": False, "num_workers": 0, "eval_batch_size": 256}
NEW = {"input_pipeline": "auto"}
NEW_COMPILED = {"input_pipeline": "auto", "compile": True}
NEW_BF16 = {"input_pipeline": "auto", "autocast": "bf16"}
VARIANTS = {"old": OLD, "new": NEW, "new+compile": NEW_COMPILED, "new+bf16": NEW_BF16}


def build_cache(dataset: str) -> float:
    """Seconds to find or build the tensor cache of every split of ``dataset``."""
    started = time.perf_counter()
    root = Path(data_root()) / dataset
    for split in ("train", "test"):
        cached_images(build_dataset(dataset, root, split), root)
    return time.perf_counter() - started


def timed_run(config: TrainConfig) -> dict[str, float]:
    started_cpu = time.process_time()
    result = run(config)
    total_cpu = time.process_time() - started_cpu
    train_seconds = result.history["train_seconds"].to_numpy()
    eval_seconds = result.history["eval_seconds"].dropna().to_numpy()
    eval_cpu = result.history["eval_cpu_seconds"].dropna().to_numpy()
    steady = train_seconds[1:] if len(train_seconds) > 1 else train_seconds
    steady_cpu = (
        result.history["train_cpu_seconds"].to_numpy()[1:]
        if len(train_seconds) > 1
        else result.history["train_cpu_seconds"].to_numpy()
    )
    steps = config.steps_per_epoch or len(
        build_dataset(config.dataset, Path(data_root()) / config.dataset, "train")
    ) // (config.classes_per_batch * config.samples_per_class)
    return {
        "first epoch s": float(train_seconds[0]),
        "steady epoch s": float(steady.mean()),
        "eval s": float(eval_seconds[1:].mean() if len(eval_seconds) > 1 else eval_seconds.mean()),
        "first eval s": float(eval_seconds[0]),
        "train img/s": steps * config.classes_per_batch * config.samples_per_class / float(steady.mean()),
        "steady epoch CPU s": float(steady_cpu.mean()),
        "eval CPU s": float(eval_cpu[1:].mean() if len(eval_cpu) > 1 else eval_cpu.mean()),
        "run CPU s": total_cpu,
        "R@1": result.metrics["R@1"],
    }


def speed(args: argparse.Namespace) -> None:
    print(f"tensor cache of {args.dataset}: {build_cache(args.dataset):.1f} s (found or built)")
    devices = [("cpu", threads) for threads in args.threads]
    if torch.cuda.is_available():
        devices.append(("cuda", args.threads[-1]))
    names = ["old", "new"] + (["new+compile"] if args.compile else []) + (["new+bf16"] if args.bf16 else [])
    variants = {name: VARIANTS[name] for name in names}
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    rows = []
    with tempfile.TemporaryDirectory() as runs:
        for device, threads in devices:
            torch.set_num_threads(threads)
            measured = {}
            for name, options in variants.items():
                config = TrainConfig(
                    study="bench",
                    run_name=f"{device}-{threads}-{name}",
                    runs_root=runs,
                    dataset=args.dataset,
                    method="ms",
                    epochs=args.epochs,
                    steps_per_epoch=args.steps_per_epoch,
                    train_classes=0,  # the whole dataset, as the study trains (the TrainConfig defaults are CI-sized)
                    test_classes=0,
                    eval_every=1,
                    device=device,
                    progress=False,
                    seed=0,
                    **options,
                )
                measured[name] = timed_run(config)
                print(device, threads, name, {k: round(v, 3) for k, v in measured[name].items()}, flush=True)
            for name, values in measured.items():
                rows.append((device, threads, name, values, measured["old"]))
    print(f"load average at end: {os.getloadavg()[0]:.1f}\n")
    print(
        "| device | threads | pipeline | first epoch s | steady epoch s | × old | epoch CPU s | × old | eval s | × old | eval CPU s | × old "
        "| train img/s | first eval s | run CPU s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for device, threads, name, values, old in rows:
        ratio = {key: old[key] / values[key] for key in values}
        print(
            f"| {device} | {threads} | {name} | {values['first epoch s']:.1f} | {values['steady epoch s']:.2f} | {ratio['steady epoch s']:.2f} | "
            f"{values['steady epoch CPU s']:.2f} | {ratio['steady epoch CPU s']:.2f} | {values['eval s']:.2f} | {ratio['eval s']:.2f} | "
            f"{values['eval CPU s']:.2f} | {ratio['eval CPU s']:.2f} | {values['train img/s']:.0f} | {values['first eval s']:.2f} | {values['run CPU s']:.0f} |"
        )


def augmentation(args: argparse.Namespace) -> None:
    """Per-sample random resized crop + flip + normalisation of one batch: ours, kornia, per-item PIL."""
    import kornia.augmentation as K

    from dmlstudy.data.transforms import (
        CROP_RATIO,
        CROP_SCALE,
        IMAGENET_MEAN,
        IMAGENET_STD,
    )

    root = Path(data_root()) / args.dataset
    split = build_dataset(args.dataset, root, "train")
    images = torch.from_numpy(cached_images(split, root)[: args.batch])
    pictures = [split.read_image(i) for i in range(args.batch)]
    per_item = build_transforms(64, train=True)
    kornia_pipeline = K.AugmentationSequential(
        K.RandomResizedCrop((64, 64), scale=CROP_SCALE, ratio=CROP_RATIO),
        K.RandomHorizontalFlip(),
        K.Normalize(mean=torch.tensor(IMAGENET_MEAN), std=torch.tensor(IMAGENET_STD)),
    )
    candidates = {
        "per-sample θ, grid_sample (ours)": lambda: augment_batch(
            images, np.arange(args.batch), seed=0, epoch=0, image_size=64, flip=True
        ),
        "kornia.augmentation (RandomResizedCrop, flip, normalise)": lambda: kornia_pipeline(images.float() / 255),
        "per-item PIL transforms (old)": lambda: torch.stack([per_item(p) for p in pictures]),
    }
    for threads in args.threads:
        torch.set_num_threads(threads)
        print(
            f"\n| batch {args.batch}, 64 px, {threads} thread(s) | wall ms per batch | CPU ms per batch |\n|---|---|---|"
        )
        for label, function in candidates.items():
            function()
            walls, cpus = [], []
            for _ in range(args.repeats):
                started, started_cpu = time.perf_counter(), time.process_time()
                function()
                walls.append(time.perf_counter() - started)
                cpus.append(time.process_time() - started_cpu)
            print(f"| {label} | {1000 * statistics.median(walls):.2f} | {1000 * statistics.median(cpus):.2f} |")


def evaluation(args: argparse.Namespace) -> None:
    """Seconds and CPU seconds of one test evaluation: old pipeline, new pipeline, new with retrieval only."""
    from dmlstudy.run.data import load_datasets, place_on_device
    from dmlstudy.run.evaluation import evaluate
    from dmlstudy.run.model import build_model
    from dmlstudy.run.train import load_reported_state

    print(f"tensor cache of {args.dataset}: {build_cache(args.dataset):.1f} s (found or built)")
    device = torch.device("cpu")
    trained = TrainConfig(
        study="bench",
        run_name="evaluated",
        runs_root=tempfile.mkdtemp(),
        dataset=args.dataset,
        method="ms",
        epochs=args.epochs,
        steps_per_epoch=0,
        train_classes=0,
        test_classes=0,
        lr=0.004,
        eval_every=args.epochs,
        seed=0,
        device="cpu",
        progress=False,
    )
    print(f"trained model: R@1 {run(trained).metrics['R@1']:.3f} after {args.epochs} epochs")
    loaded = {}  # pipeline → (test datasets, the trained model, evaluation options), built once
    for name, options in {"old": OLD, "new": NEW}.items():
        config = TrainConfig(
            dataset=args.dataset, method="ms", seed=0, test_classes=0, device="cpu", progress=False, **options
        )
        datasets = place_on_device(load_datasets(config), device)
        method = load_reported_state(build_model(config, datasets["train"].num_classes), trained.run_dir, device)
        options = {"batch_size": config.eval_batch_size, "device": device, "channels_last": config.channels_last}
        loaded[name] = (datasets, method.eval(), options)
    variants = {
        "old, every metric": ("old", True),
        "new, every metric": ("new", True),
        "new, retrieval only": ("new", False),
    }
    for threads in args.threads:
        torch.set_num_threads(threads)
        print(
            f"\n| {args.dataset} test split, {threads} thread(s) | wall s | × old | CPU s | × old |\n|---|---|---|---|---|"
        )
        old = None
        for label, (name, full) in variants.items():
            datasets, method, options = loaded[name]
            evaluate(method, datasets, **options, full=full)  # warm-up: the old pipeline decodes the test images here
            walls, cpus = [], []
            for _ in range(args.repeats):
                started, started_cpu = time.perf_counter(), time.process_time()
                evaluate(method, datasets, **options, full=full)
                walls.append(time.perf_counter() - started)
                cpus.append(time.process_time() - started_cpu)
            wall, cpu = statistics.median(walls), statistics.median(cpus)
            old = old or (wall, cpu)
            print(f"| {label} | {wall:.2f} | {old[0] / wall:.2f} | {cpu:.2f} | {old[1] / cpu:.2f} |", flush=True)


def embedding(args: argparse.Namespace) -> None:
    """CPU seconds to embed the test split per evaluation batch size, for each study method (fresh weights,
    BatchNorm statistics drawn away from the identity), and whether the embeddings equal those at the largest size."""
    from dmlstudy.run.data import load_datasets, place_on_device
    from dmlstudy.run.evaluation import embed
    from dmlstudy.run.model import build_model

    torch.set_num_threads(args.threads[0])
    sizes = sorted(args.eval_batch_sizes)
    print(
        f"\n| method ({args.dataset} test split, {args.threads[0]} thread) | "
        + " | ".join(f"{b} CPU s" for b in sizes)
        + " |"
    )
    print("|---" * (len(sizes) + 1) + "|")
    for method_name in args.methods:
        torch.manual_seed(0)
        config = TrainConfig(
            dataset=args.dataset, method=method_name, seed=0, test_classes=0, device="cpu", progress=False
        )
        datasets = place_on_device(load_datasets(config), torch.device("cpu"))
        method = build_model(config, datasets["train"].num_classes).eval()
        for module in method.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.normal_()
                module.running_var.uniform_(0.5, 2.0)
        reference = embed(method, datasets["query"], batch_size=sizes[-1])
        cells = []
        for size in sizes:
            seconds = []
            for _ in range(args.repeats):
                started = time.process_time()
                embedded = embed(method, datasets["query"], batch_size=size)
                seconds.append(time.process_time() - started)
            same = "identical" if np.array_equal(embedded, reference) else "differs"
            cells.append(f"{statistics.median(seconds):.2f} ({same})")
        print(f"| {method_name} | " + " | ".join(cells) + " |", flush=True)


def optimizer_step(args: argparse.Namespace) -> None:
    from dmlstudy.methods import build_method
    from dmlstudy.models import build_backbone

    torch.set_num_threads(args.threads[0])
    variants = {"foreach": {"foreach": True}, "fused": {"fused": True}}
    print(
        f"\n| method ({args.threads[0]} thread) | parameters (M) | "
        + " | ".join(f"{v} ms/step | {v} optimizer ms" for v in variants)
        + " |"
    )
    print("|---" * (2 + 2 * len(variants)) + "|")
    for method_name in args.methods:
        generator = torch.Generator().manual_seed(0)
        images = torch.randn(args.batch, 3, 64, 64, generator=generator)
        labels = torch.arange(args.batch // 4).repeat_interleave(4)
        built = {}
        for name, options in variants.items():
            torch.manual_seed(0)
            method = build_method(
                method_name, backbone=build_backbone("dml_convnet"), embedding_dim=128, num_classes=100
            )
            built[name] = method, torch.optim.AdamW(method.parameters(), lr=1e-3, **options)
        step_ms = {name: [] for name in variants}
        optimizer_ms = {name: [] for name in variants}
        for round_index in range(args.repeats + 1):
            for name, (method, optimizer) in built.items():
                started = time.perf_counter()
                loss, _ = method.loss(images, labels)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                stepped = time.perf_counter()
                optimizer.step()
                if round_index:
                    step_ms[name].append(1e3 * (time.perf_counter() - started))
                    optimizer_ms[name].append(1e3 * (time.perf_counter() - stepped))
        parameters = sum(p.numel() for p in built["fused"][0].parameters()) / 1e6
        cells = [f"{statistics.median(step_ms[v]):.1f} | {statistics.median(optimizer_ms[v]):.1f}" for v in variants]
        print(f"| {method_name} | {parameters:.2f} | " + " | ".join(cells) + " |", flush=True)


def quality(args: argparse.Namespace) -> None:
    print("| dataset | pipeline | R@1 per seed | mean ± sd | seconds |\n|---|---|---|---|---|")
    torch.set_num_threads(args.threads[-1])
    with tempfile.TemporaryDirectory() as runs:
        for dataset in args.datasets:
            for name in args.variants:
                options, values, started = VARIANTS[name], [], time.perf_counter()
                for seed in args.seeds:
                    config = TrainConfig(
                        study="quality",
                        run_name=f"{dataset}-{name}-{seed}",
                        runs_root=runs,
                        dataset=dataset,
                        method="ms",
                        epochs=6,
                        steps_per_epoch=0,
                        train_classes=0,
                        test_classes=0,
                        lr=0.004,
                        eval_every=3,
                        seed=seed,
                        device="cpu",
                        progress=False,
                        **options,
                    )
                    values.append(run(config).metrics["R@1"])
                    print(dataset, name, seed, round(values[-1], 4), flush=True)
                spread = statistics.stdev(values) if len(values) > 1 else 0.0
                print(
                    f"| {dataset} | {name} | {', '.join(f'{100 * v:.1f}' for v in values)} | {100 * statistics.mean(values):.1f} ± {100 * spread:.1f} | "
                    f"{time.perf_counter() - started:.0f} |",
                    flush=True,
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="synbirds")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps-per-epoch", type=int, default=0)
    parser.add_argument("--compile", action="store_true", help="also measure compile=True")
    parser.add_argument("--bf16", action="store_true", help="also measure autocast=bf16 (pays on CPUs with bf16 units)")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=["old", "new"], help="--quality's")
    parser.add_argument("--augment", action="store_true", help="only the batch-augmentation micro-benchmark")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--quality", action="store_true", help="only the R@1 check of --variants (6 epochs)")
    parser.add_argument("--evaluation", action="store_true", help="only the cost of one test evaluation")
    parser.add_argument("--embedding", action="store_true", help="only embedding time per evaluation batch size")
    parser.add_argument("--optimizer", action="store_true", help="only AdamW foreach against fused, per method")
    parser.add_argument("--eval-batch-sizes", type=int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--methods", nargs="+", default=["ms", "crt", "diml", "cross_attention", "dgcrl", "triplet"])
    parser.add_argument("--datasets", nargs="+", default=["synbirds", "glyphs"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    if args.augment:
        augmentation(args)
    elif args.quality:
        quality(args)
    elif args.evaluation:
        evaluation(args)
    elif args.embedding:
        embedding(args)
    elif args.optimizer:
        optimizer_step(args)
    else:
        speed(args)


if __name__ == "__main__":
    main()
