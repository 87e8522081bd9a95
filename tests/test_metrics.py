"""Tests of dmlstudy.metrics against brute-force loops, pytorch-metric-learning and closed forms."""

from __future__ import annotations

import ast
import graphlib
import inspect
import math
import pkgutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from dmlstudy import metrics as M

KS = (1, 2, 4, 8)


# --------------------------------------------------------------------------------------------------
# data and independent references


def clustered(
    n_classes: int, sizes: tuple[int, int], dim: int, *, noise: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian clusters with class sizes drawn uniformly from ``sizes`` (inclusive), shuffled."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(sizes[0], sizes[1] + 1, size=n_classes)
    labels = np.repeat(np.arange(n_classes), counts)
    centers = rng.normal(size=(n_classes, dim))
    x = centers[labels] + noise * rng.normal(size=(len(labels), dim))
    perm = rng.permutation(len(labels))
    return x[perm].astype(np.float32), labels[perm]


def brute_rankings(q: np.ndarray, g: np.ndarray | None) -> tuple[list[list[int]], np.ndarray]:
    """Full ranking of the gallery per query (cosine similarity desc, index asc), self excluded if g is None."""
    qn = q.astype(np.float64) / np.linalg.norm(q.astype(np.float64), axis=1, keepdims=True)
    gn = qn if g is None else g.astype(np.float64) / np.linalg.norm(g.astype(np.float64), axis=1, keepdims=True)
    sims = qn @ gn.T
    rankings = []
    for i in range(len(qn)):
        candidates = [j for j in range(len(gn)) if not (g is None and j == i)]
        rankings.append(sorted(candidates, key=lambda j: (-sims[i, j], j)))
    return rankings, sims


def assert_no_near_ties(rankings: list[list[int]], sims: np.ndarray, depth: int) -> None:
    """Precondition: float32 vs float64 rounding cannot reorder the first ``depth + 1`` neighbours."""
    for i, ranking in enumerate(rankings):
        top = sims[i, ranking[: depth + 1]]
        gaps = -np.diff(top)
        assert np.all((gaps == 0) | (gaps > 1e-5)), f"near-tie in query {i}; pick another seed"


def brute_metrics(q, ql, g=None, gl=None, ks=KS) -> dict[str, float]:
    """Recall@K, P@1, RP and MAP@R with explicit loops over queries; queries with R_q = 0 skipped."""
    rankings, _ = brute_rankings(q, g)
    target = ql if gl is None else gl
    recall = {k: [] for k in ks}
    p1, rps, aps = [], [], []
    for i, ranking in enumerate(rankings):
        r = sum(1 for j in range(len(target)) if target[j] == ql[i] and not (gl is None and j == i))
        if r == 0:
            continue
        rel = [int(target[j] == ql[i]) for j in ranking]
        for k in ks:
            recall[k].append(float(any(rel[:k])))
        p1.append(float(rel[0]))
        rps.append(sum(rel[:r]) / r)
        ap = 0.0
        for pos in range(1, r + 1):
            if rel[pos - 1]:
                ap += sum(rel[:pos]) / pos
        aps.append(ap / r)
    out = {f"R@{k}": float(np.mean(recall[k])) for k in ks}
    out["P@1"] = float(np.mean(p1))
    out["RP"] = float(np.mean(rps))
    out["MAP@R"] = float(np.mean(aps))
    return out


def assert_metrics_close(ours: dict[str, float], ref: dict[str, float], atol: float = 1e-12) -> None:
    assert set(ours) == set(ref)
    for key in ref:
        assert ours[key] == pytest.approx(ref[key], abs=atol), key


@pytest.fixture(scope="module")
def small_set() -> tuple[np.ndarray, np.ndarray]:
    x, y = clustered(25, (1, 9), 12, noise=0.9, seed=3)  # includes singleton classes (R_q = 0)
    return x, y


# --------------------------------------------------------------------------------------------------
# normalisation and neighbour search


def test_l2_normalize_unit_rows_zero_row_and_torch_input():
    x = np.array([[3.0, 4.0], [0.0, 0.0], [-2.0, 0.0]])
    out = M.l2_normalize(torch.tensor(x, requires_grad=True))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, 0.0], [-1.0, 0.0]], atol=1e-7)


