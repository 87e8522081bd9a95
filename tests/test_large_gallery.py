"""Large-gallery evaluation: approximate indexes (IVF, HNSW) against brute force, the faiss GPU code path
(with a stand-in GPU, since the CPU build has none), and faiss k-means NMI against scikit-learn's."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from dmlstudy import metrics as M
from dmlstudy.metrics import neighbours


def clustered(n_classes: int, per_class: int, dim: int, *, noise: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``per_class`` Gaussian points around each of ``n_classes`` random centres, shuffled."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(n_classes), per_class)
    centres = rng.normal(size=(n_classes, dim))
    x = centres[labels] + noise * rng.normal(size=(len(labels), dim))
    order = rng.permutation(len(labels))
    return x[order].astype(np.float32), labels[order]


def brute_top_k(q: np.ndarray, g: np.ndarray, k: int) -> np.ndarray:
    """Exact top-k gallery indices per query by float64 cosine similarity (the independent reference)."""
    qn = q.astype(np.float64) / np.linalg.norm(q.astype(np.float64), axis=1, keepdims=True)
    gn = g.astype(np.float64) / np.linalg.norm(g.astype(np.float64), axis=1, keepdims=True)
    return np.argsort(-(qn @ gn.T), axis=1, kind="stable")[:, :k]


def neighbour_recall(found: np.ndarray, truth: np.ndarray) -> float:
    """Share of the true k nearest neighbours that an index returned (the usual ANN recall@k)."""
    return float(np.mean([len(set(f) & set(t)) / len(t) for f, t in zip(found.tolist(), truth.tolist())]))


@pytest.fixture(scope="module")
def query_gallery() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    x, y = clustered(200, 26, 32, noise=0.6, seed=1)
    return x[:200], y[:200], x[200:], y[200:]  # 200 queries, 5000 gallery items


# --------------------------------------------------------------------------------------------------
# approximate search


@pytest.mark.parametrize(
    "index, params",
    [("ivf", {}), ("hnsw", {}), ("ivf", {"nlist": 64, "nprobe": 8}), ("hnsw", {"M": 16, "ef_search": 64})],
)
def test_approximate_search_recalls_most_exact_neighbours(query_gallery, index, params):
    q, _, g, _ = query_gallery
    truth = brute_top_k(q, g, 10)
    found, sims = M.nearest_neighbors(q, g, k=10, index=index, index_params=params)
    assert found.shape == (200, 10) and (found >= 0).all()
    assert neighbour_recall(found, truth) >= 0.9
    assert np.all(np.diff(sims, axis=1) <= 1e-6)  # sorted by similarity, best first


def test_exhaustive_ivf_equals_exact_search(query_gallery):
    q, _, g, _ = query_gallery
    exact, exact_sims = M.nearest_neighbors(q, g, k=15)
    nlist = M.default_nlist(len(g))
    ivf, ivf_sims = M.nearest_neighbors(q, g, k=15, index="ivf", index_params={"nprobe": nlist})
    np.testing.assert_array_equal(ivf, exact)
    np.testing.assert_allclose(ivf_sims, exact_sims, atol=1e-5)
    np.testing.assert_array_equal(exact, brute_top_k(q, g, 15))


@pytest.mark.parametrize("index", M.INDEX_KINDS)
def test_index_options_agree_with_exact_metrics_on_easy_data(index):
    x, y = clustered(40, 8, 24, noise=0.05, seed=4)  # well separated: every method must find all classmates
    exact = M.retrieval_metrics(x, y, ks=(1, 2, 4, 8))
    approximate = M.retrieval_metrics(x, y, ks=(1, 2, 4, 8), index=index)
    assert approximate == pytest.approx(exact, abs=1e-12)
    assert exact["MAP@R"] == pytest.approx(1.0)
    gallery_metrics = M.retrieval_metrics(x[:60], y[:60], gallery=x[60:], gallery_labels=y[60:], ks=(1, 5), index=index)
    assert gallery_metrics == pytest.approx(
        M.retrieval_metrics(x[:60], y[:60], gallery=x[60:], gallery_labels=y[60:], ks=(1, 5)), abs=1e-12
    )


@pytest.mark.parametrize("index", ["ivf", "hnsw"])
def test_all_vs_all_approximate_search_excludes_the_query(index):
    x, _ = clustered(30, 10, 16, noise=0.5, seed=2)
    found, _ = M.nearest_neighbors(x, k=5, index=index)
    assert not (found == np.arange(len(x))[:, None]).any()
    assert neighbour_recall(found, _brute_all_vs_all(x, 5)) >= 0.9


def _brute_all_vs_all(x: np.ndarray, k: int) -> np.ndarray:
    xn = x.astype(np.float64) / np.linalg.norm(x.astype(np.float64), axis=1, keepdims=True)
    sims = xn @ xn.T
    np.fill_diagonal(sims, -np.inf)
    return np.argsort(-sims, axis=1, kind="stable")[:, :k]


def test_missing_ivf_results_are_minus_one_and_count_as_misses():
    x, y = clustered(20, 25, 8, noise=0.3, seed=3)
    q, qy, g, gy = x[:50], y[:50], x[50:], y[50:]
    # 45 lists over 450 items, one visited: ~10 candidates per query, so most of the 40 slots stay empty
    found, sims = M.nearest_neighbors(q, g, k=40, index="ivf", index_params={"nlist": 45, "nprobe": 1})
    missing = found < 0
    assert missing.any()
    assert np.isneginf(sims[missing]).all() and np.isfinite(sims[~missing]).all()
    assert not (missing[:, :-1] & ~missing[:, 1:]).any()  # a missing entry is never followed by a found one
    ks = (1, 5, 20)
    ours = M.retrieval_metrics_from_neighbors(found, qy, gallery_labels=gy, ks=ks)
    for k in ks:  # independent loop: a query counts if a *returned* item among its first k has its class
        expected = np.mean([any(j >= 0 and gy[j] == qy[i] for j in found[i, :k]) for i in range(len(q))])
        assert ours[f"R@{k}"] == pytest.approx(expected, abs=1e-12)
    approx_metrics = M.recall_at_k(
        q, qy, ks, gallery=g, gallery_labels=gy, index="ivf", index_params={"nlist": 45, "nprobe": 1}
    )
    assert approx_metrics == pytest.approx({k: ours[f"R@{k}"] for k in ks}, abs=1e-12)


def test_prebuilt_index_searches_like_nearest_neighbors(query_gallery):
    q, _, g, _ = query_gallery
    built = M.build_neighbor_index(g, index="hnsw", index_params={"ef_search": 32})
    np.testing.assert_array_equal(
        built.search(q, k=7)[0], M.nearest_neighbors(q, g, k=7, index="hnsw", index_params={"ef_search": 32})[0]
    )
    self_search, _ = M.build_neighbor_index(g).search(g, k=3, exclude_self=True)
    np.testing.assert_array_equal(self_search, M.nearest_neighbors(g, k=3)[0])


def test_evaluate_threads_the_index_options():
    x, y = clustered(30, 6, 16, noise=0.8, seed=5)
    params = {"nlist": 8, "nprobe": 2}
    out = M.evaluate(x, y, index="ivf", index_params=params, with_geometry=False, seed=1)
    retrieval = M.retrieval_metrics(x, y, index="ivf", index_params=params)
    assert {k: out[k] for k in retrieval} == retrieval
    assert out["NMI"] == M.nmi(x, y, seed=1)


# --------------------------------------------------------------------------------------------------
# options and errors


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda x: M.nearest_neighbors(x, k=2, index="annoy"), "expected one of 'exact', 'ivf', 'hnsw', got 'annoy'"),
        (
            lambda x: M.retrieval_metrics(x, np.repeat(np.arange(10), 4), index="IVF"),
            "expected one of 'exact', 'ivf', 'hnsw'",
        ),
        (lambda x: M.evaluate(x, np.repeat(np.arange(10), 4), index=None), "expected one of"),
        (
            lambda x: M.nearest_neighbors(x, k=2, index="ivf", index_params={"efSearch": 4}),
            r"valid parameters: nlist, nprobe",
        ),
        (
            lambda x: M.nearest_neighbors(x, k=2, index="hnsw", index_params={"nprobe": 4}),
            r"valid parameters: M, ef_construction, ef_search",
        ),
        (lambda x: M.nearest_neighbors(x, k=2, index="exact", index_params={"nlist": 4}), "valid parameters: none"),
        (lambda x: M.nearest_neighbors(x, k=2, index="ivf", index_params={"nprobe": 0}), "positive integer"),
        (
            lambda x: M.nearest_neighbors(x, k=2, index="ivf", index_params={"nlist": 41}),
            "at most the 40 indexed items",
        ),
        (lambda x: M.nearest_neighbors(x, k=2, index="hnsw", use_gpu=True), "no GPU version of IndexHNSWFlat"),
        (lambda x: M.nearest_neighbors(x, k=2, use_gpu="yes"), "use_gpu"),
        (lambda x: M.nmi(x, np.repeat(np.arange(10), 4), backend="scipy"), "'auto', 'sklearn', 'faiss'"),
        (lambda x: M.nmi(x, np.repeat(np.arange(10), 4), backend="faiss", init="pp"), "'random', 'kmeans\\+\\+'"),
    ],
)
def test_bad_index_options_raise_with_the_valid_choices(call, match):
    x = np.random.default_rng(0).normal(size=(40, 6)).astype(np.float32)
    with pytest.raises(ValueError, match=match):
        call(x)


def test_use_gpu_true_without_a_gpu_raises():
    import faiss

    if neighbours._faiss_gpu_count(faiss) > 0:
        pytest.skip("this machine's faiss sees a GPU")
    x = np.random.default_rng(0).normal(size=(20, 4)).astype(np.float32)
    with pytest.raises(ValueError, match="faiss sees no GPU"):
        M.nearest_neighbors(x, k=2, use_gpu=True)


class FakeGpu:
    """Stands in for faiss's GPU API: records the calls; the 'GPU index' is the CPU index itself."""

    def __init__(self) -> None:
        self.moves: list[tuple[object, int, str]] = []
        self.resources_made = 0

    def install(self, monkeypatch, faiss) -> None:
        fake = self

        class Resources:
            def __init__(self) -> None:
                fake.resources_made += 1

        def index_cpu_to_gpu(resources, device, index):
            assert isinstance(resources, Resources)
            fake.moves.append((resources, device, type(index).__name__))
            return index

        monkeypatch.setattr(faiss, "get_num_gpus", lambda: 1, raising=False)
        monkeypatch.setattr(faiss, "StandardGpuResources", Resources, raising=False)
        monkeypatch.setattr(faiss, "index_cpu_to_gpu", index_cpu_to_gpu, raising=False)
        monkeypatch.setattr(neighbours, "_GPU_STATE", {})


