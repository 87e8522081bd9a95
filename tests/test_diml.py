"""DIML: Sinkhorn against a slow per-pair loop and exact assignment, invariances, re-ranking against the
cosine ranking, degenerate inputs, the base losses against pytorch-metric-learning, and training runs."""

import itertools
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from pytorch_metric_learning import losses as pml_losses
from scipy.optimize import linear_sum_assignment

import dmlstudy.structural.transport as transport_module
from dmlstudy import metrics
from dmlstudy.methods import build_method
from dmlstudy.methods.diml import (
    DIML,
    embed_grid_dataset,
    grid_embeddings,
    grid_pool,
    margin_loss_from_distances,
    proxy_nca_loss_from_distances,
)
from dmlstudy.models import build_backbone
from dmlstudy.run.train import run
from dmlstudy.structural.reranking import diml_rerank, rerank_top_k, reranked_retrieval_metrics
from dmlstudy.structural.transport import (
    TransportOptions,
    candidate_structural_similarity,
    normalize_marginal,
    pairwise_structural_similarity,
    sinkhorn,
    structural_similarity,
)


def unit(*shape, seed=0):
    return F.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), dim=-1)


def grid_set(n=6, cells=16, dim=24, seed=0):
    """Local embeddings sharing a per-image direction (so cross-correlations are mostly positive) + globals."""
    generator = torch.Generator().manual_seed(seed)
    shared = torch.randn(n, 1, dim, generator=generator)
    local = F.normalize(shared + 0.8 * torch.randn(n, cells, dim, generator=generator), dim=-1)
    return local, F.normalize(local.mean(dim=1), dim=-1)


# ---------------------------------------------------------------------------------------------- slow references


def reference_plan(cost, mu, nu, epsilon, iterations):
    """Sinkhorn for ONE pair in float64 numpy: a ← μ / K b, b ← ν / Kᵀ a, T = diag(a) K diag(b)."""
    kernel = np.exp(-cost / epsilon)
    a, b = np.ones_like(mu), np.ones_like(nu)
    for _ in range(iterations):
        a = mu / (kernel @ b)
        b = nu / (kernel.T @ a)
    return a[:, None] * kernel * b[None, :]


def reference_structural(local_s, global_s, local_t, global_t, epsilon=0.05, iterations=100, uniform=False):
    """s_struct of one pair (s, t), written from the definitions, and its plan."""
    local_s, global_s, local_t, global_t = (
        np.asarray(x, dtype=np.float64) for x in (local_s, global_s, local_t, global_t)
    )
    similarity = local_s @ local_t.T
    if uniform:
        mu, nu = np.full(len(local_s), 1 / len(local_s)), np.full(len(local_t), 1 / len(local_t))
    else:
        mu, nu = np.maximum(local_s @ global_t, 0), np.maximum(local_t @ global_s, 0)
        mu = mu / mu.sum() if mu.sum() > 0 else np.full(len(mu), 1 / len(mu))  # all-zero weights: uniform
        nu = nu / nu.sum() if nu.sum() > 0 else np.full(len(nu), 1 / len(nu))
    plan = reference_plan(1 - similarity, mu, nu, epsilon, iterations)
    return float((plan * similarity).sum()), plan


# ---------------------------------------------------------------------------------------------- transport


def modules_loaded_by(module: str) -> set[str]:
    """The dmlstudy modules a fresh interpreter holds after importing ``module``."""
    code = f"import sys, {module}; print(' '.join(name for name in sys.modules if name.startswith('dmlstudy')))"
    return set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())


def test_transport_and_reranking_work_on_embeddings_without_model_code():
    assert modules_loaded_by("dmlstudy.structural.transport") == {
        "dmlstudy",
        "dmlstudy.numerics",  # the package's face pins the numerics before torch loads
        "dmlstudy.structural",
        "dmlstudy.structural.transport",
    }
    reranking = modules_loaded_by("dmlstudy.structural.reranking")
    assert "dmlstudy.structural.reranking" in reranking and "dmlstudy.metrics" in reranking
    assert not {name for name in reranking if name.startswith(("dmlstudy.methods", "dmlstudy.models", "dmlstudy.data"))}