def test_nearest_neighbors_all_vs_all_matches_brute_force(small_set):
    x, _ = small_set
    k = 10
    rankings, sims = brute_rankings(x, None)
    assert_no_near_ties(rankings, sims, k)
    idx, sim = M.nearest_neighbors(x, k=k)
    assert idx.dtype == np.int64 and sim.dtype == np.float32 and idx.shape == (len(x), k)
    np.testing.assert_array_equal(idx, np.array([r[:k] for r in rankings]))
    np.testing.assert_allclose(sim, np.take_along_axis(sims, idx, axis=1), atol=1e-6)
    assert not (idx == np.arange(len(x))[:, None]).any()


def test_nearest_neighbors_query_to_gallery_matches_brute_force(small_set):
    x, _ = small_set
    q, g = x[:40], x[40:]
    rankings, sims = brute_rankings(q, g)
    assert_no_near_ties(rankings, sims, 7)
    idx, sim = M.nearest_neighbors(q, g, k=7)
    np.testing.assert_array_equal(idx, np.array([r[:7] for r in rankings]))
    np.testing.assert_allclose(sim, np.take_along_axis(sims, idx, axis=1), atol=1e-6)


def test_query_excluded_by_index_so_duplicates_stay():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(30, 8)).astype(np.float32)
    x[:10] = x[0]  # ten identical vectors: each must list the other nine first, never itself
    idx, sim = M.nearest_neighbors(x, k=9)
    for i in range(10):
        assert sorted(idx[i].tolist()) == [j for j in range(10) if j != i]
        assert list(idx[i]) == sorted(idx[i])  # exact ties ordered by index
    np.testing.assert_allclose(sim[:10], 1.0, atol=1e-6)
    idx, _ = M.nearest_neighbors(x, k=5)  # more ties than k + 1: self may fall outside the searched list
    for i in range(10):
        assert len(set(idx[i].tolist())) == 5 and set(idx[i].tolist()) <= set(range(10)) - {i}


def test_duplicate_of_query_with_other_class_is_retrieved():
    # a and its copy a' have different classes: excluding by similarity would wrongly drop a'
    x = np.array([[1.0, 0.0], [1.0, 0.0], [0.8, 0.6], [0.0, 1.0]], dtype=np.float32)
    y = np.array([0, 1, 0, 1])
    idx, _ = M.nearest_neighbors(x, k=3)
    assert idx[0].tolist() == [1, 2, 3] and idx[1].tolist() == [0, 2, 3]
    # query 0: [a' (1), b (0), c (1)] → miss at 1, hit at 2, R=1 → RP = AP = 0
    # query 1: [a (0), b (0), c (1)], R=1 → miss at 1, hit at 3 → RP = AP = 0
    # query 2: [a (0), a' (1), c (1)] → hit at 1, R=1 → RP = AP = 1
    # query 3: [b (0), a (0), a' (1)] → hit at 3, R=1 → RP = AP = 0
    out = M.retrieval_metrics(x, y, ks=(1, 2, 3))
    assert out == pytest.approx({"R@1": 0.25, "R@2": 0.5, "R@3": 1.0, "P@1": 0.25, "RP": 0.25, "MAP@R": 0.25})
    assert_metrics_close(out, brute_metrics(x, y, ks=(1, 2, 3)))


def test_chunking_invariance(small_set):
    x, y = small_set
    idx_small, sim_small = M.nearest_neighbors(x, k=12, chunk_size=3)
    idx_big, sim_big = M.nearest_neighbors(x, k=12, chunk_size=10_000)
    np.testing.assert_array_equal(idx_small, idx_big)
    np.testing.assert_allclose(sim_small, sim_big, atol=1e-6)
    assert M.retrieval_metrics(x, y, chunk_size=3) == M.retrieval_metrics(x, y, chunk_size=10_000)
    q, g, ql, gl = x[:50], x[50:], y[:50], y[50:]
    assert M.retrieval_metrics(q, ql, gallery=g, gallery_labels=gl, chunk_size=3) == M.retrieval_metrics(
        q, ql, gallery=g, gallery_labels=gl, chunk_size=10_000
    )


