"""The CUDA measurements, side by side on one GPU machine.

Run on a machine with a GPU: ``python benchmarks/bench_gpu.py [--epochs 6] [--cpu-cores 2]``. Three parts:

* ``study run``: the study's MS run (dml_convnet, 64 px, SynBirds, full epochs) trained through
  ``dmlstudy.run.train.run`` on CUDA and on ``--cpu-cores`` cores of the same machine (the process's CPU affinity
  is narrowed to them and torch uses that many threads), whole-run wall time including data loading and
  evaluation; the ratio is the "≥ 15× over 2 CPU cores" target.
* ``resnet18 throughput``: training images/s of the MS baseline on resnet18 at ``--size`` px (random init),
  batch ``--batch``, in bfloat16 autocast, with and without ``channels_last`` and ``torch.compile``: the
  "≥ 3,000 images/s on an H100" target. Steady state: ``--warmup`` steps untimed, then ``--steps`` timed with
  a CUDA synchronise at both ends.
* ``runs per GPU``: k = 1, 2, 4 processes each training the study's MS run on the one GPU at the same time;
  the aggregate training images/s (k × images per run / wall time of the slowest) says whether sharing pays.
* ``methods`` (``--parts methods``): a 2-epoch SynBirds run of each headline method on CUDA, evaluated once,
  and ``profile`` (``--parts profile``): torch.profiler over a 1-epoch DIML-trained run, the operators with
  the most host time and the most device time — where a run that does not scale on the GPU spends its time.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import tempfile
import time

import torch

from dmlstudy.methods import build_method
from dmlstudy.models import build_backbone
from dmlstudy.run.data import load_datasets
from dmlstudy.run.train import TrainConfig, run


def study_config(device: str, runs_root: str, epochs: int, name: str, method: str = "ms") -> TrainConfig:
    return TrainConfig(
        study="bench-gpu",
        run_name=name,
        runs_root=runs_root,
        dataset="synbirds",
        method=method,
        epochs=epochs,
        steps_per_epoch=0,
        train_classes=0,
        test_classes=0,
        eval_every=3,
        device=device,
        progress=False,
        overwrite=True,
    )


def timed(config: TrainConfig) -> tuple[float, float]:
    started = time.perf_counter()
    result = run(config)
    return time.perf_counter() - started, float(result.metrics["R@1"])


def study_run(args: argparse.Namespace, runs_root: str) -> None:
    load_datasets(study_config("cpu", runs_root, args.epochs, "warm"))  # the tensor cache, built once
    cuda_seconds, cuda_r1 = timed(study_config("cuda", runs_root, args.epochs, "cuda"))
    cuda_again, _ = timed(study_config("cuda", runs_root, args.epochs, "cuda-again"))
    everything = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(sorted(everything)[: args.cpu_cores]))
    threads = torch.get_num_threads()
    torch.set_num_threads(args.cpu_cores)
    try:
        cpu_seconds, cpu_r1 = timed(study_config("cpu", runs_root, args.epochs, "cpu"))
    finally:
        os.sched_setaffinity(0, everything)
        torch.set_num_threads(threads)
    print(f"\n## study run: MS, dml_convnet 64 px, SynBirds, {args.epochs} full epochs, evaluated every 3")
    print("| device | wall s | R@1 |\n|---|---|---|")
    print(f"| CUDA (first run in the process) | {cuda_seconds:.1f} | {cuda_r1:.4f} |")
    print(f"| CUDA (second run) | {cuda_again:.1f} | – |")
    print(f"| CPU, {args.cpu_cores} cores | {cpu_seconds:.1f} | {cpu_r1:.4f} |")
    print(
        f"CUDA speed-up over {args.cpu_cores} CPU cores: {cpu_seconds / cuda_again:.1f}× (second CUDA run)", flush=True
    )


def resnet_throughput(args: argparse.Namespace) -> None:
    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    images = torch.randn(args.batch, 3, args.size, args.size, device=device)
    labels = torch.arange(args.batch // 4, device=device).repeat_interleave(4)
    print(f"\n## resnet18 training throughput, {args.size} px, batch {args.batch}, MS loss, AdamW")
    print("| variant | images/s |\n|---|---|")
    for channels_last in (False, True):
        for compiled in (False, True):
            for precision in (torch.bfloat16, None):
                torch.manual_seed(0)
                method = build_method(
                    "ms", backbone=build_backbone("resnet18", image_size=args.size), num_classes=args.batch // 4
                ).to(device)
                inputs = images
                if channels_last:
                    method.to(memory_format=torch.channels_last)
                    inputs = images.contiguous(memory_format=torch.channels_last)
                optimizer = torch.optim.AdamW(method.parameters(), lr=1e-4)

                def loss_of(x, y, method=method):
                    return method.loss(x, y)[0]

                step_loss = torch.compile(loss_of) if compiled else loss_of

                def step(inputs=inputs, optimizer=optimizer, step_loss=step_loss, precision=precision):
                    with torch.autocast("cuda", dtype=precision or torch.bfloat16, enabled=precision is not None):
                        loss = step_loss(inputs, labels)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()

                for _ in range(args.warmup):
                    step()
                torch.cuda.synchronize()
                started = time.perf_counter()
                for _ in range(args.steps):
                    step()
                torch.cuda.synchronize()
                speed = args.batch * args.steps / (time.perf_counter() - started)
                name = (
                    f"{'bf16' if precision else 'fp32'}{', channels_last' if channels_last else ''}"
                    f"{', compiled' if compiled else ''}"
                )
                print(f"| {name} | {speed:.0f} |", flush=True)


def runs_per_gpu(args: argparse.Namespace, runs_root: str) -> None:
    train_images = len(load_datasets(study_config("cpu", runs_root, 1, "count"))["train"])
    print(f"\n## runs sharing one GPU: MS study runs, {args.share_epochs} epochs each")
    print("| runs at once | wall s | aggregate training images/s | × k = 1 |\n|---|---|---|---|")
    base = None
    for k in (1, 2, 4):
        code = (
            "import sys; from dmlstudy.run.train import TrainConfig, run; "
            "run(TrainConfig(study='bench-gpu', run_name=sys.argv[1], runs_root=sys.argv[2], dataset='synbirds', "
            f"method='ms', epochs={args.share_epochs}, steps_per_epoch=0, train_classes=0, test_classes=0, "
            f"eval_every={args.share_epochs}, device='cuda', progress=False, overwrite=True, seed=int(sys.argv[3])))"
        )
        threads = str(max(1, (os.cpu_count() or 2) // k))
        env = {**os.environ, "OMP_NUM_THREADS": threads}
        started = time.perf_counter()
        processes = [
            subprocess.Popen([sys.executable, "-c", code, f"share{k}-{i}", runs_root, str(i)], env=env)
            for i in range(k)
        ]
        if any(process.wait() for process in processes):
            raise RuntimeError(f"a shared-GPU run failed (k = {k})")
        wall = time.perf_counter() - started
        speed = k * args.share_epochs * train_images / wall
        base = base or speed
        print(f"| {k} | {wall:.1f} | {speed:.0f} | {speed / base:.2f} |", flush=True)


def per_method(args: argparse.Namespace, runs_root: str) -> None:
    run(study_config("cuda", runs_root, 1, "warm-methods"))
    print("\n## headline methods on CUDA: SynBirds, 2 full epochs, evaluated once")
    print("| method | wall s | R@1 |\n|---|---|---|")
    for method in ("ms", "crt", "diml", "cross_attention", "dgcrl"):
        seconds, r1 = timed(dataclasses.replace(study_config("cuda", runs_root, 2, method, method), eval_every=2))
        print(f"| {method} | {seconds:.1f} | {r1:.4f} |", flush=True)


def profile_diml(args: argparse.Namespace, runs_root: str) -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        run(dataclasses.replace(study_config("cuda", runs_root, 1, "diml-profile", "diml"), eval_every=1))
    print("\n## profile: DIML-trained MS, SynBirds, 1 epoch and its evaluation, on CUDA")
    for key in ("self_cpu_time_total", "self_cuda_time_total"):
        print(profiler.key_averages().table(sort_by=key, row_limit=12, max_name_column_width=50), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--cpu-cores", type=int, default=2)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--share-epochs", type=int, default=10)
    parser.add_argument(
        "--parts",
        nargs="+",
        default=["study", "resnet", "share"],
        choices=["study", "resnet", "share", "methods", "profile"],
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_gpu.py measures CUDA paths: no CUDA device here")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {os.cpu_count()} CPU cores")
    with tempfile.TemporaryDirectory() as runs_root:
        if "study" in args.parts:
            study_run(args, runs_root)
        if "resnet" in args.parts:
            resnet_throughput(args)
        if "share" in args.parts:
            runs_per_gpu(args, runs_root)
        if "methods" in args.parts:
            per_method(args, runs_root)
        if "profile" in args.parts:
            profile_diml(args, runs_root)


if __name__ == "__main__":
    main()