def test_gpu_path_moves_exact_and_ivf_indexes_to_gpu_zero(monkeypatch, query_gallery):
    import faiss

    q, qy, g, gy = query_gallery
    cpu_exact = M.nearest_neighbors(q, g, k=10, use_gpu=False)
    cpu_ivf = M.nearest_neighbors(q, g, k=10, index="ivf", use_gpu=False)
    fake = FakeGpu()
    fake.install(monkeypatch, faiss)
    for got, want in [
        (M.nearest_neighbors(q, g, k=10), cpu_exact),
        (M.nearest_neighbors(q, g, k=10, index="ivf"), cpu_ivf),
    ]:
        np.testing.assert_array_equal(got[0], want[0])
    assert [(device, name) for _, device, name in fake.moves] == [(0, "IndexFlatIP"), (0, "IndexIVFFlat")]
    assert fake.resources_made == 1  # one StandardGpuResources per process, reused
    M.nearest_neighbors(q, g, k=10, index="hnsw")  # no GPU HNSW in faiss: stays on the CPU
    M.retrieval_metrics(q, qy, gallery=g, gallery_labels=gy, ks=(1, M.GPU_MAX_K + 1))  # k too large for a GPU index
    M.nearest_neighbors(q, g, k=10, use_gpu=False)
    assert len(fake.moves) == 2
    with pytest.raises(ValueError, match="exceeds the 2048"):
        M.nearest_neighbors(q, g, k=M.GPU_MAX_K + 1, use_gpu=True)