@pytest.mark.parametrize("log_domain", [False, True])
def test_plan_meets_both_marginals(log_domain):
    local, global_ = grid_set(n=5)
    _, _, transport = pairwise_structural_similarity(
        local, global_, options=TransportOptions(tolerance=1e-5, max_iterations=300, log_domain=log_domain)
    )
    plan = transport.plan  # 5 × 5 × 16 × 16
    mu = normalize_marginal(F.relu(torch.einsum("aid,bd->abi", local, global_)))
    nu = normalize_marginal(F.relu(torch.einsum("bjd,ad->abj", local, global_)))
    assert transport.log_domain is log_domain
    torch.testing.assert_close(plan.sum(dim=-1), mu, atol=1e-4, rtol=0)
    torch.testing.assert_close(plan.sum(dim=-2), nu, atol=1e-4, rtol=0)
    assert (plan >= 0).all()


def test_default_options_meet_marginals_within_tolerance():
    local, global_ = grid_set(n=6, seed=3)
    _, _, transport = pairwise_structural_similarity(local, global_)
    assert transport.iterations < 100 and transport.marginal_error <= TransportOptions().tolerance
    assert (transport.plan.sum(dim=-1) - transport.plan.sum(dim=-1).clamp(0, 1)).abs().max() == 0


@pytest.mark.parametrize("uniform", [False, True])
def test_batched_structural_similarity_equals_slow_per_pair_loop(uniform):
    local, global_ = grid_set(n=4, cells=9, dim=16, seed=1)
    options = TransportOptions(tolerance=0.0, max_iterations=60, uniform_marginals=uniform)
    similarity, _, transport = pairwise_structural_similarity(local, global_, options=options)
    for s, t in itertools.product(range(4), range(4)):
        expected, plan = reference_structural(
            local[s], global_[s], local[t], global_[t], iterations=transport.iterations, uniform=uniform
        )
        np.testing.assert_allclose(transport.plan[s, t].numpy(), plan, atol=1e-5)
        assert abs(similarity[s, t].item() - expected) < 1e-5


def test_each_pair_stops_on_its_own_so_batching_does_not_change_results():
    local, global_ = grid_set(n=5, seed=11)
    batched, _, transport = pairwise_structural_similarity(local, global_)
    assert transport.pair_iterations.min() < transport.pair_iterations.max()  # pairs did stop at different times
    for s, t in itertools.product(range(5), range(5)):
        alone, _, single = pairwise_structural_similarity(local[[s]], global_[[s]], local[[t]], global_[[t]])
        assert single.iterations == transport.pair_iterations[s, t]
        torch.testing.assert_close(alone[0, 0], batched[s, t], atol=1e-6, rtol=0)


def pairs_last_problem(pairs=300, cells=16, seed=0, log_domain=False):
    generator = torch.Generator().manual_seed(seed)
    cost = 2 * torch.rand(cells, cells, pairs, generator=generator)
    source = normalize_marginal(torch.rand(cells, pairs, generator=generator), dim=0)
    target = normalize_marginal(torch.rand(cells, pairs, generator=generator), dim=0)
    source[:3, :7] = 0.0  # zero-mass cells in some pairs
    source = normalize_marginal(source, dim=0)
    kernel = cost / -0.05
    return (kernel if log_domain else kernel.exp()), source, target


@pytest.mark.parametrize("log_domain", [False, True])
@pytest.mark.parametrize("read_every", [1, 3, 8])
def test_the_gpu_solver_stops_every_pair_where_the_compacting_one_does(log_domain, read_every):
    """The masked Sinkhorn loop CUDA uses, run on the CPU: same iterations per pair, same scalings."""
    kernel, source, target = pairs_last_problem(log_domain=log_domain)
    settings = dict(log_domain=log_domain, max_iterations=100, tolerance=1e-3)
    a, b, iterations = transport_module._sinkhorn_scalings(kernel, source, target, **settings)
    a_masked, b_masked, iterations_masked = transport_module._sinkhorn_scalings_masked(
        kernel, source, target, read_every=read_every, **settings
    )
    assert iterations.min() < iterations.max()  # pairs stopped at different iterations (some at the cap)
    assert torch.equal(iterations_masked, iterations)
    # float rounding (the widths differ; on the CPU the log domain iterates by absorption): 1e-4 relative on
    # the scalings, which is 1e-4 absolute on the potentials log a, log b
    close = dict(rtol=0, atol=1e-4) if log_domain else dict(rtol=1e-4, atol=0)
    torch.testing.assert_close(a_masked, a, **close)
    torch.testing.assert_close(b_masked, b, **close)


