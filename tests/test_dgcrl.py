"""DGCRL: the N-S layer, the margin, the Gram–Schmidt hook, the authors' clamp, GCRL's distance form,
each against a slow loop or a closed form; every variant trains a step through ``train.run``."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from dmlstudy.methods import build_method
from dmlstudy.methods.dgcrl import (
    DGCRL,
    centralized_ranking_loss,
    centre_accuracy,
    centre_orthogonality_loss,
    centre_softmax_loss,
    class_logits,
    gram_schmidt_gradient,
    margin_logits,
    mean_abs_cosine,
    normalize_scale,
    pooled_feature,
)
from dmlstudy.models import build_backbone
from dmlstudy.run.train import run


def small_method(**kwargs) -> DGCRL:
    torch.manual_seed(0)
    return build_method(
        kwargs.pop("name", "dgcrl"), backbone=build_backbone("dml_convnet"), embedding_dim=16, num_classes=5, **kwargs
    )


def batch(seed: int = 0, size: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(size, 3, 32, 32, generator=generator), torch.arange(size) % 5


@pytest.mark.parametrize("alpha", [1.0, 16.0, 128.0])
def test_normalize_scale_output_norm_is_alpha(alpha):
    features = torch.randn(7, 12) * torch.rand(7, 1) * 50
    torch.testing.assert_close(normalize_scale(features, alpha=alpha).norm(dim=1), torch.full((7,), alpha))
    method = small_method(alpha=alpha)
    torch.testing.assert_close(method.scaled_features(batch()[0]).norm(dim=1), torch.full((10,), alpha))


def test_pooled_feature_is_two_unit_halves():
    feature_map = torch.randn(3, 8, 4, 4)
    pooled = pooled_feature(feature_map)
    assert pooled.shape == (3, 16)
    torch.testing.assert_close(
        pooled[:, :8], feature_map.mean((2, 3)) / feature_map.mean((2, 3)).norm(dim=1, keepdim=True)
    )
    torch.testing.assert_close(pooled[:, 8:].norm(dim=1), torch.ones(3))
    with pytest.raises(ValueError, match="B × C × H × W"):
        pooled_feature(torch.randn(3, 8))


def test_margin_lowers_the_target_logit_by_exactly_m():
    logits, labels = torch.randn(6, 4), torch.tensor([0, 3, 1, 1, 2, 0])
    shifted = margin_logits(logits, labels, margin=4.0)
    for i in range(6):
        for j in range(4):
            expected = logits[i, j] - (4.0 if j == labels[i] else 0.0)
            assert math.isclose(float(shifted[i, j]), float(expected), abs_tol=1e-6)


def test_centre_softmax_loss_equals_a_loop():
    torch.manual_seed(1)
    scaled, centres, labels = (
        torch.randn(6, 5, dtype=torch.float64) * 3,
        torch.randn(4, 5, dtype=torch.float64),
        torch.tensor([0, 3, 1, 1, 2, 0]),
    )
    total = 0.0
    for i in range(6):
        scores = [float(scaled[i] @ centres[j]) - (4.0 if j == labels[i] else 0.0) for j in range(4)]
        total += -scores[int(labels[i])] + math.log(sum(math.exp(s) for s in scores))
    loss, logits = centre_softmax_loss(scaled, centres, labels, margin=4.0)
    assert math.isclose(float(loss), total / 6, rel_tol=1e-10)
    torch.testing.assert_close(logits, scaled @ centres.T)


def test_equal_centre_norms_make_the_softmax_a_distance_softmax():
    """Eq. 8: with ‖x̂‖ = α and equal ‖w_j‖, softmax(x̂ Wᵀ) = softmax(−½ ‖x̂ − w_j‖²)."""
    torch.manual_seed(2)
    scaled = normalize_scale(torch.randn(5, 6, dtype=torch.float64), alpha=3.0)
    centres = 2.0 * F.normalize(torch.randn(4, 6, dtype=torch.float64), dim=1)
    distances = torch.stack([torch.stack([(scaled[i] - centres[j]).norm() for j in range(4)]) for i in range(5)])
    torch.testing.assert_close((scaled @ centres.T).softmax(1), (-0.5 * distances**2).softmax(1))


def test_gcrl_equals_a_loop_over_samples_and_centres():
    torch.manual_seed(3)
    scaled = normalize_scale(torch.randn(7, 5, dtype=torch.float64), alpha=4.0)
    centres, labels = torch.randn(4, 5, dtype=torch.float64) * 3, torch.tensor([0, 1, 2, 3, 0, 1, 2])
    total = 0.0
    for i in range(7):
        distances = [math.dist(scaled[i].tolist(), centres[j].tolist()) for j in range(4)]
        positive = distances[int(labels[i])]
        negatives = [d for j, d in enumerate(distances) if j != labels[i]]
        total += max(0.0, 1.5 + positive - sum(negatives) / len(negatives))
    loss, negated = centralized_ranking_loss(scaled, centres, labels, margin=1.5)
    assert 0.0 < float(loss) and math.isclose(float(loss), total / 7, rel_tol=1e-9)
    assert math.isclose(float(-negated[2, 1]), math.dist(scaled[2].tolist(), centres[1].tolist()), rel_tol=1e-9)


def test_gram_schmidt_gradient_equals_a_loop():
    torch.manual_seed(4)
    gradient, centres, weight = torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64), 0.7
    classes = 4
    for i in range(classes):
        w = centres[i]
        expected = gradient[i] - (gradient[i] @ w) / (w @ w) * w
        for j in range(classes):
            if j != i:
                unit = centres[j] / centres[j].norm()
                expected = expected + weight / (classes * (classes - 1)) * (w @ unit) * unit
        torch.testing.assert_close(gram_schmidt_gradient(gradient, centres, weight=weight)[i], expected)


def test_gram_schmidt_push_vanishes_for_orthogonal_centres():
    centres, gradient = (
        torch.eye(3, dtype=torch.float64) * torch.tensor([[1.0], [2.0], [0.5]], dtype=torch.float64),
        torch.randn(3, 3, dtype=torch.float64),
    )
    with_push = gram_schmidt_gradient(gradient, centres, weight=5.0)
    torch.testing.assert_close(with_push, gram_schmidt_gradient(gradient, centres, weight=0.0))


def test_paper_hook_on_the_method_projects_each_centre_gradient_orthogonally():
    images, labels = batch()
    plain, hooked = small_method(decorrelation="none"), small_method(decorrelation="paper", decorrelation_weight=3.0)
    hooked.load_state_dict(plain.state_dict())
    for method in (plain, hooked):
        method.loss(images, labels)[0].backward()
    centres = hooked.centres.detach()
    classes = centres.shape[0]
    unit = centres / centres.norm(dim=1, keepdim=True)
    push = torch.stack(
        [sum(float(centres[i] @ unit[j]) * unit[j] for j in range(classes) if j != i) for i in range(classes)]
    )
    projected_part = hooked.centres.grad - 3.0 / (classes * (classes - 1)) * push
    cosines = F.cosine_similarity(projected_part, centres, dim=1)
    torch.testing.assert_close(cosines, torch.zeros(classes), atol=1e-5, rtol=0)
    torch.testing.assert_close(hooked.centres.grad, gram_schmidt_gradient(plain.centres.grad, centres, weight=3.0))
    assert (
        F.cosine_similarity(plain.centres.grad, centres, dim=1).abs().max() > 1e-2
    )  # without the hook it is not orthogonal
    torch.testing.assert_close(
        hooked.backbone.model.features[0].weight.grad, plain.backbone.model.features[0].weight.grad
    )


def toy_centre_correlation(weight: float, *, steps: int = 30) -> float:
    """Softmax with margin on fixed toy features, SGD on correlated centres with the ``paper`` hook."""
    generator = torch.Generator().manual_seed(5)
    classes, dim = 4, 3
    features = normalize_scale(torch.randn(40, dim, generator=generator), alpha=2.0)
    labels = torch.arange(40) % classes
    centres = torch.nn.Parameter(torch.ones(classes, dim) + 0.3 * torch.randn(classes, dim, generator=generator))
    optimizer = torch.optim.SGD([centres], lr=0.5)
    for _ in range(steps):
        alias = centres.view_as(centres)
        alias.register_hook(lambda g, values=centres.detach(): gram_schmidt_gradient(g, values, weight=weight))  # noqa: B008
        loss, _ = centre_softmax_loss(features, alias, labels, margin=0.5)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return float(mean_abs_cosine(centres.detach()))


def test_gram_schmidt_push_leaves_centres_less_correlated_than_lambda_zero():
    start = float(
        mean_abs_cosine(torch.ones(4, 3) + 0.3 * torch.randn(4, 3, generator=torch.Generator().manual_seed(5)))
    )
    without = toy_centre_correlation(0.0)
    for weight in (0.1, 1.0):
        with_push = toy_centre_correlation(weight)
        assert with_push < without - 0.1 and with_push < start


def test_code_regulariser_equals_a_loop():
    torch.manual_seed(6)
    centres = torch.randn(4, 3, dtype=torch.float64)
    total = 0.0
    for i in range(4):
        row = [float(centres[i] @ centres[j]) for j in range(4)]
        total += -row[i] + math.log(sum(math.exp(v) for v in row))
    assert math.isclose(float(centre_orthogonality_loss(centres)), total / 4, rel_tol=1e-10)


def test_code_variant_clamp_in_loss_equals_clamping_after_each_optimizer_step():
    images, labels = batch(seed=7)
    automatic = small_method(decorrelation="code")
    manual = copy.deepcopy(automatic)
    assert (automatic.centres < 0).any()
    opt_a = torch.optim.SGD(automatic.parameters(), lr=0.05)
    opt_m = torch.optim.SGD(manual.parameters(), lr=0.05)
    with torch.no_grad():
        manual.centres.clamp_(min=0.0)  # the clamp also precedes the first step
    for _ in range(3):
        loss_a, parts = automatic.loss(images, labels)
        opt_a.zero_grad()
        loss_a.backward()
        opt_a.step()
        scaled = manual.scaled_features(images)
        logits = scaled @ manual.centres.T
        loss_m = F.cross_entropy(logits - 4.0 * F.one_hot(labels, 5), labels) + 0.5 * F.cross_entropy(
            manual.centres @ manual.centres.T, torch.arange(5)
        )
        opt_m.zero_grad()
        loss_m.backward()
        opt_m.step()
        with torch.no_grad():
            manual.centres.clamp_(min=0.0)
        torch.testing.assert_close(loss_a, loss_m)
        assert "orthogonality" in parts
    automatic.project_centres_()
    torch.testing.assert_close(automatic.centres, manual.centres)
    assert (automatic.centres >= 0).all()


def test_shapes_gradients_and_options():
    images, labels = batch()
    method = small_method()
    assert method(images).shape == (10, 16)
    torch.testing.assert_close(method(images).norm(dim=1), torch.ones(10))
    loss, parts = method.loss(images, labels)
    loss.backward()
    assert method.centres.grad.abs().sum() > 0 and method.projection.weight.grad.abs().sum() > 0
    assert method.head_parameters() == [method.centres] and {"softmax", "centre_abs_cos", "train_accuracy"} <= set(
        parts
    )
    raw = small_method(projection=False)
    assert raw(images).shape == (10, 256) and raw.centres.shape == (5, 256)
    triplet = small_method(loss="triplet")
    assert triplet.centres is None and set(triplet.loss(images, labels)[1]) == {"triplet"}
    with pytest.raises(RuntimeError, match="no class centres"):
        class_logits(triplet, images)
    with pytest.raises(ValueError, match="decorrelation must be one of"):
        small_method(decorrelation="gram")
    gcrl = small_method(name="gcrl")
    assert gcrl.loss_name == "distance" and gcrl.decorrelation == "none" and "gcrl" in gcrl.loss(images, labels)[1]


def test_centre_accuracy_equals_a_loop():
    method = small_method(decorrelation="code").eval()
    images, labels = batch(seed=8, size=12)
    with torch.no_grad():
        scaled = method.scaled_features(images)
        centres = method.centres.clamp_min(0)
        predicted = [int(max(range(5), key=lambda j: float(scaled[i] @ centres[j]))) for i in range(12)]
    expected = sum(p == int(y) for p, y in zip(predicted, labels)) / 12
    assert centre_accuracy(method, TensorDataset(images, labels), batch_size=5) == pytest.approx(expected)
    gcrl = small_method(name="gcrl").eval()
    with torch.no_grad():
        scaled = gcrl.scaled_features(images)
        nearest = [min(range(5), key=lambda j: float((scaled[i] - gcrl.centres[j]).norm())) for i in range(12)]
    assert centre_accuracy(gcrl, TensorDataset(images, labels)) == pytest.approx(
        sum(p == int(y) for p, y in zip(nearest, labels)) / 12
    )


VARIANTS = [
    ("dgcrl", {}),
    ("dgcrl", {"decorrelation": "code"}),
    ("dgcrl", {"decorrelation": "none"}),
    ("dgcrl", {"decorrelation_weight": 0.0, "alpha": 1.0}),
    ("dgcrl", {"normalize_scale": False, "margin": 0.0, "decorrelation": "none"}),
    ("dgcrl", {"loss": "triplet"}),
    ("dgcrl", {"loss": "lifted", "projection": False}),
    ("gcrl", {}),
    ("gcrl", {"decorrelation": "paper"}),
]


@pytest.mark.parametrize("method,kwargs", VARIANTS)
def test_every_variant_trains_a_step(tiny_config, method, kwargs):
    result = run(tiny_config(method=method, method_kwargs=kwargs, epochs=1, steps_per_epoch=1))
    assert result.history["loss"].notna().all() and 0.0 <= result.metrics["R@1"] <= 1.0
    if result.method.centres is not None:
        assert result.history["train_accuracy"].between(0, 1).all()


def _run(variant: str, seed: int, r1: float, *, dataset: str = "synbirds", embeddings=None, labels=None):
    """A finished run as the study tables read it: its config, metrics, history and stored test embeddings."""
    from types import SimpleNamespace

    import numpy as np
    import pandas as pd

    config = SimpleNamespace(
        dataset=dataset, method="dgcrl", seed=seed, method_kwargs={}, run_dir="", patience=2, warmup_epochs=0
    )
    stored = {"embeddings": embeddings if embeddings is not None else np.eye(2), "labels": labels or [0, 1]}
    return variant, SimpleNamespace(config=config, metrics={"R@1": r1}, history=pd.DataFrame(), embeddings=stored)


@pytest.mark.parametrize(
    "dgcrl, verdict",
    [
        ([0.40, 0.41, 0.42], "held"),  # paired: +12, +11, +10 points over the softmax
        ([0.283, 0.30, 0.318], "equivalent"),  # +0.3, 0, −0.2: interval inside ±1
        ([0.29, 0.33, 0.29], "undecided (≈ "),  # +1, +3, −3
        ([0.20, 0.21, 0.22], "reversed"),
    ],
)
def test_declared_main_readings_follow_the_paired_verdict_rule(dgcrl, verdict):
    from dmlstudy.experiments import ablations
    from dmlstudy.experiments.papers import dgcrl as study

    values = {"ms": [0.45, 0.46, 0.47], "softmax": [0.28, 0.30, 0.32], "dgcrl": dgcrl}
    results = [_run(name, seed, r1) for name, runs in values.items() for seed, r1 in enumerate(runs)]
    table, (softmax, ms) = ablations.table(study.DECLARED, "main", results, study.DGCRLStudy())
    assert softmax.startswith("synbirds: DGCRL − softmax without N-S") and f"→ {verdict}" in softmax
    assert ms.startswith("synbirds: DGCRL − MS: ") and "→ reversed" in ms  # −5, −5, −5 points against MS
    assert list(table["paper R@1 (CUB)"]) == ["–", "–", 67.9]  # Table 1 has DGCRL's row only
    without = study.DGCRLStudy(main_variants=["ms", "dgcrl"])  # a reading naming a row left out is skipped
    kept = [run for run in results if run[0] != "softmax"]
    assert [s.split(":")[1] for s in ablations.table(study.DECLARED, "main", kept, without)[1]] == [" DGCRL − MS"]


def test_declared_tables_recompute_recall_at_the_notebook_ks_and_add_measured_columns():
    """``ks`` recomputes Recall@K from the stored test embeddings (K below the test-set size); ``columns`` adds a
    per-run measurement of (result, config), shown at its declared decimals."""
    import numpy as np

    from dmlstudy.experiments import ablations
    from dmlstudy.experiments.papers import dgcrl as study

    def seed_share(result, config):
        return result.config.seed / 8 + config.accuracy_items

    declared = ablations.Declaration(
        "dgcrl",
        "dgcrl",
        {},
        {"t": {"rows": {"a": {}}, "ks": "table_ks", "columns": {"share": {"of": "seed_share", "decimals": 3}}}},
        {"seed_share": seed_share},  # the measurements the paper's module registers, by name
    )
    embeddings = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9], [0.8, 0.2]])
    labels = [0, 0, 1, 1, 1]  # the last item's two nearest neighbours are of the other class: R@1 = R@2 = 4/5, R@4 = 1
    results = [_run("dgcrl", seed, 0.0, embeddings=embeddings, labels=labels) for seed in (0, 1)]
    config = study.DGCRLStudy(table_ks=[1, 2, 4, 8], accuracy_items=1)
    frame = ablations.run_frame(declared, "t", results, config)
    assert list(frame["setting"]) == ["a", "a"] and list(frame["share"]) == [1.0, 1.125]
    assert frame[["R@1", "R@2", "R@4"]].values.tolist() == [[0.8, 0.8, 1.0]] * 2
    assert "R@8" not in frame  # K = 8 ≥ 5 test items: left out
    table, _ = ablations.table(declared, "t", results, config)
    assert table.loc[0, "R@1"] == "80.0 ± 0.0" and table.loc[0, "R@4"] == "100.0 ± 0.0"
    assert table.loc[0, "share"] == "1.062 ± 0.088"


def test_alpha_reading_judges_paired_seeds():
    import pandas as pd

    from dmlstudy.experiments.papers.dgcrl import alpha_readings

    r1 = {1.0: [0.10, 0.12, 0.11], 16.0: [0.402, 0.41, 0.418], 128.0: [0.40, 0.41, 0.42]}
    runs = pd.DataFrame(
        [
            {"dataset": "synbirds", "α": alpha, "seed": seed, "R@1": value}
            for alpha, values in r1.items()
            for seed, value in enumerate(values)
        ]
    )
    (sentence,) = alpha_readings(runs)
    assert "α = 128 − α = 1: +30.00 R@1 points" in sentence and "→ held (the paper: poor at small α" in sentence
    assert "95 % CI [-0.50, +0.50], 3 paired seeds → equivalent (the paper: stable" in sentence  # −0.2, 0, +0.2


def test_the_loss_table_shows_dgcrl_alone_when_the_study_lists_no_other_loss():
    from dmlstudy.experiments import ablations
    from dmlstudy.experiments.papers import dgcrl

    alone = dgcrl.DGCRLStudy(losses=[])
    assert ablations.enabled(dgcrl.DECLARED, "losses", alone)
    assert [name for name, _ in ablations.table_rows(dgcrl.DECLARED, "losses", alone).values()] == ["dgcrl"]
    assert not ablations.enabled(dgcrl.DECLARED, "λ", dgcrl.DGCRLStudy(lambdas=[]))  # an empty sweep is skipped
    assert list(ablations.table_rows(dgcrl.DECLARED, "losses", dgcrl.DGCRLStudy(losses=["gcrl"]))) == ["dgcrl", "gcrl"]
