"""The imagenet regime's training step for every row, with and without EfficientNet's ``conv_head``.

Run: ``.venv/bin/python benchmarks/bench_imagenet_rows.py [--batch 64] [--repeats 3]``. One thread. For each
row of the default comparison, the seconds of one training step (loss, backward, AdamW step) of the method on
:class:`dmlstudy.models.trunk_cache.StemCachedBackbone` fed a batch of stem activations at 128 px
(``192 × 4 × 4``): with ``conv_head`` (1,280 channels) and without (the last block's 320 channels, what the
regime trains). Cases are interleaved (each round times every row in both forms once); the median of the
rounds is printed, with the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from dmlstudy.methods import build_method
from dmlstudy.models.trunk_cache import StemCachedBackbone

ROWS = ("ms", "crt", "diml", "cross_attention", "dgcrl", "triplet", "lifted", "normsoftmax")
CLASSES = 421  # emoji's training classes outside the validation fold


def step_seconds(method, optimizer, activations, labels) -> float:
    started = time.perf_counter()
    loss, _ = method.loss(activations, labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64, help="images per step (16 classes × 4)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    activations = torch.randn(args.batch, 192, 4, 4)
    labels = torch.arange(args.batch // 4).repeat_interleave(4)
    cases = {}
    for conv_head in (True, False):
        for row in ROWS:
            backbone = StemCachedBackbone(pretrained=True, conv_head=conv_head, freeze_bn=True)
            method = build_method(row, backbone=backbone, embedding_dim=128, num_classes=CLASSES)
            optimizer = torch.optim.AdamW([p for p in method.parameters() if p.requires_grad], lr=1e-4)
            step_seconds(method, optimizer, activations, labels)  # warm-up
            cases[(row, conv_head)] = (method, optimizer, [])
    load_before = os.getloadavg()[0]
    for _ in range(args.repeats):
        for method, optimizer, times in cases.values():
            times.append(step_seconds(method, optimizer, activations, labels))
    load_after = os.getloadavg()[0]
    print(
        f"one thread, batch {args.batch}, median of {args.repeats}; load average {load_before:.1f} → {load_after:.1f}"
    )
    print("| row | s/step with conv_head (1,280 ch) | s/step without (320 ch) | ratio to MS without |")
    print("|---|---|---|---|")
    ms = statistics.median(cases[("ms", False)][2])
    for row in ROWS:
        with_head, without = (statistics.median(cases[(row, flag)][2]) for flag in (True, False))
        print(f"| {row} | {with_head:.3f} | {without:.3f} | {without / ms:.1f} |")


if __name__ == "__main__":
    main()
