"""Benchmark of large-gallery evaluation: exact vs approximate (IVF, HNSW) neighbour search, and the cost of a
full ``evaluate`` at the SOP and In-Shop test sizes.

Part 1, ``ann`` (per gallery size N): seeded synthetic clustered embeddings, d = 128, N / 10 classes of exactly
10 gallery items each, plus ``--queries`` separate query items drawn from random classes (query → gallery
mode, so R_q = 10 for every query). Two generators (``--data``):

* ``structured`` (default), closer to trained embeddings: every vector lives in a space whose coordinate
  j has scale (1 + j)^-1/2 (a decaying spectrum; participation ratio ≈ 18 of 128 dimensions), classes are
  grouped into super-classes of 100 (super-class centre ~ N(0, S²), class centre = super-class centre +
  0.7 · N(0, S²), item = class centre + 0.8 · N(0, S²), S = diag(scale)).
* ``isotropic`` (worst case for partition/graph indexes): standard Gaussian class centres and isotropic
  Gaussian noise of σ = 1.4 per coordinate, so the neighbourhoods live in all 128 dimensions.

Both are tuned to an exact R@1 of ≈ 0.86 at N = 100k. For each index
(``exact`` = faiss ``IndexFlatIP``; ``ivf`` = ``IndexIVFFlat`` with the library's default nlist and several
nprobe; ``hnsw`` = ``IndexHNSWFlat`` with the library defaults M = 32, efConstruction = 40, several efSearch) it reports the build time
(IVF: k-means training + adding; HNSW: graph construction), the search time of all queries at k = 10, the
neighbour recall@10 (share of the exact top-10 that the index returned), the retrieval metrics computed from
its neighbour lists (R@1, R@10, MAP@R) and their absolute error against the exact search.

Part 2, ``evaluate``: the parts of ``dmlstudy.metrics.evaluate`` on a synthetic set of SOP's test size
(60,502 items in ≈ 11,000 classes of 2–9 items, all vs all, K = 1, 10, 100, 1000) and of In-Shop's (14,218
queries × 12,612 gallery items, classes of 2–12 items folded onto 3,985 ids), timing the retrieval metrics,
NMI (faiss k-means, chosen automatically at these sizes) and ESD/ρ separately.

Every (part, size) runs in a fresh subprocess, so ``ru_maxrss`` is that configuration's peak memory.

Usage: ``python benchmarks/bench_ann.py [--sizes 100000 1000000] [--queries 2000] [--data structured isotropic]
[--parts ann evaluate] [--out FILE]`` (``--out`` writes the bare tables).
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
DIM = 128
K = 10
CLASS_SIZE = 10
NOISE = 1.4
IVF_NPROBES = (8, 32, 128)
HNSW_EF_SEARCH = (64, 128, 256)


def make_structured(
    n_gallery: int,
    n_queries: int,
    *,
    seed: int,
    dim: int = DIM,
    noise: float = 0.8,
    spread: float = 0.7,
    per_super: int = 100,
):
    """Gallery of n_gallery / CLASS_SIZE classes × CLASS_SIZE items and n_queries extra items of random classes;
    hierarchical classes in a space with a decaying spectrum (see the module docstring)."""
    rng = np.random.default_rng(seed)
    scale = (1.0 + np.arange(dim, dtype=np.float32)) ** -0.5
    n_classes = n_gallery // CLASS_SIZE
    n_super = max(1, n_classes // per_super)
    supers = rng.standard_normal((n_super, dim), dtype=np.float32) * scale
    centres = (
        supers[rng.integers(0, n_super, n_classes)]
        + spread * rng.standard_normal((n_classes, dim), dtype=np.float32) * scale
    )
    gallery_labels = np.repeat(np.arange(n_classes), CLASS_SIZE)
    gallery = centres[gallery_labels]
    gallery += noise * rng.standard_normal(gallery.shape, dtype=np.float32) * scale
    query_labels = rng.integers(0, n_classes, size=n_queries)
    queries = centres[query_labels] + noise * rng.standard_normal((n_queries, dim), dtype=np.float32) * scale
    return queries, query_labels, gallery, gallery_labels


def make_isotropic(n_gallery: int, n_queries: int, *, seed: int, dim: int = DIM, noise: float = NOISE):
    """Gallery of n_gallery / CLASS_SIZE classes × CLASS_SIZE items and n_queries extra items of random classes;
    standard Gaussian centres, isotropic noise."""
    rng = np.random.default_rng(seed)
    n_classes = n_gallery // CLASS_SIZE
    centres = rng.standard_normal((n_classes, dim), dtype=np.float32)
    gallery_labels = np.repeat(np.arange(n_classes), CLASS_SIZE)
    gallery = centres[gallery_labels]
    gallery += noise * rng.standard_normal(gallery.shape, dtype=np.float32)
    query_labels = rng.integers(0, n_classes, size=n_queries)
    queries = centres[query_labels] + noise * rng.standard_normal((n_queries, dim), dtype=np.float32)
    return queries, query_labels, gallery, gallery_labels


def make_sop_like(n: int, *, seed: int, sizes: tuple[int, int] = (2, 12), noise: float = 1.5, dim: int = DIM):
    """n items in classes of SOP-like sizes (uniform in ``sizes``), shuffled."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(sizes[0], sizes[1] + 1, size=n // sizes[0] + 1)
    n_classes = int(np.searchsorted(np.cumsum(counts), n)) + 1
    labels = np.repeat(np.arange(n_classes), counts[:n_classes])[:n]
    centres = rng.standard_normal((n_classes, dim), dtype=np.float32)
    x = centres[labels] + noise * rng.standard_normal((n, dim), dtype=np.float32)
    order = rng.permutation(n)
    return np.ascontiguousarray(x[order]), labels[order]


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _timed(function, *args, **kwargs):
    started = time.perf_counter()
    value = function(*args, **kwargs)
    return value, time.perf_counter() - started


