"""Cross-image attention (Kotovenko et al.): the batched hierarchy against a slow loop over pairs, inference,
gradients, parameter counts, symmetry, the recorder, test-time scoring, and every option training a step."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dmlstudy import metrics
from dmlstudy.losses import multi_similarity_loss
from dmlstudy.methods import build_method
from dmlstudy.methods.cross_attention import (
    AttentionRecorder,
    CrossAttention,
    conditional_retrieval,
    conditional_similarities,
    pair_similarity,
)
from dmlstudy.models import build_backbone
from dmlstudy.run.train import run

EMBEDDING_DIM = 16


def make_method(seed: int = 0, **kwargs) -> CrossAttention:
    """A double-precision method whose LayerNorm and bias parameters are randomised (so all of them matter)."""
    torch.manual_seed(seed)
    method = build_method(
        "cross_attention", backbone=build_backbone("dml_convnet"), embedding_dim=EMBEDDING_DIM, num_classes=4, **kwargs
    )
    with torch.no_grad():
        for block in method.blocks:
            block.norm.weight.uniform_(0.5, 1.5)
            block.norm.bias.normal_(0.0, 0.1)
            for linear in (block.query, block.key, block.value):
                linear.weight.normal_(0.0, 0.3)
                linear.bias.normal_(0.0, 0.3)
    return method.double()


def random_maps(count: int, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(count, 128, 2, 3, generator=generator, dtype=torch.float64)  # non-square grid on purpose


def slow_attention(block, query: torch.Tensor, feature_map: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One CA call for ONE conditioning vector and ONE image, written out: (weights over locations, output)."""
    tokens = feature_map.reshape(feature_map.shape[0], -1).T  # T × C
    normalized = F.layer_norm(tokens, (tokens.shape[1],), block.norm.weight, block.norm.bias, block.norm.eps)
    keys = normalized @ block.key.weight.T + block.key.bias
    values = normalized @ block.value.weight.T + block.value.bias
    projected = block.query.weight @ (query / query.norm()) + block.query.bias
    weights = torch.softmax(keys @ projected / math.sqrt(projected.shape[0]), dim=0)
    return weights, weights @ values


def slow_phi(
    method: CrossAttention, maps: torch.Tensor, level: int, i: int, j: int, cache: dict | None = None
) -> torch.Tensor:
    """φⁿ(i|j) by the recursion of Eq. 4, one pair at a time (memoised per (level, i, j) within ``cache``)."""
    cache = {} if cache is None else cache
    key = (id(maps), level, i, j)
    if key not in cache:
        if level == 0:
            cache[key] = method.embedding.weight @ maps[i].mean(dim=(1, 2)) + method.embedding.bias
        else:
            _, attended = slow_attention(method.block(level), slow_phi(method, maps, level - 1, j, i, cache), maps[i])
            cache[key] = attended + slow_phi(method, maps, level - 1, i, j, cache) if method.residual else attended
    return cache[key]


def slow_similarity(
    method: CrossAttention, maps: torch.Tensor, level: int, i: int, j: int, cache: dict | None = None
) -> torch.Tensor:
    return F.cosine_similarity(
        slow_phi(method, maps, level, i, j, cache), slow_phi(method, maps, level, j, i, cache), dim=0
    )


def slow_matrix(method: CrossAttention, maps: torch.Tensor, level: int, rows, columns) -> torch.Tensor:
    """sⁿ for every (row, column) pair of indices into ``maps``, one pair at a time."""
    cache: dict = {}
    with torch.no_grad():
        return torch.stack(
            [torch.stack([slow_similarity(method, maps, level, i, j, cache) for j in columns]) for i in rows]
        )


@pytest.mark.parametrize(
    "options", [{}, {"shared_blocks": False}, {"residual": True}, {"shared_blocks": False, "residual": True}]
)
def test_batched_hierarchy_equals_slow_loop_over_pairs(options):
    method = make_method(num_blocks=3, **options)
    maps = random_maps(4)
    levels = method.conditional_embeddings(maps)
    assert len(levels) == 4 and all(level.shape == (4, 4, EMBEDDING_DIM) for level in levels)
    cache: dict = {}
    for n, level in enumerate(levels):
        for i in range(4):
            for j in range(4):
                torch.testing.assert_close(level[i, j], slow_phi(method, maps, n, i, j, cache))
        expected = slow_matrix(method, maps, n, range(4), range(4))
        torch.testing.assert_close(pair_similarity(level), expected)


def test_test_time_scores_between_two_sets_equal_slow_loop():
    method = make_method(num_blocks=2, shared_blocks=False, residual=True)
    maps = random_maps(5)
    queries, candidates = maps[:3], maps[3:]
    scores = conditional_similarities(method, queries, candidates, levels=[0, 1, 2], chunk_size=2)
    for n in (0, 1, 2):
        assert scores[n].shape == (3, 2)
        expected = slow_matrix(method, maps, n, range(3), range(3, 5))
        torch.testing.assert_close(scores[n], expected)


