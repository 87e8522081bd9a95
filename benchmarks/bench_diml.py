"""Benchmark of DIML's re-ranking and training step.

1. Re-ranking throughput (queries/s) of the batched structural similarity
   (:func:`dmlstudy.structural.transport.candidate_structural_similarity`: a chunk of queries × all their K cosine
   candidates per Sinkhorn batch, per-pair stopping) against a straightforward per-pair loop of the same
   algorithm (same float32 operations and stopping rule, one 16 × 16 problem at a time), in torch and in
   numpy. Random L2-normalised embeddings (Q queries searched against themselves, K = 100 candidates from
   faiss, G = 4, d = 128). The loops run on a subset of queries and are extrapolated; the outputs of all
   three are compared on that subset.
2. Training-step overhead: one optimizer step (forward, loss, backward, AdamW) of DIML-MS against the plain
   MS baseline, same backbone, batch and images, alternated in one process.
3. ``--run-epsilon E``: a real DIML-MS training run on SynBirds (all training classes, ``--run-steps`` steps,
   one evaluation on 16 test classes) at ε = E, with the time spent in the transport solver (``_transport``)
   measured. Small ε (the tuned SynBirds value is 0.021) puts Sinkhorn in the log domain. To compare two
   versions of the solver, run this file from a checkout of each (copied into the older one), alternately.

Usage: ``python benchmarks/bench_diml.py [--queries 5000] [--loop-queries 40] [--threads 1]``;
``python benchmarks/bench_diml.py --skip-rerank --skip-training --run-epsilon 0.021 --threads 1``
Prints a markdown table (copy it to ``benchmarks/results_diml.md``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("KMP_DUPLICATE_LIB_OK", "TRUE")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from dmlstudy import metrics  # noqa: E402
from dmlstudy.methods import build_method  # noqa: E402
from dmlstudy.models import build_backbone  # noqa: E402
from dmlstudy.run import train
from dmlstudy.structural import transport
from dmlstudy.structural.transport import TransportOptions, candidate_structural_similarity  # noqa: E402

TINY = torch.finfo(torch.float32).tiny


def random_grids(n: int, *, cells: int, dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Local embeddings sharing a per-image direction (cross-correlation marginals mostly positive), and
    globals = normalised cell means."""
    generator = torch.Generator().manual_seed(seed)
    shared = torch.randn(n, 1, dim, generator=generator)
    local = F.normalize(shared + torch.randn(n, cells, dim, generator=generator), dim=-1)
    return F.normalize(local.mean(dim=1), dim=-1), local


def _uniform_if_empty(weights, xp):
    total = weights.sum()
    return weights / total if total > 1e-12 else xp.full_like(weights, 1.0 / len(weights))


def torch_loop(global_, local, candidates, options: TransportOptions) -> np.ndarray:
    """The same algorithm one pair at a time in torch (float32): S, marginals, Sinkhorn, Σ T ⊙ S."""
    out = np.empty(candidates.shape, dtype=np.float32)
    for q in range(len(candidates)):
        for k, c in enumerate(candidates[q]):
            similarity = local[q] @ local[c].T
            mu = _uniform_if_empty(F.relu(local[q] @ global_[c]), torch)
            nu = _uniform_if_empty(F.relu(local[c] @ global_[q]), torch)
            kernel = torch.exp(-(1 - similarity) / options.epsilon)
            a, b = torch.ones_like(mu), torch.ones_like(nu)
            for step in range(options.max_iterations):
                kernel_b = kernel @ b
                if step > 0 and float((a * kernel_b - mu).abs().sum()) <= options.tolerance:
                    break
                a = mu / kernel_b.clamp_min(TINY)
                b = nu / (kernel.T @ a).clamp_min(TINY)
            out[q, k] = float((a[:, None] * kernel * b[None, :] * similarity).sum())
    return out


def numpy_loop(global_, local, candidates, options: TransportOptions) -> np.ndarray:
    """The same per-pair loop in numpy float32 (lower per-operation overhead than torch on tiny arrays)."""
    global_, local = global_.numpy(), local.numpy()
    tiny = np.float32(TINY)
    out = np.empty(candidates.shape, dtype=np.float32)
    for q in range(len(candidates)):
        for k, c in enumerate(candidates[q]):
            similarity = local[q] @ local[c].T
            mu = _uniform_if_empty(np.maximum(local[q] @ global_[c], 0), np)
            nu = _uniform_if_empty(np.maximum(local[c] @ global_[q], 0), np)
            kernel = np.exp(-(1 - similarity) / np.float32(options.epsilon))
            a, b = np.ones_like(mu), np.ones_like(nu)
            for step in range(options.max_iterations):
                kernel_b = kernel @ b
                if step > 0 and np.abs(a * kernel_b - mu).sum() <= options.tolerance:
                    break
                a = mu / np.maximum(kernel_b, tiny)
                b = nu / np.maximum(kernel.T @ a, tiny)
            out[q, k] = (a[:, None] * kernel * b[None, :] * similarity).sum()
    return out


