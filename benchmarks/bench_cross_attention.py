"""Training-step overhead of the cross-attention blocks (the paper, Sec. 4.4: +11 % per step at batch 128).

For each batch size, the MS baseline and the cross-attention method (same backbone, same initial backbone
weights, N blocks) are timed on the same random batch in ONE process, steps interleaved (baseline, method,
baseline, …) so that load from other processes hits both alike. A step is forward + loss + backward +
AdamW update, as in ``dmlstudy.run.train``. The table reports the median step time of each and their ratio.

Usage: ``python benchmarks/bench_cross_attention.py [--batches 32 64 128] [--repeats 15] [--backbone dml_convnet]
[--image-size 64] [--blocks 6] [--independent] [--threads 0]``
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import time

import torch

from dmlstudy.methods import build_method
from dmlstudy.models import build_backbone


def build(method: str, *, backbone: str, image_size: int, embedding_dim: int, **kwargs):
    torch.manual_seed(0)
    model = build_method(
        method,
        backbone=build_backbone(backbone, image_size=image_size),
        embedding_dim=embedding_dim,
        num_classes=100,
        **kwargs,
    )
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def step(model, optimizer, images: torch.Tensor, labels: torch.Tensor) -> float:
    """Seconds of one training step (forward, loss, backward, update)."""
    started = time.perf_counter()
    loss, _ = model.loss(images, labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if images.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - started


def measure(
    batch: int,
    *,
    backbone: str,
    image_size: int,
    blocks: int,
    independent: bool,
    repeats: int,
    warmup: int,
    device: str,
) -> dict:
    """Median step seconds of the baseline and of the method at one batch size, interleaved."""
    common = dict(backbone=backbone, image_size=image_size, embedding_dim=128)
    contenders = {
        "ms": build("ms", **common),
        "cross_attention": build("cross_attention", num_blocks=blocks, shared_blocks=not independent, **common),
    }
    for model, _ in contenders.values():
        model.to(device).train()
    generator = torch.Generator().manual_seed(batch)
    images = torch.randn(batch, 3, image_size, image_size, generator=generator).to(device)
    labels = torch.arange(batch // 4).repeat_interleave(4).to(device)  # P × 4 class-balanced
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for repeat in range(warmup + repeats):
        for name, (model, optimizer) in contenders.items():
            seconds = step(model, optimizer, images, labels)
            if repeat >= warmup:
                times[name].append(seconds)
    baseline, method = (statistics.median(times[name]) for name in ("ms", "cross_attention"))
    extra = sum(p.numel() for p in contenders["cross_attention"][0].blocks.parameters())
    return {
        "batch": batch,
        "ms_ms": 1000 * baseline,
        "ca_ms": 1000 * method,
        "ratio": method / baseline,
        "block_params": extra,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--backbone", default="dml_convnet")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--independent", action="store_true", help="independent blocks instead of one shared block")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"# cross-attention overhead, {datetime.date.today()}, {platform.processor() or platform.machine()}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}"
    )
    print(
        f"# backbone {args.backbone} at {args.image_size} px, d = 128, N = {args.blocks} "
        f"{'independent' if args.independent else 'shared'} blocks, median of {args.repeats} interleaved steps"
    )
    print("| batch | MS step (ms) | + cross-attention (ms) | ratio | block parameters |")
    print("|---:|---:|---:|---:|---:|")
    for batch in args.batches:
        row = measure(
            batch,
            backbone=args.backbone,
            image_size=args.image_size,
            blocks=args.blocks,
            independent=args.independent,
            repeats=args.repeats,
            warmup=args.warmup,
            device=args.device,
        )
        print(
            f"| {row['batch']} | {row['ms_ms']:.1f} | {row['ca_ms']:.1f} | {row['ratio']:.2f} | {row['block_params']:,} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