# --------------------------------------------------------------------------------------------------
# retrieval metrics vs brute force and pytorch-metric-learning


def test_retrieval_metrics_all_vs_all_match_brute_force(small_set):
    x, y = small_set
    assert (M.relevant_counts(y) == 0).any()  # singleton classes are present and must be skipped
    rankings, sims = brute_rankings(x, None)
    assert_no_near_ties(rankings, sims, 10)
    assert_metrics_close(M.retrieval_metrics(x, y, ks=KS), brute_metrics(x, y))


def test_retrieval_metrics_query_to_gallery_match_brute_force(small_set):
    x, y = small_set
    q, ql, g, gl = x[::2], y[::2], x[1::2], y[1::2]
    assert (M.relevant_counts(ql, gl) == 0).any()  # some query classes are absent from the gallery
    rankings, sims = brute_rankings(q, g)
    assert_no_near_ties(rankings, sims, 10)
    ours = M.retrieval_metrics(q, ql, ks=(1, 3, 5), gallery=g, gallery_labels=gl)
    assert_metrics_close(ours, brute_metrics(q, ql, g, gl, ks=(1, 3, 5)))


def test_retrieval_metrics_with_duplicates_match_brute_force():
    x, y = clustered(12, (2, 6), 6, noise=1.0, seed=5)
    x = np.concatenate([x, x[:15]])  # exact duplicates, same class: results independent of tie order
    y = np.concatenate([y, y[:15]])
    assert_metrics_close(M.retrieval_metrics(x, y, ks=(1, 2, 4)), brute_metrics(x, y, ks=(1, 2, 4)))


def test_recall_at_k_and_torch_input_agree_with_retrieval_metrics(small_set):
    x, y = small_set
    full = M.retrieval_metrics(x, y, ks=KS)
    assert M.recall_at_k(x, y, KS) == {k: full[f"R@{k}"] for k in KS}
    assert M.recall_at_k(x, y, (8, 1, 8)) == {1: full["R@1"], 8: full["R@8"]}
    assert full["P@1"] == full["R@1"]
    assert M.retrieval_metrics(torch.from_numpy(x), torch.from_numpy(y), ks=KS) == full


def test_metrics_from_neighbors_reuse_and_reranked_lists(small_set):
    x, y = small_set
    k = int(M.relevant_counts(y).max()) + 4
    idx, _ = M.nearest_neighbors(x, k=k)
    assert M.retrieval_metrics_from_neighbors(idx, y, ks=KS) == M.retrieval_metrics(x, y, ks=KS)
    reranked = idx[:, ::-1]  # a re-ranker's output: metrics must follow the given order
    target_sizes = M.relevant_counts(y)
    rps, aps, r1 = [], [], []
    for i in range(len(y)):
        r = target_sizes[i]
        if r == 0:
            continue
        rel = [int(y[j] == y[i]) for j in reranked[i]]
        r1.append(rel[0])
        rps.append(sum(rel[:r]) / r)
        aps.append(sum(sum(rel[:p]) / p for p in range(1, r + 1) if rel[p - 1]) / r)
    out = M.retrieval_metrics_from_neighbors(reranked, y, ks=(1,))
    assert out["P@1"] == pytest.approx(np.mean(r1), abs=1e-12)
    assert out["RP"] == pytest.approx(np.mean(rps), abs=1e-12)
    assert out["MAP@R"] == pytest.approx(np.mean(aps), abs=1e-12)


def _pml_calculator():
    import faiss
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
    from pytorch_metric_learning.utils.inference import FaissKNN

    return AccuracyCalculator(
        include=("precision_at_1", "r_precision", "mean_average_precision_at_r"),
        k="max_bin_count",
        device=torch.device("cpu"),
        knn_func=FaissKNN(index_init_fn=faiss.IndexFlatIP),
    )


def test_matches_pytorch_metric_learning_all_vs_all():
    x, y = clustered(60, (1, 15), 32, noise=1.2, seed=11)
    xn = M.l2_normalize(x)
    ref = _pml_calculator().get_accuracy(torch.from_numpy(xn), torch.from_numpy(y))  # ref_includes_query=True
    ours = M.retrieval_metrics(x, y, ks=(1,))
    assert ours["P@1"] == pytest.approx(ref["precision_at_1"], abs=1e-6)
    assert ours["RP"] == pytest.approx(ref["r_precision"], abs=1e-6)
    assert ours["MAP@R"] == pytest.approx(ref["mean_average_precision_at_r"], abs=1e-6)