# --------------------------------------------------------------------------------------------------
# NMI with faiss k-means


def brute_nmi(a: np.ndarray, b: np.ndarray) -> float:
    """NMI (arithmetic normalisation) from the contingency table, by explicit counting."""
    n = len(a)
    pa, pb, pab = Counter(a.tolist()), Counter(b.tolist()), Counter(zip(a.tolist(), b.tolist()))
    mi = sum(c / n * math.log((c / n) / ((pa[i] / n) * (pb[j] / n))) for (i, j), c in pab.items())
    ha = -sum(c / n * math.log(c / n) for c in pa.values())
    hb = -sum(c / n * math.log(c / n) for c in pb.values())
    return mi / ((ha + hb) / 2)


def test_faiss_kmeans_nmi_close_to_sklearn_on_clustered_data():
    x, y = clustered(40, 30, 16, noise=0.8, seed=6)  # overlapping classes, NMI ≈ 0.9 as for real embeddings
    ours = [M.nmi(x, y, backend="faiss", seed=s) for s in range(3)]
    reference = [M.nmi(x, y, backend="sklearn", seed=s) for s in range(3)]
    assert min(reference) > 0.85
    assert abs(np.mean(ours) - np.mean(reference)) < 0.02
    assert max(abs(a - b) for a, b in zip(ours, reference)) < 0.04
    ours = ours[0]
    clusters = M.kmeans_assignments(M.l2_normalize(x), 40, backend="faiss", seed=0)
    assert ours == pytest.approx(brute_nmi(y, clusters), abs=1e-10)
    assert len(np.unique(clusters)) > 30 and clusters.min() >= 0 and clusters.max() < 40
    assert M.nmi(x, y, backend="faiss", seed=0) == ours  # seeded