def test_inference_is_the_plain_unconditional_embedding_and_runs_no_attention():
    method = make_method(num_blocks=6).eval()
    images = torch.randn(5, 3, 64, 64, dtype=torch.float64)
    pooled = method.backbone(images).mean(dim=(2, 3))
    expected = F.normalize(pooled @ method.embedding.weight.T + method.embedding.bias, dim=1)
    with AttentionRecorder(method) as recorder:
        embeddings = method(images)
    assert recorder.maps == []
    torch.testing.assert_close(embeddings, expected)
    level0 = method.conditional_embeddings(method.backbone(images), num_levels=0)[0]
    torch.testing.assert_close(F.normalize(level0[:, 0], dim=1), expected)


def test_similarities_are_symmetric_with_unit_diagonal():
    method = make_method(num_blocks=4, shared_blocks=False)
    maps = random_maps(6, seed=3)
    for level in method.conditional_embeddings(maps):
        similarity = pair_similarity(level)
        torch.testing.assert_close(similarity, similarity.T)
        torch.testing.assert_close(similarity.diagonal(), torch.ones(6, dtype=torch.float64))
    for similarity in conditional_similarities(method, maps, chunk_size=4).values():
        torch.testing.assert_close(similarity, similarity.T)


def test_loss_is_multi_similarity_on_the_last_level_plus_optional_s0():
    maps = random_maps(6, seed=4)
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    for unconditional in (False, True):
        method = make_method(num_blocks=2, unconditional_loss=unconditional)
        method.backbone = torch.nn.Identity()  # feed feature maps directly
        loss, parts = method.loss(maps, labels)
        s2 = slow_matrix(method, maps, 2, range(6), range(6))
        expected = multi_similarity_loss(s2, labels)
        assert parts["ms_s2"] == pytest.approx(float(expected))
        if unconditional:
            s0 = slow_matrix(method, maps, 0, range(6), range(6))
            expected = expected + multi_similarity_loss(s0, labels)
            assert parts["ms_s0"] > 0
        torch.testing.assert_close(loss, expected)


def test_gradients_reach_the_backbone_through_the_attention_path():
    images, labels = torch.randn(8, 3, 32, 32, dtype=torch.float64), torch.arange(4).repeat_interleave(2)
    # With φ's weight at zero, φ⁰ is a constant: the pooling path gives the backbone no gradient at all …
    baseline = build_method(
        "ms", backbone=build_backbone("dml_convnet"), embedding_dim=EMBEDDING_DIM, num_classes=4
    ).double()
    method = make_method(num_blocks=2)
    for model in (baseline, method):
        with torch.no_grad():
            model.embedding.weight.zero_()
            model.embedding.bias.normal_()
    baseline.loss(images, labels)[0].backward()
    assert baseline.backbone.model.features[0].weight.grad.abs().sum() == 0
    # … while the keys and values of the cross-attention blocks still carry the loss to E.
    method.loss(images, labels)[0].backward()
    assert method.backbone.model.features[0].weight.grad.abs().sum() > 0
    assert method.embedding.weight.grad.abs().sum() > 0


def test_hierarchy_gradient_matches_finite_differences():
    method = make_method(num_blocks=2, shared_blocks=False)
    maps = random_maps(3, seed=6)[:, :, :1, :2].clone().requires_grad_(True)
    similarity = lambda m: pair_similarity(method.conditional_embeddings(m)[-1])  # noqa: E731
    assert torch.autograd.gradcheck(similarity, (maps,), eps=1e-6, atol=1e-5, fast_mode=True)


def test_parameter_counts_shared_versus_independent():
    def count(module):
        return sum(p.numel() for p in module.parameters())

    channels, d, blocks = 128, EMBEDDING_DIM, 6
    per_block = 2 * channels + (d * d + d) + 2 * (channels * d + d)  # LayerNorm, Q, K, V
    baseline = count(build_method("ms", backbone=build_backbone("dml_convnet"), embedding_dim=d, num_classes=4))
    shared = count(make_method(num_blocks=blocks))
    independent = count(make_method(num_blocks=blocks, shared_blocks=False))
    none = count(make_method(num_blocks=0))
    assert none == baseline
    assert shared == baseline + per_block
    assert independent == baseline + blocks * per_block


def test_zero_blocks_is_the_ms_baseline():
    images, labels = torch.randn(8, 3, 32, 32), torch.arange(4).repeat_interleave(2)
    torch.manual_seed(11)
    baseline = build_method("ms", backbone=build_backbone("dml_convnet"), embedding_dim=EMBEDDING_DIM, num_classes=4)
    torch.manual_seed(11)
    method = build_method(
        "cross_attention",
        backbone=build_backbone("dml_convnet"),
        embedding_dim=EMBEDDING_DIM,
        num_classes=4,
        num_blocks=0,
    )
    torch.testing.assert_close(method.embedding.weight, baseline.embedding.weight)
    torch.testing.assert_close(method.loss(images, labels)[0], baseline.loss(images, labels)[0])