def test_matches_pytorch_metric_learning_query_to_gallery():
    x, y = clustered(60, (1, 15), 32, noise=1.2, seed=12)
    xn = M.l2_normalize(x)
    in_query = np.arange(len(y)) % 3 == 0
    q, ql = np.ascontiguousarray(xn[in_query]), y[in_query]
    g, gl = np.ascontiguousarray(xn[~in_query]), y[~in_query]
    ref = _pml_calculator().get_accuracy(
        torch.from_numpy(q), torch.from_numpy(ql), torch.from_numpy(g), torch.from_numpy(gl), ref_includes_query=False
    )
    ours = M.retrieval_metrics(q, ql, ks=(1,), gallery=g, gallery_labels=gl)
    assert ours["P@1"] == pytest.approx(ref["precision_at_1"], abs=1e-6)
    assert ours["RP"] == pytest.approx(ref["r_precision"], abs=1e-6)
    assert ours["MAP@R"] == pytest.approx(ref["mean_average_precision_at_r"], abs=1e-6)


# --------------------------------------------------------------------------------------------------
# NMI


def brute_nmi(a: np.ndarray, b: np.ndarray) -> float:
    """NMI with arithmetic-mean normalisation from the contingency table, by explicit loops."""
    n = len(a)
    ua, ub = sorted(set(a.tolist())), sorted(set(b.tolist()))
    pa = {u: np.mean(a == u) for u in ua}
    pb = {v: np.mean(b == v) for v in ub}
    mi = 0.0
    for u in ua:
        for v in ub:
            p = np.sum((a == u) & (b == v)) / n
            if p > 0:
                mi += p * math.log(p / (pa[u] * pb[v]))
    ha = -sum(p * math.log(p) for p in pa.values())
    hb = -sum(p * math.log(p) for p in pb.values())
    return mi / ((ha + hb) / 2)


def test_nmi_matches_contingency_computation_and_is_seeded():
    from sklearn.cluster import KMeans

    x, y = clustered(8, (5, 12), 6, noise=1.5, seed=2)
    clusters = KMeans(n_clusters=8, n_init=1, random_state=4).fit_predict(M.l2_normalize(x))
    assert M.nmi(x, y, seed=4) == pytest.approx(brute_nmi(y, clusters), abs=1e-10)
    assert M.nmi(x, y, seed=4) == M.nmi(x, y, seed=4)


def test_nmi_is_one_for_separated_clusters_under_label_renaming():
    x, y = clustered(5, (4, 6), 16, noise=0.01, seed=0)
    assert M.nmi(x, y * 7 + 3) == pytest.approx(1.0, abs=1e-12)


# --------------------------------------------------------------------------------------------------
# embedding-space density


