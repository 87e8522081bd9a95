"""CRT (dmlstudy/methods/crt.py) against slow loops and hand computations, plus every ablation switch
training through ``dmlstudy.run.train.run``."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dmlstudy.methods import build_method
from dmlstudy.methods.crt import (
    CRT,
    BranchEmbedder,
    PrototypeBank,
    code_maps,
    coded_residuals,
    consistency_loss,
    diversity_loss,
    project_residuals,
    prototype_codes,
    prototype_correlation,
)
from dmlstudy.models import build_backbone


def softplus(value: float) -> float:
    return math.log1p(math.exp(value))


def slow_coded_residuals(
    tokens: torch.Tensor, prototypes: torch.Tensor, *, coding: str, residual_norm: str
) -> torch.Tensor:
    """r_k = Σ_j softplus(x_j·c_k)(x_j − c_k), one batch item, prototype and token at a time."""
    batch, count, channels = tokens.shape
    out = torch.zeros(batch, prototypes.shape[0], channels, dtype=torch.float64)
    for b in range(batch):
        for k in range(prototypes.shape[0]):
            total_code = 0.0
            for j in range(count):
                x, c = tokens[b, j].double(), prototypes[k].double()
                inner = float(x @ c) if coding == "softplus" else float(x @ c / (x.norm() * c.norm()))
                code = softplus(inner)
                total_code += code
                out[b, k] += code * (x - c)
            if residual_norm == "hw":
                out[b, k] /= count
            elif residual_norm == "codes":
                out[b, k] /= total_code
    return out


@pytest.mark.parametrize("coding", ["softplus", "cosine"])
@pytest.mark.parametrize("residual_norm", ["none", "hw", "codes"])
def test_coded_residuals_match_slow_loop(coding, residual_norm):
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randn(3, 7, 5, generator=generator, dtype=torch.float64)
    prototypes = torch.randn(4, 5, generator=generator, dtype=torch.float64)
    fast = coded_residuals(tokens, prototypes, coding=coding, residual_norm=residual_norm)
    assert fast.shape == (3, 4, 5)
    torch.testing.assert_close(
        fast, slow_coded_residuals(tokens, prototypes, coding=coding, residual_norm=residual_norm)
    )


def test_project_residuals_is_mean_of_per_prototype_maps():
    generator = torch.Generator().manual_seed(1)
    residuals = torch.randn(2, 3, 4, generator=generator, dtype=torch.float64)
    projections = torch.randn(3, 4, 6, generator=generator, dtype=torch.float64)
    slow = torch.zeros(2, 6, dtype=torch.float64)
    for b in range(2):
        for k in range(3):
            slow[b] += projections[k].T @ residuals[b, k]
    torch.testing.assert_close(project_residuals(residuals, projections), slow / 3)


def test_diversity_loss_by_hand():
    prototypes = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]])
    # |cos| of the pairs: (1,2) 0, (1,3) 1/√2, (2,3) 1/√2; ordered pairs count twice; K(K−1) = 6
    assert diversity_loss(prototypes).item() == pytest.approx(2 * (2 / math.sqrt(2)) / 6)
    assert diversity_loss(torch.randn(1, 5)).item() == 0.0


def test_consistency_loss_by_hand():
    generator = torch.Generator().manual_seed(2)
    first, second = torch.randn(5, 3, generator=generator), torch.randn(5, 8, generator=generator)
    total = 0.0
    for i in range(5):
        for j in range(5):
            s1 = float(first[i] @ first[j] / (first[i].norm() * first[j].norm()))
            s2 = float(second[i] @ second[j] / (second[i].norm() * second[j].norm()))
            total += abs(s1 - s2)
    assert consistency_loss(first, second).item() == pytest.approx(total / 25, rel=1e-5)
    assert consistency_loss(first, first).item() == pytest.approx(0.0, abs=1e-6)


def make_crt(**kwargs) -> CRT:
    torch.manual_seed(0)
    return build_method("crt", backbone=build_backbone("dml_convnet"), num_classes=4, **kwargs)


IMAGES = torch.randn(8, 3, 64, 64, generator=torch.Generator().manual_seed(3))
LABELS = torch.arange(4).repeat_interleave(2)


def test_shapes_normalisation_and_branch_views():
    method = make_crt(K1=8, K2=8, high_dim=48).eval()
    with torch.no_grad():
        first, second = method.embed_branches(IMAGES)
        assert first.shape == (8, 128) and second.shape == (8, 48)
        torch.testing.assert_close(first.norm(dim=1), torch.ones(8))
        torch.testing.assert_close(method(IMAGES), first)
        torch.testing.assert_close(BranchEmbedder(method, branch=2)(IMAGES), second)
    maps = code_maps(method, IMAGES[:2])
    assert maps.shape == (2, 8, 4, 4)
    feature_map = method.backbone(IMAGES[:2])
    c = method.bank(1).prototypes
    assert maps[1, 3, 2, 1].item() == pytest.approx(F.softplus(feature_map[1, :, 2, 1] @ c[3]).item(), rel=1e-5)
    correlation = prototype_correlation(method)
    torch.testing.assert_close(correlation, correlation.T)
    torch.testing.assert_close(correlation.diagonal(), torch.ones(8))


def test_loss_is_weighted_sum_of_independently_computed_parts():
    method = make_crt(K1=6, K2=6, high_dim=32, lambda_ms=0.7, lambda_con=0.3)
    method.eval()  # BatchNorm statistics fixed, so two passes see the same features
    total, parts = method.loss(IMAGES, LABELS)
    with torch.no_grad():
        first, second = method.embed_branches(IMAGES)
        ms = method.criterion(first, LABELS) + method.criterion(second, LABELS)
        unit = F.normalize(method.bank(1).prototypes, dim=1)
        cosine = (unit @ unit.T).abs()
        div = (cosine.sum() - cosine.trace()) / 30
        s1, s2 = first @ first.T, second @ second.T
        con = (s1 - s2).abs().mean()
    assert parts["div"] == pytest.approx(div.item(), rel=1e-5)
    assert parts["con"] == pytest.approx(con.item(), abs=1e-6)  # float32 cosines near 1: compare absolutely
    assert total.item() == pytest.approx((div + 0.7 * ms + 0.3 * con).item(), rel=1e-5)


@pytest.mark.parametrize("shared", [True, False])
def test_gradients_reach_backbone_prototypes_and_every_projection(shared):
    method = make_crt(K1=5, K2=5, high_dim=24, shared=shared)
    total, _ = method.loss(IMAGES, LABELS)
    total.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in method.backbone.parameters() if p.requires_grad)
    assert len(method.banks) == (1 if shared else 2)
    for bank in method.banks:
        assert bank.prototypes.grad.abs().sum(dim=1).gt(0).all()
    for head in method.heads:
        assert head.weight.grad.abs().flatten(1).sum(dim=1).gt(0).all()  # every Γ_k


def test_sharing_computes_residuals_once_and_has_fewer_parameters():
    calls = {"count": 0}

    def count(*_):
        calls["count"] += 1

    sizes = {}
    for shared in (True, False):
        method = make_crt(K1=4, K2=4, high_dim=16, shared=shared)
        for module in method.modules():
            if isinstance(module, PrototypeBank):
                module.register_forward_hook(count)
        calls["count"] = 0
        method.loss(IMAGES, LABELS)
        sizes[shared] = (calls["count"], sum(p.numel() for p in method.parameters()))
    assert sizes[True][0] == 1 and sizes[False][0] == 2
    assert sizes[False][1] - sizes[True][1] == 4 * 128  # one K × C bank more


def test_projection_init_bound_is_sqrt_k_over_sqrt_c_by_default():
    for kwargs, gain in (({"K1": 16, "K2": 16}, 4.0), ({"K1": 16, "K2": 16, "projection_gain": 1.0}, 1.0)):
        weight = make_crt(high_dim=16, **kwargs).heads[0].weight
        bound = gain / math.sqrt(128)
        assert weight.abs().max().item() <= bound and weight.abs().max().item() > 0.95 * bound


def test_invalid_options_raise():
    with pytest.raises(ValueError, match="K1 == K2"):
        make_crt(K1=4, K2=8)
    with pytest.raises(ValueError, match="coding"):
        make_crt(coding="dot")
    with pytest.raises(ValueError, match="no prototypes"):
        code_maps(make_crt(use_crt=False), IMAGES[:1])
    with pytest.raises(ValueError, match="branch"):
        make_crt(K1=2, K2=2).embed_branch(IMAGES[:1], 3)


def test_prototype_codes_cosine_bounds():
    codes = prototype_codes(torch.randn(2, 9, 4), torch.randn(3, 4), coding="cosine")
    assert codes.min() >= softplus(-1) - 1e-6 and codes.max() <= softplus(1) + 1e-6


ABLATIONS = {
    "default": {},
    "minus_crt": {"use_crt": False},
    "single_perspective": {"K1": 1, "K2": 1},
    "unshared": {"shared": False, "K1": 4, "K2": 8},
    "no_consistency": {"lambda_con": 0.0},
    "dims": {"high_dim": 64},
    "cosine_codes": {"coding": "cosine", "residual_norm": "codes"},
    "unnormalised": {"residual_norm": "none", "K1": 8, "K2": 8},
    "linear_init": {"projection_gain": 1.0},
}


@pytest.mark.parametrize("name", list(ABLATIONS))
def test_every_switch_trains_a_step(tiny_config, name):
    from dmlstudy.run.train import run

    result = run(
        tiny_config(method="crt", method_kwargs=ABLATIONS[name], epochs=1, steps_per_epoch=1, embedding_dim=32)
    )
    assert np.isfinite(result.history["loss"]).all()
    assert {"div", "ms1", "ms2", "con"} <= set(result.history.columns)
    assert 0.0 <= result.metrics["R@1"] <= 1.0
    assert result.embeddings["embeddings"].shape[1] == 32


def test_variant_names_share_runs_and_keep_the_reserved_names():
    from dmlstudy.experiments import ablations
    from dmlstudy.experiments.papers import crt as study

    declared = study.DECLARED
    assert ablations.variant(declared) == ("crt", {"method": "crt"})
    defaults = {"K1": 64, "K2": 64, "lambda_con": 0.9}  # the method's own defaults are dropped from the name
    assert ablations.variant(declared, kwargs=defaults) == ("crt", {"method": "crt"})
    assert ablations.variant(declared, method="ms") == ("ms", {"method": "ms"})
    config = study.CRTStudy(k1_values=[4], lambda2_values=[0.0], batch_sizes=[32])
    k1 = ablations.table_rows(declared, "K1", config)
    assert list(k1) == [4, 64] and k1[64][0] == "crt-shared=False"
    assert ablations.table_rows(declared, "λ2", config)[0.9][0] == "crt"
    batch = ablations.table_rows(declared, "N", config)
    assert batch[32][1]["classes_per_batch"] == 32 // config.protocol.samples_per_class
    with pytest.raises(ValueError, match="multiple"):
        ablations.table_rows(declared, "N", study.CRTStudy(batch_sizes=[30]))
    with pytest.raises(KeyError, match="takes no"):
        ablations.variant(declared, kwargs={"K3": 2})
