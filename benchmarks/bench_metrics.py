"""Benchmark of dmlstudy.metrics.retrieval_metrics against pytorch-metric-learning and plain torch.

Each (method, N) runs in a fresh Python subprocess, which generates the same seeded clustered
embeddings (SOP-like: classes of 2-9 items, d = 128), times the method alone and reports its peak
resident memory (``ru_maxrss``, so imports and the data are included; the baseline after imports and
data is reported too). Methods:

* ``ours``: ``retrieval_metrics`` (one chunked faiss IndexFlatIP search, k = max(8, max R_q)).
* ``pml``: ``AccuracyCalculator(k="max_bin_count")`` for P@1 / RP / MAP@R on L2-normalised input
  (its default FaissKNN, IndexFlatL2: float32 L2 distances may order near-ties (gaps ~1e-7)
  differently from inner products).
* ``pml_ip``: the same with ``FaissKNN(index_init_fn=faiss.IndexFlatIP)``, i.e. our neighbour ranking.
* ``torch_full``: one N × N matmul + ``topk`` (diagonal masked), metrics from the neighbour lists with
  ``retrieval_metrics_from_neighbors``; skipped when the N × N matrix alone would exceed ``--max-gb``.
* ``torch_chunked``: the same in chunks of 2048 queries.
* ``ours_geometry`` (extra): ``embedding_space_density`` + ``spectral_decay``.
* ``ours_nmi`` (extra, slow for large N): ``nmi``.

Usage: ``python benchmarks/bench_metrics.py [--sizes 10000 60502] [--methods ours pml ...]``
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
KS = (1, 2, 4, 8)
DEFAULT_METHODS = ("ours", "pml", "pml_ip", "torch_full", "torch_chunked", "ours_geometry")
COMPARED = ("P@1", "RP", "MAP@R")


def make_data(n: int, dim: int, *, seed: int, noise: float) -> tuple[np.ndarray, np.ndarray]:
    """Seeded Gaussian clusters with SOP-like class sizes (2-9 items), shuffled; float32 embeddings."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(2, 10, size=n // 2 + 1)
    n_classes = int(np.searchsorted(np.cumsum(sizes), n)) + 1
    labels = np.repeat(np.arange(n_classes), sizes[:n_classes])[:n]
    centers = rng.standard_normal((n_classes, dim), dtype=np.float32)
    x = centers[labels] + noise * rng.standard_normal((n, dim), dtype=np.float32)
    perm = rng.permutation(n)
    return np.ascontiguousarray(x[perm]), labels[perm]


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB


def _cpu_seconds() -> float:
    """User + system CPU time of this process (all threads): less sensitive to other load than wall time."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _torch_neighbors(x: np.ndarray, k: int, chunk: int | None) -> np.ndarray:
    """Top-k cosine neighbours by matmul + topk, self excluded by masking the diagonal."""
    import torch

    xt = torch.nn.functional.normalize(torch.from_numpy(x), dim=1)
    n = len(xt)
    step = n if chunk is None else chunk
    out = torch.empty((n, k), dtype=torch.int64)
    for start in range(0, n, step):
        stop = min(start + step, n)
        sims = xt[start:stop] @ xt.T  # chunk × N
        rows = torch.arange(stop - start)
        sims[rows, rows + start] = -float("inf")
        out[start:stop] = sims.topk(k, dim=1).indices
        del sims
    return out.numpy()


def run_method(method: str, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """The metrics computed by ``method`` (imports happen before the caller starts the clock)."""
    from dmlstudy import metrics as M

    if method == "ours":
        return M.retrieval_metrics(x, y, ks=KS)
    if method == "ours_geometry":
        return {"ESD": M.embedding_space_density(x, y), "rho": M.spectral_decay(x)}
    if method == "ours_nmi":
        return {"NMI": M.nmi(x, y)}
    if method in ("pml", "pml_ip"):
        import faiss
        import torch
        from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
        from pytorch_metric_learning.utils.inference import FaissKNN

        calc = AccuracyCalculator(
            include=("precision_at_1", "r_precision", "mean_average_precision_at_r"),
            k="max_bin_count",
            device=torch.device("cpu"),
            knn_func=FaissKNN(index_init_fn=faiss.IndexFlatIP) if method == "pml_ip" else None,
        )
        xt = torch.nn.functional.normalize(torch.from_numpy(x), dim=1)
        res = calc.get_accuracy(xt, torch.from_numpy(y))
        return {"P@1": res["precision_at_1"], "RP": res["r_precision"], "MAP@R": res["mean_average_precision_at_r"]}
    if method in ("torch_full", "torch_chunked"):
        k = max(max(KS), int(M.relevant_counts(y).max()))
        idx = _torch_neighbors(x, k, None if method == "torch_full" else 2048)
        return M.retrieval_metrics_from_neighbors(idx, y, ks=KS)
    raise ValueError(f"method: expected one of {DEFAULT_METHODS + ('ours_nmi',)}, got {method!r}")


def worker(method: str, n: int, dim: int, seed: int, noise: float, repeats: int) -> dict:
    """Run one method ``repeats`` times in this (fresh) process; return the best time, memory, results."""
    sys.path.insert(0, str(REPO))
    if method in ("pml", "pml_ip", "torch_full", "torch_chunked"):
        import torch  # noqa: F401  (import cost excluded from the timing, included in the RSS)
    if method in ("pml", "pml_ip"):
        import pytorch_metric_learning  # noqa: F401
    import faiss  # noqa: F401

    import dmlstudy.metrics  # noqa: F401

    x, y = make_data(n, dim, seed=seed, noise=noise)
    baseline = _peak_rss_mb()
    times, cpu_times = [], []
    for _ in range(repeats):
        cpu_start, start = _cpu_seconds(), time.perf_counter()
        results = run_method(method, x, y)
        times.append(time.perf_counter() - start)
        cpu_times.append(_cpu_seconds() - cpu_start)
    return {
        "method": method,
        "n": n,
        "seconds": min(times),
        "times": times,
        "cpu_seconds": min(cpu_times),
        "baseline_mb": baseline,
        "peak_mb": _peak_rss_mb(),
        "results": results,
    }


def run_in_subprocess(method: str, n: int, args: argparse.Namespace) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        method,
        "--sizes",
        str(n),
        "--dim",
        str(args.dim),
        "--seed",
        str(args.seed),
        "--noise",
        str(args.noise),
        "--repeats",
        str(args.repeats),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        return {"method": method, "n": n, "error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def agreement(row: dict, ours: dict | None) -> str:
    if "results" not in row or ours is None or "results" not in ours:
        return "-"
    keys = [k for k in row["results"] if k in ours["results"]]
    if not keys:
        return "n/a"
    diff = max(abs(row["results"][k] - ours["results"][k]) for k in keys)
    return f"{'yes' if diff <= 1e-6 else 'NO'} (max |Δ| {diff:.1e} on {', '.join(keys)})"


def format_table(rows: list[dict]) -> str:
    lines = [
        "| N | method | wall s, best (all runs) | ratio to ours | CPU s | peak RSS MB (baseline) | agrees with ours | metrics |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by_n: dict[int, dict] = {r["n"]: r for r in rows if r["method"] == "ours" and "seconds" in r}
    for r in rows:
        ours = by_n.get(r["n"])
        if "seconds" not in r:
            lines.append(
                f"| {r['n']} | {r['method']} | – | – | – | – | – | not run: {r.get('error', r.get('skipped'))} |"
            )
            continue
        comparable = ours is not None and r["method"] not in ("ours_geometry", "ours_nmi")
        ratio = f"{r['seconds'] / ours['seconds']:.2f}" if comparable else "-"
        shown = ", ".join(f"{k} {v:.4f}" for k, v in r["results"].items())
        lines.append(
            f"| {r['n']} | {r['method']} | {r['seconds']:.2f} ({', '.join(f'{t:.1f}' for t in r['times'])}) | {ratio} | {r['cpu_seconds']:.2f} | {r['peak_mb']:.0f} ({r['baseline_mb']:.0f}) "  # noqa: E501
            f"| {agreement(r, ours) if r['method'] != 'ours' else 'ref'} | {shown} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 60_502])
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--noise", type=float, default=1.5)
    parser.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS))
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per method (best is reported)")
    parser.add_argument("--max-gb", type=float, default=2.0, help="skip torch_full when N×N float32 exceeds this")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.sizes[0], args.dim, args.seed, args.noise, args.repeats)))
        return
    print(
        f"# {datetime.date.today()} {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f} at start; d={args.dim}, seed={args.seed}, noise={args.noise}"
    )
    rows = []
    for n in args.sizes:
        for method in args.methods:
            gb = n * n * 4 / 2**30
            if method == "torch_full" and gb > args.max_gb:
                rows.append(
                    {
                        "method": method,
                        "n": n,
                        "skipped": f"the N×N float32 matrix alone needs {gb:.1f} GB > {args.max_gb} GB",
                    }
                )
                continue
            rows.append(run_in_subprocess(method, n, args))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(f"# load average {os.getloadavg()[0]:.1f} at end")
    print(format_table(rows))


if __name__ == "__main__":
    main()