def brute_density(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    intra = []
    centroids = []
    for c in np.unique(y):
        members = xn[y == c]
        cen = members.mean(axis=0)
        centroids.append(cen / np.linalg.norm(cen))
        if len(members) < 2:
            continue
        dists = [1 - members[i] @ members[j] for i in range(len(members)) for j in range(len(members)) if i != j]
        intra.append(np.mean(dists))
    inter = [1 - a @ b for i, a in enumerate(centroids) for j, b in enumerate(centroids) if i != j]
    return float(np.mean(intra)), float(np.mean(inter))


def test_density_matches_brute_force(small_set):
    x, y = small_set
    pi_intra, pi_inter = M.density_terms(x, y)
    ref_intra, ref_inter = brute_density(x.astype(np.float64), y)
    assert pi_intra == pytest.approx(ref_intra, abs=1e-6)
    assert pi_inter == pytest.approx(ref_inter, abs=1e-6)
    assert M.embedding_space_density(x, y) == pytest.approx(ref_intra / ref_inter, rel=1e-5)


def test_density_collapsed_classes_have_zero_intra():
    e = np.eye(3)
    x = np.concatenate([np.repeat(e[:1], 4, 0) * 2.0, np.repeat(e[1:2], 3, 0), np.repeat(e[2:], 5, 0) * 0.5])
    y = np.repeat([0, 1, 2], [4, 3, 5])
    pi_intra, pi_inter = M.density_terms(x, y)
    assert pi_intra == pytest.approx(0.0, abs=1e-12)
    assert pi_inter == pytest.approx(1.0, abs=1e-12)  # orthogonal centroids
    assert M.embedding_space_density(x, y) == pytest.approx(0.0, abs=1e-12)


def test_density_two_classes_and_a_singleton_by_hand():
    # A = {e1, e2}: distance 1; B = {-e1, -e2}: distance 1 → π_intra = 1 (singleton C skipped)
    # centroids (1,1,0)/√2, (-1,-1,0)/√2, (0,0,1): distances 2, 1, 1 → π_inter = 4/3 → ESD = 3/4
    x = np.array([[1, 0, 0], [0, 1, 0], [-1, 0, 0], [0, -1, 0], [0, 0, 3]], dtype=np.float32)
    y = np.array([0, 0, 1, 1, 2])
    assert M.density_terms(x, y) == pytest.approx((1.0, 4 / 3), abs=1e-7)
    assert M.embedding_space_density(x, y) == pytest.approx(0.75, abs=1e-7)


def test_density_intra_is_unweighted_mean_over_classes():
    # class 0: e1, e2, e3 (all distances 1); class 1: two unit vectors 60° apart (distance 1/2)
    # mean over classes = 0.75 (a pair-weighted mean would give (6·1 + 2·0.5)/8 = 0.875)
    x = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 0, 0], [0.5, math.sqrt(3) / 2, 0]], dtype=np.float64)
    y = np.array([0, 0, 0, 1, 1])
    assert M.density_terms(x, y)[0] == pytest.approx(0.75, abs=1e-7)


# --------------------------------------------------------------------------------------------------
# spectral decay


def test_spectrum_matches_gram_eigenvalues(small_set):
    x, _ = small_set
    xn = x.astype(np.float64) / np.linalg.norm(x.astype(np.float64), axis=1, keepdims=True)
    ref = np.sqrt(np.sort(np.linalg.eigvalsh(xn.T @ xn))[::-1])
    np.testing.assert_allclose(M.singular_value_spectrum(x), ref, atol=1e-5)


def test_spectral_decay_flat_spectrum_is_zero():
    q, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(16, 16)))
    assert M.spectral_decay(q * 3.0) == pytest.approx(0.0, abs=1e-6)  # orthonormal rows (scaled)
    assert M.spectral_decay(np.eye(5)) == pytest.approx(0.0, abs=1e-12)


def test_spectral_decay_two_directions_closed_form():
    # n1 copies of e1 and n2 of e2: singular values √n1, √n2
    n1, n2 = 9, 4
    x = np.concatenate([np.tile([1.0, 0.0], (n1, 1)), np.tile([0.0, 5.0], (n2, 1))])
    s = np.array([3.0, 2.0]) / 5.0
    expected = 0.5 * math.log(0.5 / s[0]) + 0.5 * math.log(0.5 / s[1])
    assert M.spectral_decay(x) == pytest.approx(expected, abs=1e-12)
    assert M.spectral_decay(x, drop_first=1) == pytest.approx(0.0, abs=1e-12)  # m = 1: trivially flat
    x3 = np.concatenate([x, np.zeros((len(x), 1))], axis=1)
    assert M.spectral_decay(x3) == math.inf  # a zero singular value


def test_spectral_decay_matches_scipy_kl(small_set):
    from scipy.stats import entropy

    x, _ = small_set
    s = np.linalg.svd(x / np.linalg.norm(x, axis=1, keepdims=True), compute_uv=False)[2:]
    uniform = np.full(len(s), 1.0 / len(s))
    assert M.spectral_decay(x, drop_first=2) == pytest.approx(entropy(uniform, s / s.sum()), abs=1e-6)


# --------------------------------------------------------------------------------------------------
# evaluate and bad input