GENERATORS = {"structured": make_structured, "isotropic": make_isotropic}


def worker_ann(n_gallery: int, n_queries: int, seed: int, data: str) -> list[dict]:
    """Part 1 for one gallery size: one row per (index, search parameter)."""
    from dmlstudy import metrics as M

    queries, query_labels, gallery, gallery_labels = GENERATORS[data](n_gallery, n_queries, seed=seed)
    configs = [("exact", {}, {})]
    configs += [("ivf", {}, {"nprobe": p}) for p in IVF_NPROBES]
    configs += [("hnsw", {}, {"ef_search": e}) for e in HNSW_EF_SEARCH]
    rows, built, reference = [], {}, None
    for kind, build_params, search_params in configs:
        key = (kind, tuple(sorted(build_params.items())))
        build_seconds = None
        if key not in built:
            built.clear()  # free the previous index before building the next one
            built[key], build_seconds = _timed(
                M.build_neighbor_index, gallery, index=kind, index_params=build_params, use_gpu=False
            )
        index = built[key]
        index.params.update(search_params)  # search-time parameters only: no rebuild
        (found, _), search_seconds = _timed(index.search, queries, k=K)
        metrics = M.retrieval_metrics_from_neighbors(found, query_labels, gallery_labels=gallery_labels, ks=(1, K))
        if reference is None:
            reference = (found, metrics)
        overlap = np.mean([len(set(a) & set(b)) / K for a, b in zip(found.tolist(), reference[0].tolist())])
        rows.append(
            {
                "N": n_gallery,
                "queries": n_queries,
                "data": data,
                "index": kind,
                "params": ", ".join(f"{k}={v}" for k, v in {**index.params, **search_params}.items()) or "–",
                "build_s": build_seconds,
                "search_s": search_seconds,
                "neighbour_recall@10": float(overlap),
                **{name: metrics[name] for name in ("R@1", f"R@{K}", "MAP@R")},
                **{f"err {name}": abs(metrics[name] - reference[1][name]) for name in ("R@1", f"R@{K}", "MAP@R")},
                "peak_rss_mb": _peak_rss_mb(),
            }
        )
    return rows


def worker_evaluate(name: str, seed: int) -> list[dict]:
    """Part 2: the three cost centres of ``evaluate`` at a benchmark's test size."""
    from dmlstudy import metrics as M

    if name == "SOP":
        x, y = make_sop_like(60_502, seed=seed, sizes=(2, 9))  # mean 5.5 per class, ≈ 11,000 classes like SOP
        retrieval_kwargs = {"ks": (1, 10, 100, 1000)}
    else:  # In-Shop: 14,218 queries, 12,612 gallery items, 3,985 classes present in both
        x_all, y_all = make_sop_like(14_218 + 12_612, seed=seed, sizes=(2, 12))
        y_all = y_all % 3_985
        x, y = x_all[:14_218], y_all[:14_218]
        retrieval_kwargs = {"ks": (1, 10, 20, 30), "gallery": x_all[14_218:], "gallery_labels": y_all[14_218:]}
    base_rss = _peak_rss_mb()
    retrieval, retrieval_seconds = _timed(M.retrieval_metrics, x, y, **retrieval_kwargs)
    rss_after_retrieval = _peak_rss_mb()
    n_classes = len(np.unique(y))
    backend = M.nmi_backend_for(len(x), n_classes)
    nmi_value, nmi_seconds = _timed(M.nmi, x, y)
    (esd, rho), geometry_seconds = _timed(lambda: (M.embedding_space_density(x, y), M.spectral_decay(x)))
    return [
        {
            "set": name,
            "N": len(x),
            "classes": n_classes,
            "gallery": len(retrieval_kwargs.get("gallery", x)),
            "retrieval_s": retrieval_seconds,
            "nmi_backend": backend,
            "nmi_s": nmi_seconds,
            "geometry_s": geometry_seconds,
            "rss_data_mb": base_rss,
            "rss_after_retrieval_mb": rss_after_retrieval,
            "peak_rss_mb": _peak_rss_mb(),
            "metrics": {
                **{k: round(v, 4) for k, v in retrieval.items()},
                "NMI": round(nmi_value, 4),
                "ESD": round(esd, 4),
                "rho": round(rho, 4),
            },
        }
    ]


