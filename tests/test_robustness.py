"""The robustness study's readings: each column by the study's rule, the pooled partitions over partition means,
the robust / fragile / open label, and the relatives-out recall, each against an independent computation."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dmlstudy.experiments import robustness
from dmlstudy.experiments.claims import Claim

CLAIM = Claim(name="A > B", kind="headline", a="a", b="b", runs="protocol", source="test")


def per_seed(perturbation: str, dataset: str, a: list[float], b: list[float]) -> pd.DataFrame:
    rows = [
        {"perturbation": perturbation, "regime": "imagenet", "dataset": dataset, "row": row, "seed": seed, "R@1": v}
        for row, values in (("a", a), ("b", b))
        for seed, v in enumerate(values)
    ]
    return pd.DataFrame(rows)


def t_interval(values: np.ndarray) -> tuple[float, float, float]:
    mean = values.mean()
    half = stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def test_each_column_and_the_pooled_partitions_against_scipy():
    rng = np.random.default_rng(0)
    frames, partition_means = [], []
    for name, dataset, shift in (
        ("default", "emoji", 3.0),
        ("partition 1", "emoji_p1", 1.0),
        ("partition 2", "emoji_p2", 2.5),
    ):
        b = rng.normal(50, 2, 5)
        a = b + shift + rng.normal(0, 0.5, 5)
        frames.append(per_seed(name, dataset, list(a), list(b)))
        partition_means.append((a - b).mean())
    table = robustness.robustness_table(pd.concat(frames, ignore_index=True), [CLAIM])
    cells = table.set_index("perturbation")
    mean, low, high = t_interval(
        np.asarray([*frames[0].query("row == 'a'")["R@1"]]) - frames[0].query("row == 'b'")["R@1"].to_numpy()
    )
    assert cells.loc["default", ["Δ", "CI low", "CI high"]].tolist() == pytest.approx([mean, low, high], abs=0.006)
    mean, low, high = t_interval(np.asarray(partition_means))  # 2 degrees of freedom
    pooled = cells.loc[robustness.POOLED]
    assert [pooled["Δ"], pooled["CI low"], pooled["CI high"]] == pytest.approx([mean, low, high], abs=0.006)
    assert pooled["model"] == "partition means" and pooled["seeds"] == 3 and "partitions" in pooled["covers"]
    assert cells.loc["30-epoch cap", "outcome"] == "not run" and cells.loc["30-epoch cap", "verdict"] == "not run"
    assert cells.loc["default", "outcome"] == "held"


@pytest.mark.parametrize(
    ("outcomes", "label"),
    [
        ({"default": "held", "30-epoch cap": "held", "224 px": "undecided"}, "robust"),
        ({"default": "reversed", "unseen designers": "reversed"}, "robust"),
        ({"default": "held", "224 px": "reversed"}, "fragile"),
        ({"default": "undecided", "224 px": "not run"}, "open"),
        ({"default": "held", "224 px": "not held"}, "open"),  # a direction beside an equivalence
        (
            {"default": "undecided", "partition 1": "held", "partition 2": "reversed"},
            "open",
        ),  # partitions alone do not count
        ({"partitions pooled": "reversed", "partition 1": "held"}, "robust"),
    ],
)
def test_robustness_label(outcomes, label):
    cells = pd.DataFrame({"perturbation": list(outcomes), "outcome": list(outcomes.values())})
    assert robustness.robustness_label(cells) == label


def test_relative_mask_removes_self_and_the_relative_family_only():
    families = ["noto", "noto-v1", "twemoji", "noto", "emojione-v1", "emojione"]
    mask = robustness.relative_mask(families)
    expected = np.array(
        [
            [
                families[j]
                == {"noto": "noto-v1", "noto-v1": "noto", "emojione": "emojione-v1", "emojione-v1": "emojione"}.get(
                    families[i]
                )
                or i == j
                for j in range(6)
            ]
            for i in range(6)
        ]
    )
    assert (mask == expected).all()


def test_relatives_out_recall_against_a_plain_loop():
    rng = np.random.default_rng(1)
    families = ["noto", "noto-v1", "twemoji", "emojione", "emojione-v1", "fxemoji"] * 5
    labels = np.repeat(np.arange(5), 6)
    embeddings = rng.normal(size=(30, 8)) + labels[:, None] * 0.3
    # the noto-v1 drawing of each class a near copy of its noto drawing: without the mask it is found first
    embeddings[1::6] = embeddings[0::6] + 1e-3
    normed = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    hits = []
    for i in range(30):
        allowed = [j for j in range(30) if j != i and robustness.RELATIVES.get(families[i]) != families[j]]
        best = max(allowed, key=lambda j: normed[i] @ normed[j])
        hits.append(labels[best] == labels[i])
    assert robustness.relatives_out_recall(embeddings, labels, families) == pytest.approx(100 * np.mean(hits))
    plain = 100 * np.mean(
        [
            labels[max((j for j in range(30) if j != i), key=lambda j: normed[i] @ normed[j])] == labels[i]
            for i in range(30)
        ]
    )
    assert plain > robustness.relatives_out_recall(embeddings, labels, families)  # the relatives helped


def test_reranked_recall_with_one_candidate_is_the_cosine_recall_and_never_picks_a_relative(monkeypatch):
    rng = np.random.default_rng(2)
    families = ["noto", "noto-v1", "twemoji", "fxemoji"] * 6
    labels = np.repeat(np.arange(6), 4)
    embeddings = rng.normal(size=(24, 6)) + labels[:, None]
    local = rng.normal(size=(24, 4, 6)).astype(np.float32)
    assert robustness.relatives_out_reranked_recall(embeddings, local, labels, families, top_k=1) == pytest.approx(
        robustness.relatives_out_recall(embeddings, labels, families)
    )
    chosen = {}

    def structural(gq, lq, gg, lg, candidates, **_):
        chosen["candidates"] = candidates
        return np.zeros(candidates.shape, dtype=np.float32)

    monkeypatch.setattr("dmlstudy.transport.candidate_structural_similarity", structural)
    robustness.relatives_out_reranked_recall(embeddings, local, labels, families, top_k=10)
    mask = robustness.relative_mask(families)
    assert not np.take_along_axis(mask, chosen["candidates"], axis=1).any()


def test_the_front_page_shows_the_committed_robustness_table():
    """The README's robustness table is the one `dmlstudy study robustness` writes, not a hand copy."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    table = pd.read_csv(root / "results" / "robustness" / "claims.csv")
    assert robustness.readme_markdown(table) in (root / "README.md").read_text()
    for name in robustness.columns_not_run(table):
        assert name in (root / "README.md").read_text().split("## Two commands")[0] or name.startswith("partition")