def test_absorbing_log_domain_solver_follows_the_log_sum_exp_iterations(monkeypatch):
    """At small ε the CPU's log domain iterates plain scalings and absorbs them into the potentials; it must
    run the same iterations as log-sum-exp updates (the masked solver, read every iteration), pair by pair."""
    generator = torch.Generator().manual_seed(3)
    cells, pairs, epsilon = 16, 400, 0.01
    cost = 2 * torch.rand(cells, cells, pairs, generator=generator)
    cost[:, 5, :50] = 2.0  # a target cell far from every source cell: its scaling must grow by e^(2/ε)
    source = normalize_marginal(torch.rand(cells, pairs, generator=generator), dim=0)
    source[:3, :7] = 0.0
    source = normalize_marginal(source, dim=0)
    target = normalize_marginal(torch.rand(cells, pairs, generator=generator), dim=0)
    log_kernel = cost / -epsilon
    absorbed, absorb = [], transport_module._absorbed

    def counted(log_kernel, f, g):
        absorbed.append(log_kernel.shape[-1])  # pairs whose kernel is (re)computed
        return absorb(log_kernel, f, g)

    monkeypatch.setattr(transport_module, "_absorbed", counted)
    settings = dict(log_domain=True, max_iterations=100, tolerance=1e-3)
    f, g, iterations = transport_module._sinkhorn_scalings(log_kernel, source, target, **settings)
    f_ref, g_ref, iterations_ref = transport_module._sinkhorn_scalings_masked(
        log_kernel, source, target, read_every=1, **settings
    )
    assert len(absorbed) > 1  # the first kernel, then absorptions of some pairs
    assert (iterations != iterations_ref).float().mean() < 0.01  # a stopping test may land across the tolerance
    plan, reference = (
        transport_module._plan(f, log_kernel, g, log_domain=True),
        transport_module._plan(f_ref, log_kernel, g_ref, log_domain=True),
    )
    assert torch.isfinite(plan).all()
    torch.testing.assert_close(plan, reference, atol=2e-4, rtol=0)
    torch.testing.assert_close(plan.sum(dim=0), target, atol=1e-5, rtol=0)  # columns exact after each b update
    alone = transport_module._sinkhorn_scalings(log_kernel[..., 60:61], source[:, 60:61], target[:, 60:61], **settings)
    assert alone[2].item() == iterations[60]  # batching changes nothing but the float rounding
    torch.testing.assert_close(alone[0][:, 0], f[:, 60], atol=1e-5, rtol=1e-6)