def run_worker(args: list[str]) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    completed = subprocess.run(
        [sys.executable, __file__, "--worker", *args], capture_output=True, text=True, env=env, cwd=REPO
    )
    if completed.returncode != 0:
        raise RuntimeError(f"worker {args} failed:\n{completed.stderr[-4000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def _fmt(value, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def ann_table(rows: list[dict]) -> str:
    header = (
        "| data | N | index | parameters | build s | search s (queries) | neighbour recall@10 | R@1 | R@10 | MAP@R | "
        "R@1 error | R@10 error | MAP@R error | peak RSS MB |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r['data']} | {r['N']:,} | {r['index']} | {r['params']} | {_fmt(r['build_s'], 1)} | {_fmt(r['search_s'], 2)} ({r['queries']:,}) | "
            f"{_fmt(r['neighbour_recall@10'], 3)} | {_fmt(r['R@1'])} | {_fmt(r['R@10'])} | {_fmt(r['MAP@R'])} | "
            f"{_fmt(r['err R@1'])} | {_fmt(r['err R@10'])} | {_fmt(r['err MAP@R'])} | {r['peak_rss_mb']:.0f} |"
        )
    return "\n".join(lines)


def evaluate_table(rows: list[dict]) -> str:
    header = "| test set | queries × gallery | classes | retrieval s | NMI backend | NMI s | ESD+ρ s | RSS with data MB | peak RSS MB | metrics |"
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for r in rows:
        metrics = ", ".join(f"{k} {v}" for k, v in r["metrics"].items())
        lines.append(
            f"| {r['set']} | {r['N']:,} × {r['gallery']:,} | {r['classes']:,} | {r['retrieval_s']:.1f} | {r['nmi_backend']} | "
            f"{r['nmi_s']:.1f} | {r['geometry_s']:.1f} | {r['rss_data_mb']:.0f} | {r['peak_rss_mb']:.0f} | {metrics} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--queries", type=int, default=2_000)
    parser.add_argument("--parts", nargs="+", default=["ann", "evaluate"], choices=["ann", "evaluate"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", nargs="+", default=["structured"], choices=sorted(GENERATORS))
    parser.add_argument("--out", default="", help="write the tables (markdown) here")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        part, *rest = args.worker
        rows = (
            worker_ann(int(rest[0]), int(rest[1]), int(rest[2]), rest[3])
            if part == "ann"
            else worker_evaluate(rest[0], int(rest[1]))
        )
        print(json.dumps(rows))
        return 0

    started = datetime.datetime.now()
    load_start = os.getloadavg()
    sections = []
    if "ann" in args.parts:
        rows = []
        for data in args.data:
            for n in args.sizes:
                rows += run_worker(["ann", str(n), str(args.queries), str(args.seed), data])
                print(ann_table(rows), flush=True)
        sections.append(ann_table(rows))
    if "evaluate" in args.parts:
        rows = []
        for name in ("SOP", "In-Shop"):
            rows += run_worker(["evaluate", name, str(args.seed)])
            print(evaluate_table(rows), flush=True)
        sections.append(evaluate_table(rows))
    load_end = os.getloadavg()
    import faiss

    print(
        f"\nstarted {started:%Y-%m-%d %H:%M}, {platform.machine()}, {os.cpu_count()} CPUs, faiss {faiss.__version__} "
        f"(GPUs seen: {faiss.get_num_gpus() if hasattr(faiss, 'get_num_gpus') else 0}), "
        f"load average {load_start[0]:.1f} at start, {load_end[0]:.1f} at end"
    )
    if args.out:
        Path(args.out).write_text("\n\n".join(sections) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
