"""EfficientNet-Lite0 on CPU: full fine-tuning against training only its tail on cached stem activations.

Run: ``.venv/bin/python benchmarks/bench_lite0.py [--image-size 128] [--batch 64] [--repeats 3]``. Measures,
in this one process and interleaved (each round times every case once, one thread then two), images/s of:

* ``full fine-tuning``: an MS training step (forward, loss, backward, AdamW step) through the whole
  ``dml_efficientnet_lite0`` (ImageNet weights, BatchNorm frozen as the pretrained regime has it);
* ``full inference``: its embedding of a batch (eval, no gradients), for reference;
* ``tail on cached stem``: the same MS step on :class:`dmlstudy.models.trunk_cache.StemCachedBackbone`,
  fed the float16 activations a cache would hold (``blocks[6:]``, ``conv_head``, ``bn2`` train);
* ``stem caching``: :func:`dmlstudy.models.trunk_cache.stem_activations` of a batch (eval, to float16).

Prints the median of the rounds per case and thread count, and the load average before and after (other
work on the machine slows every case alike within a round, not the ratios between them).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch

from dmlstudy.methods import build_method
from dmlstudy.models import build_backbone
from dmlstudy.models.trunk_cache import StemCachedBackbone, stem_activations

THREADS = (1, 2)


def seconds(step: Callable[[], None]) -> float:
    started = time.perf_counter()
    step()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    images = torch.randn(args.batch, 3, args.image_size, args.image_size)
    labels = torch.arange(args.batch // 4).repeat_interleave(4)

    full = build_method(
        "ms", backbone=build_backbone("dml_efficientnet_lite0", pretrained=True, freeze_bn=True), num_classes=16
    )
    tail = build_method("ms", backbone=StemCachedBackbone(pretrained=True, freeze_bn=True), num_classes=16)
    activations = stem_activations(tail.backbone, [images])  # float16, as a cache holds them
    optimizers = {
        id(method): torch.optim.AdamW([p for p in method.parameters() if p.requires_grad], lr=1e-4)
        for method in (full, tail)
    }

    def train_step(method, inputs) -> Callable[[], None]:
        def step() -> None:
            method.train()
            loss, _ = method.loss(inputs, labels)
            optimizers[id(method)].zero_grad()
            loss.backward()
            optimizers[id(method)].step()

        return step

    def inference_step() -> None:
        full.eval()
        with torch.no_grad():
            full(images)

    cases = {
        "full fine-tuning": train_step(full, images),
        "full inference": inference_step,
        "tail on cached stem": train_step(tail, activations),
        "stem caching": lambda: stem_activations(tail.backbone, [images]),
    }
    trainable = {
        "full fine-tuning": sum(p.numel() for p in full.backbone.parameters() if p.requires_grad),
        "tail on cached stem": sum(p.numel() for p in tail.backbone.parameters() if p.requires_grad),
    }
    load_before = os.getloadavg()
    timings: dict[tuple[str, int], list[float]] = {}
    for round_index in range(args.repeats + 1):  # round 0 warms up and is not counted
        for threads in THREADS:
            torch.set_num_threads(threads)
            for case, step in cases.items():
                elapsed = seconds(step)
                if round_index:
                    timings.setdefault((case, threads), []).append(elapsed)
    load_after = os.getloadavg()

    print(
        f"batch {args.batch}, {args.image_size} px, {args.repeats} rounds (median), "
        f"stem output {tuple(activations.shape[1:])} float16 = {activations[0].numel() * 2 / 1024:.1f} KiB/image; "
        f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after, {os.cpu_count()} cores"
    )
    print("| case | trainable backbone parameters | " + " | ".join(f"img/s, {t} thread(s)" for t in THREADS) + " |")
    print("|---|---|" + "---|" * len(THREADS))
    for case in cases:
        speeds = [args.batch / statistics.median(timings[case, threads]) for threads in THREADS]
        parameters = f"{trainable[case] / 1e6:.2f} M" if case in trainable else "–"
        print(f"| {case} | {parameters} | " + " | ".join(f"{speed:.0f}" for speed in speeds) + " |", flush=True)


if __name__ == "__main__":
    main()