def bench_rerank(args) -> list[dict]:
    options = TransportOptions()
    global_, local = random_grids(args.queries, cells=args.grid * args.grid, dim=args.dim, seed=0)
    started = time.perf_counter()
    candidates, _ = metrics.nearest_neighbors(global_, k=args.top_k)
    search_seconds = time.perf_counter() - started
    started = time.perf_counter()
    batched = candidate_structural_similarity(
        global_, local, global_, local, candidates, options=options, query_chunk=args.query_chunk
    )
    batched_seconds = time.perf_counter() - started
    subset = candidates[: args.loop_queries]
    started = time.perf_counter()
    looped_torch = torch_loop(global_, local, subset, options)
    torch_seconds = (time.perf_counter() - started) * args.queries / args.loop_queries
    started = time.perf_counter()
    looped_numpy = numpy_loop(global_, local, subset, options)
    numpy_seconds = (time.perf_counter() - started) * args.queries / args.loop_queries
    rows = [
        {
            "implementation": f"batched (chunks of {args.query_chunk or 'auto'} queries × K)",
            "seconds": batched_seconds,
            "measured on": f"{args.queries} queries",
            "max |Δ| vs batched": 0.0,
        },
        {
            "implementation": "per-pair loop, torch",
            "seconds": torch_seconds,
            "measured on": f"{args.loop_queries} queries, extrapolated",
            "max |Δ| vs batched": float(np.abs(looped_torch - batched[: args.loop_queries]).max()),
        },
        {
            "implementation": "per-pair loop, numpy",
            "seconds": numpy_seconds,
            "measured on": f"{args.loop_queries} queries, extrapolated",
            "max |Δ| vs batched": float(np.abs(looped_numpy - batched[: args.loop_queries]).max()),
        },
    ]
    for row in rows:
        row["queries/s"] = args.queries / row["seconds"]
        row["speed-up of batched"] = row["seconds"] / batched_seconds
    print(f"faiss top-{args.top_k} search of {args.queries} queries: {search_seconds:.2f} s (not included above)")
    return rows


def bench_training(args) -> list[dict]:
    torch.manual_seed(0)
    images = torch.randn(args.batch_classes * args.batch_samples, 3, 64, 64)
    labels = torch.arange(args.batch_classes).repeat_interleave(args.batch_samples)
    methods = {
        name: build_method(name, backbone=build_backbone("dml_convnet"), embedding_dim=args.dim, num_classes=100)
        for name in ("ms", "diml")
    }
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-4) for name, m in methods.items()}
    times: dict[str, list[float]] = {name: [] for name in methods}
    iterations: list[float] = []
    for step in range(args.train_steps + 2):
        for name, method in methods.items():
            method.train()
            started = time.perf_counter()
            loss, parts = method.loss(images, labels)
            optimizers[name].zero_grad()
            loss.backward()
            optimizers[name].step()
            if step >= 2:  # warm-up
                times[name].append(time.perf_counter() - started)
                if name == "diml":
                    iterations.append(parts["sinkhorn_iterations"])
    base = float(np.median(times["ms"]))
    print(f"DIML mean Sinkhorn iterations per pair: {np.mean(iterations):.1f}")
    return [
        {"method": name, "seconds/step (median)": float(np.median(t)), "relative": float(np.median(t)) / base}
        for name, t in times.items()
    ]


def bench_small_epsilon_run(args) -> list[dict]:
    solver = transport._transport
    spent = {"seconds": 0.0, "calls": 0}
    iterations: list[float] = []

    def timed(*positional, **keywords):
        started = time.perf_counter()
        plan, pair_iterations = solver(*positional, **keywords)
        spent["seconds"] += time.perf_counter() - started
        spent["calls"] += 1
        iterations.append(float(pair_iterations.float().mean()))
        return plan, pair_iterations

    config = train.TrainConfig(
        study="bench_diml",
        runs_root=args.runs_root,
        dataset="synbirds",
        method="diml",
        method_kwargs={"epsilon": args.run_epsilon},
        epochs=1,
        steps_per_epoch=args.run_steps,
        train_classes=0,
        test_classes=16,
        final_test=False,
        overwrite=True,
        num_workers=0,
    )
    transport._transport = timed
    try:
        started = time.perf_counter()
        train.run(config)
        total = time.perf_counter() - started
    finally:
        transport._transport = solver
    return [
        {
            "ε": args.run_epsilon,
            "steps": args.run_steps,
            "run (s)": total,
            "transport (s)": spent["seconds"],
            "transport calls": spent["calls"],
            "mean Sinkhorn iterations": float(np.mean(iterations)),
        }
    ]


def markdown(rows: list[dict]) -> str:
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        lines.append("| " + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in row.values()) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queries", type=int, default=5000)
    parser.add_argument("--loop-queries", type=int, default=40)
    parser.add_argument("--top-k", type=int, default=100)
    parser.add_argument("--grid", type=int, default=4)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--query-chunk", type=int, default=None)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--train-steps", type=int, default=10)
    parser.add_argument("--batch-classes", type=int, default=16)
    parser.add_argument("--batch-samples", type=int, default=4)
    parser.add_argument("--skip-training", action="store_true")
    parser.add_argument("--skip-rerank", action="store_true")
    parser.add_argument("--run-epsilon", type=float, default=0.0, help="0: no training run")
    parser.add_argument("--run-steps", type=int, default=30)
    parser.add_argument("--runs-root", default=str(Path(__file__).resolve().parents[1] / "runs"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"# DIML benchmark, {datetime.date.today()}, {platform.processor() or platform.machine()}, torch {torch.__version__}, {args.threads} thread(s)"
    )
    if not args.skip_rerank:
        tolerance = TransportOptions().tolerance
        print(
            f"\n## Re-ranking: {args.queries} queries, K = {args.top_k}, G = {args.grid}, d = {args.dim}, ε = 0.05, "
            f"tolerance {tolerance:g}\n"
        )
        print(markdown(bench_rerank(args)))
    if not args.skip_training:
        print(
            f"\n## Training step: batch {args.batch_classes}×{args.batch_samples}, 64 px, dml_convnet, d = {args.dim}\n"
        )
        print(markdown(bench_training(args)))
    if args.run_epsilon > 0:
        print(f"\n## DIML-MS training run on SynBirds, ε = {args.run_epsilon}, {args.run_steps} steps\n")
        print(markdown(bench_small_epsilon_run(args)))


if __name__ == "__main__":
    main()