def test_evaluate_combines_all_metrics(small_set):
    x, y = small_set
    out = M.evaluate(x, y, drop_first=1, seed=3)
    assert list(out) == ["R@1", "R@2", "R@4", "R@8", "P@1", "RP", "MAP@R", "NMI", "ESD", "rho"]
    assert {k: out[k] for k in ["R@1", "R@2", "R@4", "R@8", "P@1", "RP", "MAP@R"]} == M.retrieval_metrics(x, y)
    assert out["NMI"] == M.nmi(x, y, seed=3)
    assert out["ESD"] == M.embedding_space_density(x, y)
    assert out["rho"] == M.spectral_decay(x, drop_first=1)
    assert list(M.evaluate(x, y, with_nmi=False, with_geometry=False)) == [
        "R@1",
        "R@2",
        "R@4",
        "R@8",
        "P@1",
        "RP",
        "MAP@R",
    ]


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda x, y: M.retrieval_metrics(x, y[:-1]), "expected 20 labels"),
        (lambda x, y: M.retrieval_metrics(np.where(np.eye(20, 4) > 0, np.nan, x), y), "finite"),
        (lambda x, y: M.retrieval_metrics(x, y, ks=()), "empty"),
        (lambda x, y: M.retrieval_metrics(x, y, ks=(1, 20)), "larger than the 19"),
        (lambda x, y: M.recall_at_k(x, y, (0,)), "positive integers"),
        (lambda x, y: M.nearest_neighbors(x, k=20), "larger than the 19"),
        (lambda x, y: M.nearest_neighbors(x, x[:5], k=6), "larger than the 5"),
        (lambda x, y: M.nearest_neighbors(x, x[:, :3], k=2), "dimension 4"),
        (lambda x, y: M.nearest_neighbors(x[0], k=1), "2-D"),
        (lambda x, y: M.retrieval_metrics(x, y, gallery=x), "both"),
        (lambda x, y: M.retrieval_metrics(x, np.arange(20)), "R_q > 0"),
        (lambda x, y: M.retrieval_metrics_from_neighbors((np.arange(20) + 1)[:, None] % 20, y, ks=(1,)), "max R_q"),
        (lambda x, y: M.embedding_space_density(x, np.zeros(20)), "at least 2 classes"),
        (lambda x, y: M.spectral_decay(x, drop_first=4), "drop_first"),
        (lambda x, y: M.nearest_neighbors(x, k=2, chunk_size=0), "chunk_size"),
        (lambda x, y: M.retrieval_metrics_from_neighbors(np.tile(np.arange(20), (20, 1)), y), "excluded"),
        (lambda x, y: M.retrieval_metrics_from_neighbors(np.full((20, 3), 25), y, gallery_labels=y), r"\[0, 20\)"),
    ],
)
def test_bad_input_raises_value_error(call, match):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20, 4)).astype(np.float32)
    y = np.repeat(np.arange(5), 4)
    with pytest.raises(ValueError, match=match):
        call(x, y)


def test_torch_and_faiss_share_a_process():
    import faiss  # noqa: F401  (torch is imported at module level)

    x = torch.randn(50, 8)
    idx, _ = M.nearest_neighbors(x, k=3)
    assert idx.shape == (50, 3)
    assert torch.mm(x, x.T).shape == (50, 50)


# --------------------------------------------------------------------------------------------------
# the package: public names, callers, no import cycles

SUBMODULES = {"inputs", "neighbours", "relatives", "retrieval", "clustering", "geometry", "evaluation"}
PROJECT = Path(__file__).resolve().parents[1]


def test_all_lists_exactly_the_public_names_and_each_is_importable():
    assert len(set(M.__all__)) == len(M.__all__)
    public = {name for name, value in vars(M).items() if not name.startswith("_") and not inspect.ismodule(value)}
    assert public == set(M.__all__)
    namespace: dict[str, object] = {}
    exec(f"from dmlstudy.metrics import {', '.join(M.__all__)}", namespace)  # the import statement itself
    assert all(namespace[name] is getattr(M, name) for name in M.__all__)


