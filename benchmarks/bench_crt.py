"""Overhead of CRT: training-step time of +CRT against the MS baseline on the same backbone and batch.

One process builds every variant on the same backbone architecture (same seed), then times full training
steps (forward, loss, backward, AdamW step) on one fixed class-balanced batch of random images,
*interleaved*: each round runs one step of every variant in turn, so load from other processes falls on
all variants alike. Reported per variant: median wall time and median CPU time (user + system, all threads)
per step over the rounds (the first round is warm-up and dropped), their ratios to ``ms``, and the parameter
count. Variants: ``ms`` (pooled features → FC → MS), ``crt`` (shared bank, the paper's K = 64, D = 1024),
``crt-unshared`` (two banks), ``crt-K16`` (K1 = K2 = 16), ``crt-D256`` (D = 256), ``−CRT`` (``use_crt=False``).

On a shared machine wall times are inflated by other processes and, with several threads, CPU times by
threads that spin while waiting; ``--threads 1`` gives CPU times close to an idle core's (the most
trustworthy ratios there).

Usage: ``python benchmarks/bench_crt.py [--backbone dml_convnet] [--image-size 64] [--batch 16 4] [--rounds 12] [--threads 1]``
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import resource
import statistics
import time

import torch

from dmlstudy.methods import build_method
from dmlstudy.models import build_backbone

VARIANTS: dict[str, tuple[str, dict]] = {
    "ms": ("ms", {}),
    "crt": ("crt", {}),
    "crt-unshared": ("crt", {"shared": False}),
    "crt-K16": ("crt", {"K1": 16, "K2": 16}),
    "crt-D256": ("crt", {"high_dim": 256}),
    "−CRT (pooled heads)": ("crt", {"use_crt": False}),
}


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def build(name: str, kwargs: dict, *, backbone: str, image_size: int, output_stride: int | None, device: torch.device):
    """The method and its AdamW optimizer, seeded identically for every variant."""
    torch.manual_seed(0)
    options = {"output_stride": output_stride} if output_stride else {}
    method = build_method(
        name, backbone=build_backbone(backbone, image_size=image_size, **options), num_classes=100, **kwargs
    ).to(device)
    return method, torch.optim.AdamW(method.parameters(), lr=1e-3, weight_decay=1e-4)


def step(method, optimizer, images: torch.Tensor, labels: torch.Tensor) -> None:
    loss, _ = method.loss(images, labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if images.is_cuda:
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backbone", default="dml_convnet")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--output-stride", type=int, default=0, help="0: the backbone's own")
    parser.add_argument("--batch", type=int, nargs=2, default=[16, 4], metavar=("P", "M"))
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch intra-op threads; 0: torch's default. With 1 thread the CPU "
        "time of a step is close to its time on an idle core even when the machine is shared",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    if "ms" not in args.variants:
        parser.error("--variants must include ms (the reference of the ratios)")
    device = torch.device(args.device)
    classes, per_class = args.batch
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(classes * per_class, 3, args.image_size, args.image_size, generator=generator).to(device)
    labels = torch.arange(classes).repeat_interleave(per_class).to(device)
    models = {
        v: build(
            *VARIANTS[v],
            backbone=args.backbone,
            image_size=args.image_size,
            output_stride=args.output_stride or None,
            device=device,
        )
        for v in args.variants
    }
    wall: dict[str, list[float]] = {v: [] for v in models}
    cpu: dict[str, list[float]] = {v: [] for v in models}
    for round_index in range(args.rounds + 1):
        for variant, (method, optimizer) in models.items():
            started, cpu_started = time.perf_counter(), _cpu_seconds()
            step(method, optimizer, images, labels)
            if round_index:  # round 0 is warm-up
                wall[variant].append(time.perf_counter() - started)
                cpu[variant].append(_cpu_seconds() - cpu_started)

    base_wall, base_cpu = statistics.median(wall["ms"]), statistics.median(cpu["ms"])
    print(
        f"# CRT training-step overhead — {datetime.date.today()}, {platform.node()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, device {device}, load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"backbone {args.backbone}, {args.image_size} px, batch {classes}×{per_class}, {args.rounds} timed rounds (interleaved)\n"
    )
    print("| variant | params (M) | wall ms/step | × ms | CPU ms/step | × ms |")
    print("|---|---|---|---|---|---|")
    for variant, (method, _) in models.items():
        w, c = statistics.median(wall[variant]), statistics.median(cpu[variant])
        params = sum(p.numel() for p in method.parameters()) / 1e6
        print(
            f"| {variant} | {params:.2f} | {1000 * w:.0f} | {w / base_wall:.2f} | {1000 * c:.0f} | {c / base_cpu:.2f} |"
        )


if __name__ == "__main__":
    main()
