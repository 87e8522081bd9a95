"""Multi-Similarity on a similarity matrix against pytorch-metric-learning and a slow loop; the loss registry."""

import math

import pytest
import torch
import torch.nn.functional as F
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning import miners as pml_miners

from dmlstudy.losses import LOSSES, MultiSimilarityLoss, build_loss, multi_similarity_loss


def clustered_batch(classes=8, per_class=4, dim=16, spread=0.6, seed=0):
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, dim, generator=generator)
    labels = torch.arange(classes).repeat_interleave(per_class)
    embeddings = centres[labels] + spread * torch.randn(len(labels), dim, generator=generator)
    return embeddings, labels


def slow_multi_similarity(similarity, labels, alpha, beta, base, margin):
    """Eq. 9 of Wang et al. with the MS miner, one anchor at a time."""
    total = 0.0
    n = len(labels)
    for i in range(n):
        positives = [similarity[i, j].item() for j in range(n) if j != i and labels[j] == labels[i]]
        negatives = [similarity[i, j].item() for j in range(n) if labels[j] != labels[i]]
        if not positives or not negatives:
            continue
        kept_p = [s for s in positives if s - margin < max(negatives)]
        kept_n = [s for s in negatives if s + margin > min(positives)]
        total += math.log1p(sum(math.exp(-alpha * (s - base)) for s in kept_p)) / alpha
        total += math.log1p(sum(math.exp(beta * (s - base)) for s in kept_n)) / beta
    return total / n


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "alpha,beta,base,margin", [(2.0, 50.0, 0.5, 0.1), (2.0, 40.0, 0.5, 0.1), (1.0, 10.0, 0.7, 0.2)]
)
def test_ms_equals_pytorch_metric_learning(seed, alpha, beta, base, margin):
    embeddings, labels = clustered_batch(seed=seed)
    ours_input = embeddings.clone().requires_grad_(True)
    theirs_input = embeddings.clone().requires_grad_(True)
    ours = MultiSimilarityLoss(alpha=alpha, beta=beta, base=base, margin=margin)(ours_input, labels)
    miner = pml_miners.MultiSimilarityMiner(epsilon=margin)
    criterion = pml_losses.MultiSimilarityLoss(alpha=alpha, beta=beta, base=base)
    theirs = criterion(theirs_input, labels, miner(theirs_input, labels))
    assert ours.item() > 0
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    ours.backward()
    theirs.backward()
    torch.testing.assert_close(ours_input.grad, theirs_input.grad, rtol=1e-5, atol=1e-7)


def test_ms_on_arbitrary_similarity_matches_slow_loop():
    generator = torch.Generator().manual_seed(3)
    labels = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 3, 3])
    similarity = torch.rand(10, 10, generator=generator) * 2 - 1  # not symmetric, not cosine
    ours = multi_similarity_loss(similarity, labels, alpha=2, beta=50, base=0.5, margin=0.1)
    assert ours.item() == pytest.approx(slow_multi_similarity(similarity, labels, 2, 50, 0.5, 0.1), rel=1e-5)


def test_ms_mining_changes_the_loss_and_rejects_bad_shapes():
    embeddings, labels = clustered_batch(spread=0.2)
    normalized = F.normalize(embeddings, dim=1)
    similarity = normalized @ normalized.T
    assert multi_similarity_loss(similarity, labels, mining=False) > multi_similarity_loss(similarity, labels)
    with pytest.raises(ValueError, match="B × B"):
        multi_similarity_loss(similarity[:, :-1], labels)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_every_registered_loss_runs_and_has_a_gradient(name):
    embeddings, labels = clustered_batch()
    embeddings.requires_grad_(True)
    loss = build_loss(name, num_classes=8, embedding_dim=16)
    value = loss(F.normalize(embeddings, dim=1), labels)
    value.backward()
    assert torch.isfinite(value) and embeddings.grad.abs().sum() > 0


def test_unknown_loss_lists_valid_names():
    with pytest.raises(KeyError, match="valid names: .*triplet"):
        build_loss("tripplet", num_classes=2, embedding_dim=4)