def test_recorder_reads_the_weights_of_every_level():
    method = make_method(num_blocks=3, shared_blocks=False)
    maps = random_maps(3, seed=8)
    with AttentionRecorder(method) as recorder:
        method.conditional_embeddings(maps)
    assert len(recorder.maps) == 3 and recorder.maps[0].shape == (3, 3, 6)
    for n, weights in enumerate(recorder.maps, start=1):
        torch.testing.assert_close(weights.sum(-1), torch.ones(3, 3, dtype=torch.float64))
        for i in range(3):
            for j in range(3):
                expected, _ = slow_attention(method.block(n), slow_phi(method, maps, n - 1, j, i), maps[i])
                torch.testing.assert_close(weights[i, j], expected)
    method.conditional_embeddings(maps)
    assert len(recorder.maps) == 3  # hooks removed on exit


def test_level_zero_retrieval_equals_the_standard_evaluation():
    method = make_method(num_blocks=2)
    maps = random_maps(12, seed=9)
    labels = np.repeat(np.arange(4), 3)
    results = conditional_retrieval(method, maps, labels, levels=[0, 2], ks=(1, 2))
    embeddings = F.normalize(method.unconditional(maps), dim=1).detach().numpy()
    expected = metrics.retrieval_metrics(embeddings, labels, ks=(1, 2))
    for key in ("R@1", "R@2", "MAP@R"):
        assert results[0][key] == pytest.approx(expected[key])
    assert set(results) == {0, 2} and 0.0 <= results[2]["R@1"] <= 1.0


def test_bad_input_raises_with_a_message():
    with pytest.raises(ValueError, match="num_blocks"):
        build_method("cross_attention", backbone=build_backbone("dml_convnet"), num_classes=2, num_blocks=-1)
    method = make_method(num_blocks=2)
    with pytest.raises(ValueError, match="levels must be in 0..2"):
        conditional_similarities(method, random_maps(2), levels=[3])
    with pytest.raises(ValueError, match="B × C × H × W"):
        method.conditional_embeddings(torch.randn(2, 128, 4, dtype=torch.float64))


@pytest.mark.parametrize(
    "method_kwargs",
    [
        {},
        {"num_blocks": 2, "shared_blocks": False, "residual": True},
        {"num_blocks": 1, "unconditional_loss": True, "loss_kwargs": {"beta": 40.0}},
        {"num_blocks": 0},
    ],
)
def test_every_option_trains_a_step(tiny_config, method_kwargs):
    name = "-".join(f"{k}={v}" for k, v in method_kwargs.items()).replace(" ", "") or "default"
    result = run(
        tiny_config(method="cross_attention", method_kwargs=method_kwargs, run_name=name, epochs=1, steps_per_epoch=1)
    )
    assert np.isfinite(result.history["loss"]).all()
    assert 0.0 <= result.metrics["R@1"] <= 1.0
    final = f"ms_s{method_kwargs.get('num_blocks', 6)}"
    assert final in result.history.columns
    assert ("ms_s0" in result.history.columns) == (bool(method_kwargs.get("unconditional_loss")) or final == "ms_s0")


def test_the_declared_variants_keep_their_run_names():
    from dmlstudy.experiments import ablations
    from dmlstudy.experiments.papers import cross_attention as study

    declared, final = study.DECLARED, ablations.FINAL_EVALUATION_ONLY
    config = study.CrossAttentionStudy(block_counts=[0, 2, 6], options=["residual"])
    assert ablations.table_rows(declared, "main", config) == {
        "ms": ("ms", {"method": "ms"}),
        "cross_attention": ("cross_attention", {"method": "cross_attention"}),
    }
    blocks = ablations.table_rows(declared, "blocks", config)
    assert blocks[0] == ("ms", {"method": "ms"})  # no blocks: the MS baseline's own run
    assert blocks[6] == (
        "cross_attention-num_blocks=6",
        {"method": "cross_attention", "method_kwargs": {"num_blocks": 6}, **final},
    )
    options = ablations.table_rows(declared, "options", config)
    assert [name for name, _ in options.values()] == ["cross_attention", "cross_attention-residual=True"]
    parameters = ablations.table_rows(declared, "parameters", config)
    assert [name for name, _ in parameters.values()] == ["ms", "cross_attention", "ms-backbone=test_resnet"]
    assert list(parameters.values())[-1][1] == {"method": "ms", "backbone": "test_resnet", "output_stride": 16, **final}
    gradients = ablations.table_rows(declared, "gradients")
    assert [name for name, _ in gradients.values()] == [
        "ms",
        "cross_attention-num_blocks=1",
        "cross_attention-num_blocks=2",
        "cross_attention",
        "cross_attention-residual=True",
        "cross_attention-unconditional_loss=True",
    ]
