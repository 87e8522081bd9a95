"""Seconds per training step (and per epoch) of each loss of the DGCRL study, measured side by side.

Two measurements, each interleaved over the losses (alternating order each round, one warm-up step each,
median over rounds) in one process, so a shared machine slows every loss alike:

* **full step**: forward through the backbone, loss, backward, AdamW step, on one random batch of the
  protocol's shape (:func:`dmlstudy.experiments.kit.step_seconds`: each model and optimizer built as its run builds them); × the steps of one full pass over
  SynBirds' training set gives seconds per epoch;
* **loss only**: the loss and its backward on fixed ``B × d`` features (what the loss itself costs: the
  part of the step in which the losses differ).

Losses: ``ms`` (baseline head), ``softmax`` (no N-S), ``dgcrl`` (``paper`` hook), ``dgcrl-decor=code``,
``dgcrl-decor=none``, ``gcrl`` (Eq. 2), ``triplet-ns``, ``lifted-ns`` (pair losses on DGCRL's head).

On a machine shared with other jobs, ``--threads 1 --clock cpu`` (CPU seconds of one thread) is far steadier
than wall time; on an idle machine wall time with the default threads is what a user waits.

Usage: ``python benchmarks/bench_dgcrl.py [--rounds 10] [--classes 100] [--steps-per-epoch 62] [--threads 1 --clock cpu]``
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform

import numpy as np
import torch

from dmlstudy.experiments import ablations, kit
from dmlstudy.experiments.papers import dgcrl
from dmlstudy.methods import build_method
from dmlstudy.methods.dgcrl import DGCRL, normalize_scale
from dmlstudy.models import build_backbone
from dmlstudy.run.protocol import ProtocolConfig

VARIANTS = ("ms", "softmax", "dgcrl", "dgcrl-decor=code", "dgcrl-decor=none", "gcrl", "triplet-ns", "lifted-ns")


def variant_specs() -> dict[str, dict]:
    """The run specs of :data:`VARIANTS`, as the declaration ``papers/dgcrl.yaml`` writes them."""
    config = dgcrl.DGCRLStudy(losses=["gcrl", "triplet-ns", "lifted-ns"], decorrelations=["code", "none"])
    specs = {}
    for table in ("main", "losses", "decorrelation"):
        specs.update(ablations.grid(ablations.table_rows(dgcrl.DECLARED, table, config)))
    return {name: specs[name] for name in VARIANTS}


def loss_only_seconds(
    protocol: ProtocolConfig, specs: dict[str, dict], *, num_classes: int, rounds: int, clock: str = "wall"
) -> dict[str, float]:
    """Median seconds of loss + backward on fixed features (no backbone), interleaved over the variants."""
    now = kit.CLOCKS[clock]
    torch.manual_seed(0)
    batch = protocol.classes_per_batch * protocol.samples_per_class
    labels = torch.arange(protocol.classes_per_batch).repeat_interleave(protocol.samples_per_class) % num_classes
    features = torch.randn(batch, protocol.embedding_dim)
    heads = {}
    for name, spec in specs.items():
        method = build_method(
            spec["method"],
            backbone=build_backbone(protocol.backbone),
            embedding_dim=protocol.embedding_dim,
            num_classes=num_classes,
            **dict(spec.get("method_kwargs") or {}),
        )
        heads[name] = method
    timings: dict[str, list[float]] = {name: [] for name in specs}
    for round_index in range(rounds + 1):
        order = list(specs) if round_index % 2 == 0 else list(reversed(list(specs)))
        for name in order:
            method = heads[name]
            x = features.clone().requires_grad_(True)
            started = now()
            loss = _loss_on_features(method, x, labels)
            loss.backward()
            if round_index:
                timings[name].append(now() - started)
    return {name: float(np.median(values)) for name, values in timings.items()}


def _loss_on_features(method, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The method's loss on given features, bypassing the backbone (same code paths as ``method.loss``)."""
    if isinstance(method, DGCRL):
        original = method.scaled_features
        method.scaled_features = lambda images: (
            normalize_scale(features, alpha=method.alpha) if method.normalize_scale else features
        )
        try:
            return method.loss(torch.empty(0), labels)[0]
        finally:
            method.scaled_features = original
    return method.criterion(torch.nn.functional.normalize(features, dim=1), labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--classes", type=int, default=100, help="training classes (centres): SynBirds has 100")
    parser.add_argument(
        "--steps-per-epoch", type=int, default=62, help="one full pass over SynBirds' 4000 training images at batch 64"
    )
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument(
        "--clock",
        choices=sorted(kit.CLOCKS),
        default="wall",
        help="wall time, or this process's CPU time (steadier on a shared machine; use with --threads 1)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    protocol = ProtocolConfig()
    specs = variant_specs()
    full = kit.step_seconds(protocol, specs, num_classes=args.classes, rounds=args.rounds, clock=args.clock)
    loss_only = loss_only_seconds(protocol, specs, num_classes=args.classes, rounds=args.rounds, clock=args.clock)
    reference = full["dgcrl"]
    print(
        f"# bench_dgcrl — {datetime.date.today()} — {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, {torch.get_num_threads()} threads"  # noqa: E501
    )
    print(
        f"# batch {protocol.classes_per_batch}×{protocol.samples_per_class} at {protocol.image_size} px, {protocol.backbone}, d = {protocol.embedding_dim}, "
        f"{args.classes} classes, {args.rounds} rounds (median), {args.steps_per_epoch} steps per epoch, {args.clock} clock"
    )
    print("| loss | full step (ms) | s / epoch | × dgcrl | loss + backward only (ms) |")
    print("|---|---:|---:|---:|---:|")
    for name in specs:
        print(
            f"| {name} | {1000 * full[name]:.1f} | {full[name] * args.steps_per_epoch:.2f} | {full[name] / reference:.2f} | {1000 * loss_only[name]:.2f} |"
        )


if __name__ == "__main__":
    main()