def test_cuda_gets_the_masked_solver_and_large_batches():
    assert transport_module._solver_for(torch.device("cuda", 0)) is transport_module._sinkhorn_scalings_masked
    assert transport_module._solver_for(torch.device("cpu")) is transport_module._sinkhorn_scalings
    assert transport_module._block_elements(torch.device("cuda")) > transport_module._block_elements(
        torch.device("cpu")
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_structural_similarity_on_cuda_equals_the_cpu():
    local, global_ = grid_set(n=12, seed=5)
    on_cpu, _, cpu_transport = pairwise_structural_similarity(local, global_)
    on_cuda, _, cuda_transport = pairwise_structural_similarity(local.cuda(), global_.cuda())
    assert torch.equal(cuda_transport.pair_iterations.cpu(), cpu_transport.pair_iterations)
    torch.testing.assert_close(on_cuda.cpu(), on_cpu, atol=1e-5, rtol=0)


def test_small_epsilon_approaches_the_optimal_assignment():
    """Uniform marginals on n × n cells: as ε → 0 the plan becomes a permutation / n (exact OT = assignment)."""
    generator = torch.Generator().manual_seed(4)
    similarity = 0.3 * torch.rand(5, 5, generator=generator)
    planted = torch.randperm(5, generator=generator)
    similarity[torch.arange(5), planted] += 0.5  # a clear optimum, far from ties at ε = 1e-3
    rows, cols = linear_sum_assignment(-similarity.numpy())
    best = similarity.numpy()[rows, cols].sum() / 5
    value, transport = structural_similarity(
        similarity[None],
        torch.ones(1, 5),
        torch.ones(1, 5),
        options=TransportOptions(epsilon=1e-3, max_iterations=300, tolerance=1e-6),
    )
    assert transport.log_domain
    assert abs(value.item() - best) < 1e-3
    assignment = np.zeros((5, 5))
    assignment[rows, cols] = 0.2
    np.testing.assert_allclose(transport.plan[0].numpy(), assignment, atol=1e-3)


def test_consistent_cell_permutations_leave_structural_similarity_unchanged():
    local, global_ = grid_set(n=3, seed=2)
    generator = torch.Generator().manual_seed(0)
    permuted = torch.stack(
        [image[torch.randperm(16, generator=generator)] for image in local]
    )  # a different permutation per image
    before, _, _ = pairwise_structural_similarity(local, global_)
    after, _, _ = pairwise_structural_similarity(permuted, global_)
    torch.testing.assert_close(after, before, atol=2e-5, rtol=0)


def test_degenerate_inputs_never_give_nan():
    # all-zero marginal weights fall back to uniform: the same plan as uniform marginals
    cells = unit(2, 16, 8, seed=6) @ unit(2, 16, 8, seed=7).transpose(1, 2)
    zero_value, zero_plan = structural_similarity(cells, torch.zeros(2, 16), torch.zeros(2, 16))
    uniform_value, uniform_plan = structural_similarity(
        cells, torch.zeros(2, 16), torch.zeros(2, 16), options=TransportOptions(uniform_marginals=True)
    )
    assert torch.isfinite(zero_value).all()
    torch.testing.assert_close(zero_value, uniform_value)
    torch.testing.assert_close(zero_plan.plan.sum(dim=(-2, -1)), torch.ones(2))
    # a global anti-correlated with every cell of the other image: zero weights on one side only
    local = unit(2, 4, 8, seed=8)
    global_ = torch.stack([F.normalize(local[0].mean(0), dim=0), -F.normalize(local[0].mean(0), dim=0)])
    value, _, transport = pairwise_structural_similarity(local[:1].repeat(2, 1, 1), global_)
    assert torch.isfinite(value).all() and torch.isfinite(transport.plan).all()
    # identical images, and small ε in both domains
    local, global_ = grid_set(n=2, seed=9)
    twins = torch.cat([local[:1], local[:1]]), torch.cat([global_[:1], global_[:1]])
    for options in (
        TransportOptions(),
        TransportOptions(epsilon=1e-3, log_domain=False),
        TransportOptions(epsilon=1e-3, log_domain=True),
    ):
        value, _, transport = pairwise_structural_similarity(*twins, options=options)
        assert torch.isfinite(value).all() and torch.isfinite(transport.plan).all(), options
        assert (value <= 1 + 1e-5).all()
    value, _, _ = pairwise_structural_similarity(*twins, options=TransportOptions(epsilon=1e-3))
    torch.testing.assert_close(value, torch.ones(2, 2), atol=1e-3, rtol=0)  # identical grids match cell to cell


def test_gradient_flows_through_similarities_only():
    local, global_ = grid_set(n=3, seed=10)
    local.requires_grad_(True)
    similarity, cells, transport = pairwise_structural_similarity(local, global_)
    assert not transport.plan.requires_grad
    similarity.sum().backward()
    # d/dẑ_a,i of Σ_ab Σ_ij T_abij ⟨ẑ_a,i, ẑ_b,j⟩ with T constant
    plan = transport.plan
    expected = torch.einsum("abij,bjd->aid", plan, local.detach()) + torch.einsum("abij,aid->bjd", plan, local.detach())
    torch.testing.assert_close(local.grad, expected, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------- grid features


def test_grid_pool_block_means_and_upsampling():
    feature_map = torch.randn(2, 3, 4, 4)
    pooled = grid_pool(feature_map, 2)
    for r, c in itertools.product(range(2), range(2)):
        torch.testing.assert_close(
            pooled[:, :, r, c], feature_map[:, :, 2 * r : 2 * r + 2, 2 * c : 2 * c + 2].mean(dim=(2, 3))
        )
    torch.testing.assert_close(grid_pool(feature_map, 1)[:, :, 0, 0], feature_map.mean(dim=(2, 3)))
    torch.testing.assert_close(grid_pool(feature_map, 4), feature_map)
    upsampled = grid_pool(feature_map, 7)  # 4 → 7: bilinear upsampling, then 1 × 1 cells
    assert upsampled.shape == (2, 3, 7, 7)
    torch.testing.assert_close(upsampled, F.interpolate(feature_map, size=(7, 7), mode="bilinear", align_corners=False))
    torch.testing.assert_close(grid_pool(torch.ones(1, 2, 4, 4), 3), torch.ones(1, 2, 3, 3))
    with pytest.raises(ValueError, match="grid_size"):
        grid_pool(feature_map, 0)


def test_grid_embeddings_of_a_baseline_model():
    torch.manual_seed(0)
    baseline = build_method("ms", backbone=build_backbone("dml_convnet"), embedding_dim=16, num_classes=4).eval()
    images = torch.randn(3, 3, 64, 64)
    global_, local = grid_embeddings(baseline, images, grid_size=2)
    torch.testing.assert_close(global_, baseline(images))
    assert local.shape == (3, 4, 16)
    cells = grid_pool(baseline.backbone(images), 2)  # B × C × 2 × 2
    torch.testing.assert_close(
        local[:, 1], F.normalize(baseline.embedding(cells[:, :, 0, 1]), dim=-1)
    )  # row-major cells
    _, single = grid_embeddings(baseline, images, grid_size=1)
    torch.testing.assert_close(single[:, 0], global_)  # G = 1 is the global embedding
    with pytest.raises(TypeError, match="embedding"):
        grid_embeddings(torch.nn.Linear(2, 2), images)


# ---------------------------------------------------------------------------------------------- re-ranking


def retrieval_set(n_classes=6, per_class=5, cells=4, dim=12, seed=0):
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(n_classes).repeat_interleave(per_class)
    centres = torch.randn(n_classes, cells, dim, generator=generator)
    local = F.normalize(centres[labels] + 1.2 * torch.randn(len(labels), cells, dim, generator=generator), dim=-1)
    return (
        local,
        F.normalize(local.mean(dim=1) + 0.5 * torch.randn(len(labels), dim, generator=generator), dim=-1),
        labels.numpy(),
    )


def test_candidate_similarities_equal_pairwise_matrix_entries():
    local, global_, _ = retrieval_set()
    candidates = np.random.default_rng(0).integers(0, len(local), size=(len(local), 7))
    options = TransportOptions(tolerance=0.0, max_iterations=40)
    ours = candidate_structural_similarity(global_, local, global_, local, candidates, options=options, query_chunk=4)
    for q in range(len(local)):
        for k, c in enumerate(candidates[q]):
            expected, _ = reference_structural(local[q], global_[q], local[c], global_[c], iterations=40)
            assert abs(ours[q, k] - expected) < 1e-5


def test_candidate_similarities_do_not_depend_on_the_query_chunks():
    """Pairs stop on their own, so how queries are batched (and how pairs enter the cache blocks) changes nothing."""
    local, global_, _ = retrieval_set(n_classes=8, per_class=6)
    candidates = np.random.default_rng(1).integers(0, len(local), size=(len(local), 9))
    whole = candidate_structural_similarity(global_, local, global_, local, candidates)
    for chunk in (1, 5, 48):
        np.testing.assert_allclose(
            candidate_structural_similarity(global_, local, global_, local, candidates, query_chunk=chunk),
            whole,
            atol=1e-6,
            rtol=0,
        )


@pytest.mark.parametrize("epsilon", [0.05, 0.01])
def test_candidate_similarities_equal_the_batch_matrix_in_both_domains(epsilon):
    """ε = 0.01 puts max C / ε past LOG_DOMAIN_RANGE: the candidate path (bound on the norms) and the batch
    matrix (max of its costs) must both switch to the log domain and agree."""
    local, global_, _ = retrieval_set(n_classes=4, per_class=3)
    options = TransportOptions(epsilon=epsilon, tolerance=0.0, max_iterations=50)
    matrix, _, transport = pairwise_structural_similarity(local, global_, options=options)
    assert transport.log_domain is (epsilon < 0.02)
    candidates = np.tile(np.arange(len(local)), (len(local), 1))
    ours = candidate_structural_similarity(global_, local, global_, local, candidates, options=options, query_chunk=5)
    np.testing.assert_allclose(ours, matrix.numpy(), atol=1e-5, rtol=0)


def test_top_k_zero_is_the_cosine_ranking():
    local, global_, labels = retrieval_set()
    reranking = diml_rerank(global_, local, top_k=0, num_neighbors=10)
    cosine, _ = metrics.nearest_neighbors(global_, k=10)
    np.testing.assert_array_equal(reranking.indices, cosine)
    table = reranked_retrieval_metrics(global_, local, labels, top_ks=[0, 5])
    expected = metrics.retrieval_metrics(global_, labels, ks=(1,))
    for name in ("P@1", "RP", "MAP@R"):
        assert table[0][name] == pytest.approx(expected[name])


def test_reranking_reorders_only_the_first_k_positions():
    local, global_, labels = retrieval_set(seed=1)
    top_k = 6
    reranking = diml_rerank(
        global_, local, top_k=top_k, num_neighbors=20, options=TransportOptions(tolerance=0.0, max_iterations=40)
    )
    np.testing.assert_array_equal(reranking.indices[:, top_k:], reranking.cosine_indices[:, top_k:])
    np.testing.assert_array_equal(np.sort(reranking.indices[:, :top_k]), np.sort(reranking.cosine_indices[:, :top_k]))
    for q in range(len(labels)):  # slow reference: sort each query's first K by cos + s_struct from the definitions
        candidates = reranking.cosine_indices[q, :top_k]
        scores = [
            float(global_[q] @ global_[c])
            + reference_structural(local[q], global_[q], local[c], global_[c], iterations=40)[0]
            for c in candidates
        ]
        np.testing.assert_array_equal(
            reranking.indices[q, :top_k], candidates[np.argsort(-np.array(scores), kind="stable")]
        )
    assert (reranking.indices != reranking.cosine_indices).any()  # the test data does get re-ranked


def test_rerank_top_k_keeps_ties_in_cosine_order_and_checks_arguments():
    indices = np.array([[5, 3, 9, 1]])
    cosine = np.array([[0.75, 0.5, 0.25, 0.125]], dtype=np.float32)
    structural = np.array([[0.0, 0.25, 0.5]], dtype=np.float32)  # all three scores tie at 0.75 (exact in binary)
    np.testing.assert_array_equal(rerank_top_k(indices, cosine, structural, top_k=3), indices)
    np.testing.assert_array_equal(rerank_top_k(indices, cosine, np.array([[0.0, 0.375, 0.0]]), top_k=3), [[3, 5, 9, 1]])
    with pytest.raises(ValueError, match="top_k"):
        rerank_top_k(indices, cosine, structural, top_k=4)


def test_grid_of_one_cell_reranks_to_the_cosine_order(tiny_config):
    """G = 1: the single cell is the global embedding, s_struct = cos, so cos + s_struct keeps the order."""
    result = run(tiny_config(method="ms", epochs=1, steps_per_epoch=1))
    from dmlstudy.run.data import load_datasets

    query = load_datasets(result.config)["query"]
    grids = embed_grid_dataset(result.method, query, grid_sizes=(1, 2))
    np.testing.assert_allclose(grids.global_, result.embeddings["embeddings"], atol=1e-5)
    table = reranked_retrieval_metrics(grids.global_, grids.local[1], grids.labels, top_ks=[0, 20])
    assert table[20] == pytest.approx(table[0])
    assert grids.local[2].shape == (len(query), 4, result.method.embedding_dim)


# ---------------------------------------------------------------------------------------------- losses and training


def clustered(classes=4, per_class=3, dim=8, seed=0):
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(classes).repeat_interleave(per_class)
    return torch.randn(classes, dim, generator=generator)[labels] + 0.7 * torch.randn(
        len(labels), dim, generator=generator
    ), labels


@pytest.mark.parametrize("seed", [0, 1])
def test_margin_loss_on_distances_equals_pml(seed):
    embeddings, labels = clustered(seed=seed)
    ours_input, theirs_input = embeddings.clone().requires_grad_(True), embeddings.clone().requires_grad_(True)
    unit_embeddings = F.normalize(ours_input, dim=1)
    distances = torch.sqrt((2 - 2 * unit_embeddings @ unit_embeddings.T).clamp_min(1e-8))
    ours = margin_loss_from_distances(distances, labels, margin=0.2, beta=1.2)
    theirs = pml_losses.MarginLoss(margin=0.2, beta=1.2)(theirs_input, labels)
    assert ours.item() > 0
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    ours.backward()
    theirs.backward()
    torch.testing.assert_close(ours_input.grad, theirs_input.grad, atol=1e-4, rtol=1e-4)


def test_proxy_nca_on_distances_equals_pml():
    embeddings, labels = clustered(seed=2)
    criterion = pml_losses.ProxyNCALoss(num_classes=4, embedding_size=8)
    proxies = F.normalize(criterion.proxies.detach(), dim=1)
    unit_embeddings = F.normalize(embeddings, dim=1)
    ours = proxy_nca_loss_from_distances(2 - 2 * unit_embeddings @ proxies.T, labels)
    torch.testing.assert_close(ours, criterion(embeddings, labels), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("base_loss,baseline", [("ms", "ms"), ("margin", "margin"), ("proxynca", "proxynca")])
def test_zero_structural_weight_is_the_baseline_loss(base_loss, baseline):
    torch.manual_seed(0)
    diml = build_method(
        "diml",
        backbone=build_backbone("dml_convnet"),
        embedding_dim=16,
        num_classes=4,
        base_loss=base_loss,
        structural_weight=0.0,
        grid_size=1,
    )
    reference = build_method(baseline, backbone=build_backbone("dml_convnet"), embedding_dim=16, num_classes=4)
    reference.backbone.load_state_dict(diml.backbone.state_dict())
    reference.embedding.load_state_dict(diml.embedding.state_dict())
    if base_loss == "proxynca":
        reference.criterion.proxies.data = diml.proxies.data[:, 0].clone()  # G = 1: the grid proxy is the proxy
    images, labels = torch.randn(8, 3, 32, 32), torch.arange(4).repeat_interleave(2)
    torch.testing.assert_close(diml.loss(images, labels)[0], reference.loss(images, labels)[0], atol=1e-5, rtol=1e-5)


def test_structural_term_changes_the_loss_and_identical_images_keep_gradients_finite():
    torch.manual_seed(1)
    images = torch.randn(8, 3, 32, 32)
    images = torch.cat([images, images[:2]])  # two images twice: identical pairs in the batch
    labels = torch.cat([torch.arange(4).repeat(2), torch.arange(2)])
    for base_loss in ("ms", "margin", "proxynca"):
        method = build_method(
            "diml", backbone=build_backbone("dml_convnet"), embedding_dim=16, num_classes=4, base_loss=base_loss
        )
        plain = build_method(
            "diml",
            backbone=build_backbone("dml_convnet"),
            embedding_dim=16,
            num_classes=4,
            base_loss=base_loss,
            structural_weight=0.0,
        )
        plain.load_state_dict(method.state_dict())
        loss, parts = method.loss(images, labels)
        assert parts["sinkhorn_iterations"] >= 1 and -1 <= parts["s_struct"] <= 1
        assert abs(loss.item() - plain.loss(images, labels)[0].item()) > 1e-6, base_loss
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in method.parameters() if p.grad is not None), base_loss
        assert method.embedding.weight.grad.abs().sum() > 0
    assert method.head_parameters()[0].shape == (4, 16, 16)  # proxynca: C × G² × d grid proxies


def test_bad_arguments_are_rejected():
    backbone = build_backbone("dml_convnet")
    with pytest.raises(ValueError, match="base_loss"):
        DIML(backbone, num_classes=2, base_loss="triplet")
    with pytest.raises(ValueError, match="loss_kwargs"):
        DIML(backbone, num_classes=2, base_loss="margin", loss_kwargs={"alpha": 2.0})
    with pytest.raises(ValueError, match="epsilon"):
        TransportOptions(epsilon=0.0)
    with pytest.raises(ValueError, match="marginals"):
        sinkhorn(torch.zeros(2, 3, 3), torch.ones(2, 4), torch.ones(2, 3))


@pytest.mark.parametrize(
    "method_kwargs",
    [
        {},
        {"base_loss": "margin"},
        {"base_loss": "proxynca"},
        {"uniform_marginals": True, "grid_size": 2},
        {"log_domain": True, "epsilon": 0.01, "max_iterations": 20},
    ],
)
def test_every_variant_trains_a_step(tiny_config, method_kwargs):
    result = run(tiny_config(method="diml", method_kwargs=method_kwargs, epochs=1, steps_per_epoch=1))
    assert np.isfinite(result.history["loss"]).all()
    assert 0.0 <= result.metrics["P@1"] <= 1.0 and "sinkhorn_iterations" in result.history


def test_sweep_frame_in_parallel_processes_equals_the_serial_sweeps(tiny_config):
    from dmlstudy.experiments.papers import diml as diml_study
    from dmlstudy.run.train import run

    settings = dict(top_ks=[0, 4], grid_sizes=[1, 2], grid_size=2, top_k=4)
    frames = []
    for workers, prefix in ((1, "serial"), (2, "parallel")):
        results = [
            ("ms", run(tiny_config(method="ms", seed=seed, run_name=f"{prefix}-{seed}", resume=True)))
            for seed in (0, 1)
        ]
        frames.append(diml_study.sweep_frame(results, diml_study.DIMLStudy(protocol={"workers": workers}, **settings)))
    serial, parallel = frames
    assert len(serial) == len(parallel) == 2 * (2 + 2)
    for metric in ("P@1", "RP", "MAP@R"):
        assert serial[metric].to_numpy() == pytest.approx(parallel[metric].to_numpy(), abs=1e-6)


def test_the_transport_stays_float32_under_bf16_autocast():
    """Every transport entry point switches autocast off: under bfloat16 autocast (the CUDA default) the cell
    similarities, the Sinkhorn products and the plan would otherwise run in bfloat16 (a cost error of ~0.002,
    ~10 % in exp(−C/ε) at ε = 0.021). Values, plans and gradients equal the float32 computation exactly."""
    torch.manual_seed(0)
    local = F.normalize(torch.randn(8, 4, 16) + 0.5, dim=-1).requires_grad_()
    global_ = F.normalize(local.detach().mean(1), dim=-1)
    options = TransportOptions(epsilon=0.021)
    plain, _, plain_transport = pairwise_structural_similarity(local, global_, options=options)
    (plain_gradient,) = torch.autograd.grad(plain.sum(), local)
    cost = 1 - torch.einsum("aid,bjd->abij", local.detach(), local.detach())
    marginal = torch.full(cost.shape[:-1], 0.25)
    plain_plan = sinkhorn(cost, marginal, marginal, options=options).plan
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed, cells, mixed_transport = pairwise_structural_similarity(local, global_, options=options)
        mixed_plan = sinkhorn(cost, marginal, marginal, options=options).plan
    (mixed_gradient,) = torch.autograd.grad(mixed.sum(), local)
    assert cells.dtype == mixed.dtype == mixed_plan.dtype == torch.float32
    assert torch.equal(mixed, plain) and torch.equal(mixed_transport.plan, plain_transport.plan)
    assert torch.equal(mixed_gradient, plain_gradient) and torch.equal(mixed_plan, plain_plan)


def test_the_notebooks_runs_are_its_declared_rows_named_as_before():
    """Per base loss the plain run (named as the loss) then, with ``train_diml``, the DIML-trained run (``diml``
    for Multi-Similarity, the run the comparison shares); DIML's training settings away from its defaults suffix
    the name. The figures' model is the first declared DIML-trained run present."""
    from dmlstudy.experiments.papers import diml as diml_study

    assert diml_study.variants(diml_study.DIMLStudy(base_losses=["ms", "margin"])) == {
        "ms": {"method": "ms"},
        "diml": {"method": "diml"},
        "margin": {"method": "margin"},
        "diml_margin": {"method": "diml", "method_kwargs": {"base_loss": "margin"}},
    }
    changed = diml_study.DIMLStudy(base_losses=["proxynca"], grid_size=2, epsilon=0.5, uniform_marginals=True)
    assert list(diml_study.variants(changed)) == ["proxynca", "diml_proxynca_g2_eps0.5_uniform"]
    assert list(diml_study.variants(diml_study.DIMLStudy(train_diml=False))) == ["ms"]
    trainings = diml_study.trainings(diml_study.DIMLStudy())
    assert trainings["diml_margin"] == ("margin", "DIML") and trainings["ms"] == ("ms", "baseline")
    assert next(iter(trainings)) == "diml"
    with pytest.raises(KeyError, match="unknown rows"):
        diml_study.variants(diml_study.DIMLStudy(base_losses=["triplet"]))
