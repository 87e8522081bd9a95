"""Candidate default backbones for the embedded study: feature-map grid and training/inference speed.

Run: ``.venv/bin/python benchmarks/bench_backbones.py [--image-size 64] [--batch 64]``. Prints one row per
backbone (all measured in this one process, side by side): feature map at the image size, parameters, and
images/s for a training step (MS baseline: forward, loss, backward, AdamW step) and for inference.
"""

from __future__ import annotations

import argparse
import time

import torch

from dmlstudy.methods import build_method
from dmlstudy.models import build_backbone

CANDIDATES = {
    "dml_convnet": {},
    "test_resnet (output_stride 16)": {"name": "test_resnet", "output_stride": 16},
    "test_vit": {"name": "test_vit"},
    "resnet10t (output_stride 16)": {"name": "resnet10t", "output_stride": 16},
    "resnet18": {"name": "resnet18"},
}


def images_per_second(step, batch: int, repeats: int) -> float:
    step()
    started = time.perf_counter()
    for _ in range(repeats):
        step()
    return batch * repeats / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    images = torch.randn(args.batch, 3, args.image_size, args.image_size)
    labels = torch.arange(args.batch // 4).repeat_interleave(4)
    print(f"threads {torch.get_num_threads()}, batch {args.batch}, {args.image_size} px")
    print("| backbone | feature map | parameters | train img/s | inference img/s |\n|---|---|---|---|---|")
    for label, options in CANDIDATES.items():
        options = dict(options)
        name = options.pop("name", label)
        backbone = build_backbone(name, image_size=args.image_size, **options)
        method = build_method("ms", backbone=backbone, num_classes=args.batch // 4)
        optimizer = torch.optim.AdamW(method.parameters(), lr=1e-3)
        grid = tuple(backbone(images[:1]).shape[1:])

        def train_step(method=method, optimizer=optimizer):
            loss, _ = method.loss(images, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        def inference_step(method=method):
            with torch.no_grad():
                method(images)

        method.train()
        train_speed = images_per_second(train_step, args.batch, args.repeats)
        method.eval()
        inference_speed = images_per_second(inference_step, args.batch, args.repeats)
        parameters = sum(p.numel() for p in method.parameters()) / 1e6
        print(
            f"| {label} | {grid[0]}×{grid[1]}×{grid[2]} | {parameters:.2f} M | {train_speed:.0f} | {inference_speed:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