def test_faiss_kmeans_plus_plus_recovers_separated_clusters_exactly():
    import faiss

    x, y = clustered(12, 10, 8, noise=0.01, seed=7)
    assert M.nmi(x, y * 5 + 2, backend="faiss") > 0.85  # random init may merge two clusters
    if not hasattr(faiss, "ClusteringInitMethod_KMEANS_PLUS_PLUS"):
        pytest.skip(f"faiss {faiss.__version__} has no k-means++ initialisation")
    for seed in range(3):
        assert M.nmi(x, y * 5 + 2, backend="faiss", init="kmeans++", seed=seed) == pytest.approx(1.0, abs=1e-12)


def test_auto_backend_switches_at_the_documented_size():
    assert M.nmi_backend_for(5_924, 100) == "sklearn"  # CUB test set
    assert M.nmi_backend_for(60_502, 11_316) == "faiss"  # SOP test set
    assert M.nmi_backend_for(14_218, 3_985) == "faiss"  # In-Shop queries
    assert M.nmi_backend_for(M.NMI_FAISS_MIN_WORK, 1) == "sklearn"
    assert M.nmi_backend_for(M.NMI_FAISS_MIN_WORK + 1, 1) == "faiss"
    assert M.nmi_backend_for(10, 2, "faiss") == "faiss"
    x, y = clustered(10, 8, 8, noise=0.5, seed=8)
    assert M.evaluate(x, y, with_geometry=False, nmi_backend="faiss")["NMI"] == M.nmi(x, y, backend="faiss")