def _imported_metrics_modules(tree: ast.AST) -> set[str]:
    """Submodules of dmlstudy.metrics a submodule's source imports; "" stands for the package itself."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {alias.name for alias in node.names} if node.module is None else {node.module.split(".")[0]}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("dmlstudy"):
            if node.module == "dmlstudy":
                found |= {"" for alias in node.names if alias.name == "metrics"}
            elif node.module.startswith("dmlstudy.metrics"):
                found.add(node.module.removeprefix("dmlstudy.metrics").lstrip(".").split(".")[0])
        elif isinstance(node, ast.Import):
            found |= {
                alias.name.removeprefix("dmlstudy.metrics").lstrip(".").split(".")[0]
                for alias in node.names
                if alias.name.startswith("dmlstudy.metrics")
            }
    return found


def test_submodules_import_each_other_without_cycles():
    assert {info.name for info in pkgutil.iter_modules(M.__path__)} == SUBMODULES
    graph = {}
    for name in SUBMODULES:
        source = (Path(M.__path__[0]) / f"{name}.py").read_text(encoding="utf-8")
        graph[name] = _imported_metrics_modules(ast.parse(source))
        assert "" not in graph[name], f"dmlstudy.metrics.{name} imports the package itself (a cycle via __init__)"
        assert graph[name] <= SUBMODULES, f"dmlstudy.metrics.{name} imports unknown {graph[name] - SUBMODULES}"
    order = list(graphlib.TopologicalSorter(graph).static_order())  # raises CycleError on a cycle
    assert order[0] == "inputs" and graph["inputs"] == set()
    assert _imported_metrics_modules(ast.parse("from dmlstudy import metrics\nfrom . import a, b")) == {"", "a", "b"}


def _metrics_names_used(tree: ast.AST) -> set[str]:
    """Names a source file takes from dmlstudy.metrics: ``alias.name`` after ``from dmlstudy import metrics as
    alias``, and ``from dmlstudy.metrics import name``."""
    aliases, names = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "dmlstudy":
            aliases |= {alias.asname or alias.name for alias in node.names if alias.name == "metrics"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "dmlstudy.metrics":
            names |= {alias.name for alias in node.names}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            names.add(node.attr)
    return names


def test_every_name_the_project_takes_from_metrics_exists():
    files = [
        path
        for folder in ("dmlstudy", "tests", "benchmarks", "tools", "notebooks")
        for path in sorted((PROJECT / folder).rglob("*.py"))
        if "metrics" not in path.relative_to(PROJECT).parts[:2]  # the package itself
    ]
    with warnings.catch_warnings():  # other modules' invalid escape sequences are not this test's concern
        warnings.simplefilter("ignore")
        used = {path: _metrics_names_used(ast.parse(path.read_text(encoding="utf-8"))) for path in files}
    assert used[PROJECT / "dmlstudy" / "run" / "evaluation.py"] >= {"evaluate"}  # `metric_functions.evaluate`
    assert used[PROJECT / "tests" / "test_large_gallery.py"] >= {"nearest_neighbors", "GPU_MAX_K", "neighbours"}
    missing = {
        f"{path.relative_to(PROJECT)}: {name}" for path, names in used.items() for name in names if not hasattr(M, name)
    }
    assert not missing, f"names no longer in dmlstudy.metrics: {sorted(missing)}"


def test_class_subset_recall_is_recall_on_each_draws_classes():
    x, y = clustered(12, (3, 6), 8, noise=1.2, seed=4)
    values = M.class_subset_recall(x, y, classes=5, draws=4, seed=7)
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    for i, value in enumerate(values):
        drawn = np.random.default_rng([7, i]).choice(np.unique(y), size=5, replace=False)
        idx = np.flatnonzero(np.isin(y, drawn))
        hits = []
        for q in idx:  # brute force: the nearest other item of the drawn classes
            others = idx[idx != q]
            hits.append(y[others[np.argmax(unit[others] @ unit[q])]] == y[q])
        assert value == pytest.approx(np.mean(hits))
    every = M.class_subset_recall(x, y, classes=12, draws=2)
    assert every == pytest.approx([M.recall_at_k(x, y, ks=(1,))[1]] * 2)  # all classes: the full split's R@1
    with pytest.raises(ValueError, match=r"'classes' \(13\) exceeds the 12 classes"):
        M.class_subset_recall(x, y, classes=13)
