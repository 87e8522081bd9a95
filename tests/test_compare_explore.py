"""The comparison notebook's logic (best-per-column marking, the fewer-seeds note, claims, DIML re-ranking
rows, figures/README.md) and the explorer's run discovery, loading and drawing."""

import json
import math

import matplotlib
import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dmlstudy import numerics  # noqa: E402
from dmlstudy.experiments import compare, explore, kit, regime_comparison, rerank, tables  # noqa: E402
from dmlstudy.findings import claims as claims_module
from dmlstudy.findings.claims import (  # noqa: E402
    CLAIMS,
    NO_SELECTION,
    ablation_grid,
    claim_reranks,
    claim_sentences,
    claim_variants,
    claims_table,
    forest_figure,
    load_claims,
)
from dmlstudy.paths import project_root  # noqa: E402
from dmlstudy.rows import classic_rows, main_rows  # noqa: E402
from dmlstudy.run.train import TrainConfig  # noqa: E402
from dmlstudy.study import figure_index


def run_rows(spec):
    """Per-run rows from {(dataset, variant, group): [(R@1, MAP@R), …]} (fractions)."""
    rows = []
    for (dataset, variant, group), values in spec.items():
        for seed, (r1, mapr) in enumerate(values):
            rows.append(
                {"dataset": dataset, "variant": variant, "group": group, "seed": seed, "R@1": r1, "MAP@R": mapr}
            )
    return pd.DataFrame(rows)


def test_best_per_column_is_marked_on_a_hand_made_frame():
    frame = run_rows(
        {
            ("a", "ms", "main"): [(0.50, 0.20), (0.60, 0.30)],  # R@1 55.0, MAP@R 25.0
            ("a", "crt", "main"): [(0.7004, 0.10), (0.7004, 0.10)],  # R@1 70.04 → shown 70.0, MAP@R 10.0
            ("a", "triplet", "classic"): [
                (0.7001, math.nan)
            ],  # R@1 70.01 → shown 70.0 (tie as displayed); MAP@R missing
            ("b", "ms", "main"): [(0.30, 0.40), (0.30, 0.40)],
            ("b", "crt", "main"): [(0.20, 0.50), (0.40, 0.30)],  # R@1 mean 30.0 = ms (tie), MAP@R 40.0 = ms (tie)
            ("b", "triplet", "classic"): [(0.10, 0.90)],
        }
    )
    table = tables.comparison_table(frame, metrics=["R@1", "MAP@R"])
    best = {
        (d, v): (r, m) for d, v, r, m in zip(table["dataset"], table["variant"], table["best R@1"], table["best MAP@R"])
    }
    assert best == {
        ("a", "ms"): (False, True),
        ("a", "crt"): (True, False),
        ("a", "triplet"): (True, False),
        ("b", "ms"): (True, False),
        ("b", "crt"): (True, False),
        ("b", "triplet"): (False, True),
    }
    shown = tables.bold_best(table, ["R@1", "MAP@R"]).set_index(["dataset", "variant"])
    assert shown.loc[("a", "crt"), "R@1"] == "**70.0 ± 0.0**"
    assert shown.loc[("a", "ms"), "R@1"] == "55.0 ± 7.1"  # std of (50, 60) = 7.07
    assert shown.loc[("a", "ms"), "MAP@R"] == "**25.0 ± 7.1**"
    assert not shown.loc[("a", "triplet"), "MAP@R"].startswith("**")


def test_the_table_says_when_classic_baselines_ran_with_fewer_seeds():
    frame = run_rows(
        {
            ("synbirds", "ms", "main"): [(0.5, 0.2)] * 3,
            ("synbirds", "crt", "main"): [(0.6, 0.3)] * 3,
            ("synbirds", "triplet", "classic"): [(0.4, 0.1)],
        }
    )
    fewer = compare.CompareStudy(
        protocol={"seeds": [0, 1, 2]}, methods=["ms", "crt"], classic_methods=["triplet"], classic_seeds=[0]
    )
    table = tables.comparison_table(frame, metrics=["R@1", "MAP@R"])
    assert table.set_index("variant").loc["triplet", "method"] == "triplet †"
    assert table.set_index("variant").loc["triplet", "seeds"] == "0"
    assert table.set_index("variant").loc["ms", "method"] == "MS baseline"
    markdown = tables.comparison_markdown(table, fewer.protocol, dataset="synbirds", note=fewer.table_note())
    assert "† classic baselines ran with 1 seed(s) (0) only, the main methods with 3 (0, 1, 2)" in markdown
    assert fewer.protocol.protocol_text() in markdown
    assert "**60.0 ± 0.0**" in markdown  # crt's R@1 is the best
    same = compare.CompareStudy(
        protocol={"seeds": [0]}, methods=["ms", "crt"], classic_methods=["triplet"], classic_seeds=[0]
    )
    assert "†" not in same.table_note()
    assert "†" not in tables.comparison_table(frame[frame["seed"] == 0], metrics=["R@1"])["method"].str.cat()


def test_config_rejects_unknown_methods_and_missing_classic_seeds():
    with pytest.raises(ValueError, match="unknown methods \\['nope'\\]; valid:.*crt"):
        compare.CompareStudy(methods=["ms", "nope"])
    with pytest.raises(ValueError, match="classic_seeds"):
        compare.CompareStudy(classic_methods=["triplet"], classic_seeds=[])
    with pytest.raises(ValueError, match="main method"):
        compare.CompareStudy(classic_methods=["diml_rerank"])
    assert compare.trained_methods(["diml_rerank", "crt", "ms"]) == ["ms", "crt"]
    with pytest.raises(ValueError, match="parameter 'margin' must be > 0"):
        compare.CompareStudy(margin=0.0)


def seed_rows(spec, **extra):
    """Per-run rows from {(dataset, variant): {seed: R@1}} (fractions)."""
    return [
        {"dataset": dataset, "variant": variant, "seed": seed, "R@1": r1, **extra}
        for (dataset, variant), runs in spec.items()
        for seed, r1 in runs.items()
    ]


def test_claims_table_pairs_only_the_seeds_both_sides_ran():
    frame = pd.DataFrame(
        seed_rows(
            {
                ("synbirds", "ms"): {0: 0.50, 1: 0.52, 2: 0.54, 3: 0.30},
                ("synbirds", "crt"): {0: 0.60, 1: 0.63, 2: 0.63, 4: 0.99},  # seeds 3 / 4 on one side only
                ("synbirds", "diml_rerank"): {0: 0.49, 1: 0.56, 2: 0.53},  # −1, +4, −1: undecided
                ("synbirds", "cross_attention"): {0: 0.40, 1: 0.41, 2: 0.42},
                ("synbirds", "dgcrl"): {0: 0.30},
                ("synbirds", "triplet"): {0: 0.20, 1: 0.20},
                ("synbirds", "crt-use_crt=False"): {0: 0.60, 1: 0.63},
                ("glyphs", "ms"): {0: 0.5, 1: 0.5},
                ("glyphs", "crt-use_crt=False"): {0: 0.1, 1: 0.1},  # an ablation run outside ablation_datasets
            }
        )
    )
    claims = claims_table(frame, margin=1.0, ablation_datasets=["synbirds"])
    rows = claims.set_index(["claim", "dataset"])
    crt = rows.loc[("CRT > MS baseline", "synbirds")]
    differences = [10.0, 11.0, 9.0]  # seeds 0, 1, 2 only
    low, high = stats.t.interval(0.95, 2, loc=10.0, scale=stats.sem(differences))
    assert (crt["Δ"], crt["CI low"], crt["CI high"], crt["seeds"]) == pytest.approx((10.0, low, high, 3), abs=0.01)
    assert (crt["verdict"], crt["paper Δ"], crt["margin"]) == ("held", pytest.approx(75.95 - 72.25), 1.0)
    assert crt["checkpoint"] == NO_SELECTION
    assert rows.loc[("cross-attention > MS baseline", "synbirds"), "verdict"] == "reversed"
    rerank = rows.loc[("DIML re-ranking > MS baseline", "synbirds")]
    assert rerank["verdict"].startswith("undecided (≈ ") and rerank["seeds to decide"] > 3
    assert rows.loc[("DGCRL > triplet", "synbirds"), "verdict"] == "no verdict (1 seed)"
    assert rows.loc[("DIML training > MS baseline", "synbirds"), "verdict"] == "not evaluated (no diml runs)"
    assert rows.loc[("CRT > MS baseline", "glyphs"), "verdict"] == "not evaluated (no crt runs)"
    ablation = "CRT > CRT without the coded residual transform (−CRT)"
    assert rows.loc[(ablation, "synbirds"), ["verdict", "seeds"]].tolist() == ["equivalent (no effect)", 2]  # 0, 0
    assert (ablation, "glyphs") not in rows.index  # ablation claims only on ablation_datasets
    speed = rows.loc[("DGCRL reaches its best validation R@1 in ≤ 1/5 of triplet's epochs", "synbirds")]
    assert speed["verdict"] == "not evaluated (no best_epoch in the runs' records)"
    sentences = claim_sentences(claims)
    assert sentences[-1].startswith(
        "Of 6 claim × dataset comparisons, 4 were decided: 2 held, 1 reversed, 1 not held (1 surviving Holm's adjustment); "
        "1 undecided and 1 without a verdict (fewer than 2 paired seeds)."
    )
    assert sentences[-1].endswith("Headline: 2 of 4 decided.")
    assert "DIML training > MS baseline" in sentences[-1]


def test_the_speed_claim_pairs_scaled_best_epochs():
    frame = pd.DataFrame(
        [
            *seed_rows({("glyphs", "triplet"): {0: 0.2, 1: 0.2, 2: 0.2}}),
            *seed_rows({("glyphs", "dgcrl"): {0: 0.3, 1: 0.3, 2: 0.3}}),
        ]
    )
    frame["best_epoch"] = [20, 25, 30, 2, 3, 3]  # triplet / 5 − DGCRL: 2, 2, 3
    rule = TrainConfig(validation_folds=4, patience=2)
    frame["selection"] = [rule.selection_text(best_epoch=e, epochs_trained=e + 2) for e in frame["best_epoch"]]
    speed = [c for c in CLAIMS if c.metric == "best_epoch"]
    row = claims_table(frame, claims=speed).iloc[0]
    assert (row["Δ"], row["seeds"], row["unit"], row["margin"]) == (
        pytest.approx(7 / 3, abs=0.01),
        3,
        "best epoch",
        1.0,
    )
    assert row["verdict"] == "held"
    assert row["checkpoint"] == (  # one rule, stated once: not one text per run's epochs
        "best validation R@1 (fold 0 of 4 class-disjoint folds of the training classes), patience 2 evaluations"
    )


def test_a_speed_verdict_that_runs_cut_short_by_the_cap_could_overturn_is_undecided():
    frame = pd.DataFrame(
        [
            *seed_rows({("glyphs", "triplet"): {0: 0.2, 1: 0.2, 2: 0.2}}),
            *seed_rows({("glyphs", "dgcrl"): {0: 0.3, 1: 0.3, 2: 0.3}}),
        ]
    )
    frame["best_epoch"] = [5, 6, 6, 5, 6, 6]  # triplet / 5 − DGCRL: −4.0, −4.8, −4.8: reversed as measured
    speed = [c for c in CLAIMS if c.metric == "best_epoch"]
    frame["best_epoch_censored"] = [True, True, False, True, True, True]
    row = claims_table(frame, claims=speed).iloc[0]
    assert row["Δ"] == pytest.approx(-4.53, abs=0.01) and row["CI high"] < 0  # the interval is still reported
    assert (row["outcome"], row["seeds to decide"]) == ("undecided", "–")
    assert row["verdict"] == ("undecided (censored by the epoch cap: 2 of 3 triplet runs; a longer cap would decide)")
    frame["best_epoch_censored"] = [False, False, False, True, True, True]  # only DGCRL's: reversal only grows
    row = claims_table(frame, claims=speed).iloc[0]
    assert (row["outcome"], row["verdict"]) == ("reversed", "reversed")
    r1_claim = [c for c in CLAIMS if c.metric == "R@1" and c.a == "dgcrl" and c.b == "triplet"]
    frame["best_epoch_censored"] = True  # the cap says nothing about R@1 claims
    assert claims_table(frame, claims=r1_claim).iloc[0]["verdict"] == "held"


def test_a_claim_the_epoch_cap_left_undecided_gets_no_more_seeds():
    """Its sequential reading stopped at the first look (5 seeds); more seeds of the same cap cannot lift the
    censoring, so the design must not ask for that look's seeds again (it would, without end)."""
    from dmlstudy import verdicts
    from dmlstudy.study import sequential

    design = sequential.SequentialDesign(first_seeds=5, batch=5, cap=20)
    triplet = {s: 0.2 + 0.03 * (s % 3) for s in range(5)}
    dgcrl = {s: 0.2 + 0.01 * (s % 2) for s in range(5)}
    frame = pd.DataFrame([*seed_rows({("emoji", "triplet"): triplet}), *seed_rows({("emoji", "dgcrl"): dgcrl})])
    frame["best_epoch"] = [9, 10, 9, 10, 10, 2, 3, 2, 3, 2]  # triplet / 5 − DGCRL < 0 on every seed
    frame["best_epoch_censored"] = [True] * 5 + [False] * 5
    speed = [c for c in CLAIMS if c.metric == "best_epoch"]
    r1 = [c for c in CLAIMS if c.metric == "R@1" and c.a == "dgcrl" and c.b == "triplet"]
    claims = claims_table(frame, claims=speed + r1, design=design)
    speed_row, r1_row = claims.iloc[0], claims.iloc[1]
    assert speed_row["look"] == 1 and verdicts.CENSORED_READING in speed_row["verdict"]
    assert r1_row["outcome"] == "undecided" and r1_row["look"] == 1  # DGCRL − triplet: noisy, open
    assert compare.seeds_needed(claims, design) == {"dgcrl": 10, "triplet": 10}
    assert compare.seeds_needed(claims.iloc[[0]], design) == {}


def test_ablation_claims_name_the_runs_the_paper_notebooks_train():
    from dmlstudy.experiments import ablations
    from dmlstudy.experiments.papers import cross_attention, crt, dgcrl

    crt_config = crt.CRTStudy(lambda2_values=[0.0])
    trained = {
        **ablations.grid(ablations.table_rows(crt.DECLARED, "components", crt_config)),
        **ablations.grid(ablations.table_rows(crt.DECLARED, "λ2", crt_config)),
        **ablations.grid(
            ablations.table_rows(
                cross_attention.DECLARED, "blocks", cross_attention.CrossAttentionStudy(block_counts=[0, 2, 6])
            )
        ),
        **ablations.grid(ablations.table_rows(dgcrl.DECLARED, "α", dgcrl.DGCRLStudy(alphas=[1, 16]))),
    }
    variants = claim_variants()
    compare_only = {"cross_attention-residual=True"}  # trained by 90_compare itself, in both regimes
    assert {name: trained[name] for name in variants if name not in compare_only} == {
        name: spec for name, spec in variants.items() if name not in compare_only
    }
    needed = ablation_grid()
    assert set(needed) == {"crt", "ms", "cross_attention", *variants}
    assert all(needed[name] == trained[name] for name in needed if name in trained)
    assert len([c for c in CLAIMS if c.kind == "headline"]) == 8  # × 2 datasets: the 16 headline claims
    compared = {c.a for c in CLAIMS} | {c.b for c in CLAIMS}
    known = set(main_rows()) | set(classic_rows()) | set(variants) | set(claim_reranks())
    assert compared <= known, f"claims compare rows no notebook produces: {sorted(compared - known)}"


def test_claims_yaml_errors_name_the_file_and_the_key(tmp_path):
    path = tmp_path / "claims.yaml"
    path.write_text("claims:\n  - {name: x, kind: headline, a: crt, b: ms, runs: protocol, source: s, colour: red}\n")
    with pytest.raises(ValueError, match=r"claims\.yaml: claims\[0\] \('x'\): unknown keys \['colour'\]"):
        load_claims(path)
    path.write_text("claims:\n  - {name: x, kind: main, a: crt, b: ms, runs: protocol, source: s}\n")
    with pytest.raises(ValueError, match="kind must be one of"):
        load_claims(path)


def test_forest_plot_has_one_row_per_evaluated_claim():
    frame = pd.DataFrame(
        seed_rows({("synbirds", "ms"): {0: 0.5, 1: 0.52, 2: 0.51}, ("synbirds", "crt"): {0: 0.6, 1: 0.6, 2: 0.7}})
    )
    claims = claims_table(frame, claims=CLAIMS[:3])
    figure = forest_figure(claims)
    axis = figure.axes[0]
    assert [t.get_text() for t in axis.get_yticklabels()] == ["CRT > MS baseline — synbirds"]
    assert len(axis.patches) == 1 and axis.patches[0].get_width() == pytest.approx(2.0)  # the ±margin band
    plt.close(figure)


def test_figures_readme_lists_every_png_with_its_notebook(tmp_path):
    names = [
        "datasets_examples.png",
        "train_curves.png",
        "crt_heatmaps.png",
        "diml_cost.png",
        "cross_attention_maps.png",
        "dgcrl_tsne.png",
        "compare_umap.png",
        "explore_retrievals.png",
        "stray.png",
        "tuning_best_so_far_pretrained.png",
    ]
    for name in names:
        (tmp_path / name).write_bytes(b"\x89PNG")
    (tmp_path / "notes.txt").write_text("not a figure")
    text = figure_index.write_figures_readme(tmp_path).read_text()
    expected = {
        "datasets_": "00_datasets",
        "train_": "01_train",
        "crt_": "10_crt",
        "diml_": "20_diml",
        "cross_attention_": "30_cross_attention",
        "dgcrl_": "40_dgcrl",
        "compare_": "90_compare",
        "explore_": "95_explore",
    }
    for name in names:
        assert f"![]({name})" in text
        line = next(line for line in text.splitlines() if line.startswith(f"**{name}**"))
        notebook = next((nb for prefix, nb in expected.items() if name.startswith(prefix)), None)
        if name.startswith("tuning_"):
            assert "made by `make tune` (`dmlstudy tune plans/tune_pretrained.yaml`)" in line
        else:
            assert (f"notebooks/{notebook}.ipynb" in line) if notebook else ("unknown command" in line)
    assert "notes.txt" not in text
    assert text.index("crt_heatmaps.png") < text.index("cross_attention_maps.png") < text.index("compare_umap.png")
    published = figure_index.figures_readme(tmp_path, study="default")  # the repository's plans/default.yaml
    copy = figure_index.published_copy("default", "10_crt.ipynb", tmp_path)
    executed = (
        f"the executed notebook, with its outputs: {copy}"
        if copy
        else "executed notebook `runs/default/crt/10_crt.ipynb`"
    )
    assert f"Plan entry `crt` of `plans/default.yaml`; {executed}" in published
    assert bool(copy) == (figure_index.project_root() / "published" / "10_crt.ipynb").is_file()
    assert "Plan entry" not in figure_index.figures_readme(tmp_path, study="no-such-plan")


def fake_run(folder, *, dataset, method, seed, records=explore.RUN_RECORDS):
    folder.mkdir(parents=True)
    for name in records:
        if name == "config.yaml":
            (folder / name).write_text(
                yaml.safe_dump({"dataset": dataset, "method": method, "seed": seed, "method_kwargs": {}})
            )
        elif name == "metrics.json":
            (folder / name).write_text(json.dumps({"R@1": 0.25}))
        else:
            (folder / name).write_bytes(b"")


def test_explorer_finds_the_complete_run_folders(tmp_path):
    study = tmp_path / "runs" / "s"
    fake_run(study / "glyphs-crt-seed1", dataset="glyphs", method="crt", seed=1)
    fake_run(study / "synbirds-ms-seed0", dataset="synbirds", method="ms", seed=0)
    fake_run(study / "custom-name", dataset="synbirds", method="diml", seed=2)
    fake_run(study / "synbirds-ms-P=8-seed0", dataset="synbirds", method="ms", seed=0)  # a variant: after the plain run
    fake_run(
        study / "synbirds-ms-seed1",
        dataset="synbirds",
        method="ms",
        seed=1,
        records=("metrics.json", "config.yaml", "embeddings.npz"),
    )  # no checkpoint
    (study / "compare-plan-entry").mkdir()
    (study / "compare-plan-entry" / "study_entry.json").write_text("{}")
    fake_run(tmp_path / "runs" / "other" / "synbirds-ms-seed0", dataset="synbirds", method="ms", seed=0)
    runs = explore.find_runs("s", runs_root=tmp_path / "runs")
    assert runs[["dataset", "method", "run", "seed"]].values.tolist() == [
        ["glyphs", "crt", "glyphs-crt-seed1", 1],
        ["synbirds", "diml", "custom-name", 2],
        ["synbirds", "ms", "synbirds-ms-seed0", 0],
        ["synbirds", "ms", "synbirds-ms-P=8-seed0", 0],
    ]
    assert runs["R@1"].tolist() == [0.25] * 4
    assert runs["path"].tolist()[0] == str(study / "glyphs-crt-seed1")
    assert explore.find_runs("missing", runs_root=tmp_path / "runs").empty


@pytest.fixture
def tiny_runs(tiny_config):
    from dmlstudy.run.train import run

    specs = {
        "ms": {},
        "crt": {"K1": 4, "K2": 4, "high_dim": 32},
        "cross_attention": {"num_blocks": 2},
        "diml": {"grid_size": 2},
    }
    return {name: run(tiny_config(method=name, method_kwargs=kwargs, seed=0)) for name, kwargs in specs.items()}


def test_explorer_loads_runs_and_draws_each_method(tiny_runs, tiny_config):
    root = tiny_config().runs_root
    runs = explore.find_runs("test", runs_root=root)
    assert sorted(runs["method"]) == ["cross_attention", "crt", "diml", "ms"]
    explorer = explore.Explorer(runs)
    for method, result in tiny_runs.items():
        path = runs.loc[runs["method"] == method, "path"].iloc[0]
        loaded = explorer.load(path)
        np.testing.assert_array_equal(loaded.embeddings, result.embeddings["embeddings"])
        with torch_no_grad():
            again = loaded.result.method(torch_stack(loaded.dataset, [0, 1]))
        np.testing.assert_allclose(
            again.numpy(), result.embeddings["embeddings"][:2], atol=1e-5
        )  # the checkpoint was restored
        ranking = explore.top_k_retrievals(loaded.embeddings, 3, top_k=4)
        cosine = (
            loaded.embeddings
            @ loaded.embeddings[3]
            / np.linalg.norm(loaded.embeddings, axis=1)
            / np.linalg.norm(loaded.embeddings[3])
        )
        cosine[3] = -np.inf
        np.testing.assert_array_equal(np.sort(ranking), np.sort(np.argsort(-cosine, kind="stable")[:4]))
        items = explorer.render(path, query=3, top_k=4, explain=True)
        assert isinstance(items[0], str) and method in items[0]
        assert isinstance(items[1], matplotlib.figure.Figure)
        if method == "ms":
            assert items[2] == f"ms: {kit.NO_EXPLANATION}"
        else:
            assert isinstance(items[2], matplotlib.figure.Figure), (method, items[2])
        matplotlib.pyplot.close("all")
    config = explore.ExploreConfig(study="test", runs_root=root, method="crt", query=10_000)
    selection = explorer.selection(config)
    assert selection["method"] == "crt" and selection["query"] == len(tiny_runs["crt"].embeddings["embeddings"]) - 1
    with pytest.raises(ValueError, match="no runs of 'dgcrl'"):
        explorer.selection(explore.ExploreConfig(study="test", runs_root=root, method="dgcrl"))


def torch_no_grad():
    import torch

    return torch.no_grad()


def torch_stack(dataset, indices):
    import torch

    return torch.stack([dataset[i][0] for i in indices])


def test_diml_rerank_rows_keep_recall_at_k_and_the_ms_geometry(tiny_config):
    from dmlstudy.run.train import run

    result = run(tiny_config(method="ms", seed=0))
    config = compare.CompareStudy(methods=["ms", "diml_rerank"], classic_methods=[], rerank_top_k=8, rerank_grid=2)
    rows = rerank.rerank_results([("ms", result)], config.reranking())
    assert len(rows) == 1
    row = rows[0]
    # re-ranking permutes the first K = 8 neighbours only: Recall@8 is the cosine Recall@8
    assert row["R@8"] == pytest.approx(result.metrics["R@8"])
    assert (
        row["NMI"] == result.metrics["NMI"]
        and row["ESD"] == result.metrics["ESD"]
        and row["rho"] == result.metrics["rho"]
    )
    assert row["variant"] == "diml_rerank" and row["rerank_top_k"] == 8
    assert list(result.run_dir.glob("compare_rerank-*.json"))
    assert rerank.rerank_results([("ms", result)], config.reranking())[0]["R@1"] == row["R@1"]  # from the cache
    # the row carries the numerics of the process that re-ranked, recorded in the cache beside its metrics
    [cache] = result.run_dir.glob("compare_rerank-*.json")
    assert row["numerics"] == json.loads(cache.read_text())["numerics"] == numerics.observed()["numerics"]
    frame = tables.comparison_frame([("ms", result)], [], rows, methods=config.methods)
    assert frame["variant"].tolist() == ["ms", "diml_rerank"]
    table = tables.comparison_table(frame)
    assert tables.table_metrics_of(table) == ["R@1", "R@2", "R@4", "R@8", "RP", "MAP@R", "NMI"]


def test_geometry_tables_and_readings_from_the_numbers():
    rows = [
        {"dataset": "synbirds", "variant": v, "seed": s, "ESD": e + 0.1 * s, "rho": r, "R@1": a}
        for v, e, r, a in (("ms", 1.0, 2.0, 0.1), ("crt", 2.0, 1.0, 0.3), ("triplet", 1.5, 1.5, 0.2))
        for s in (0, 1)
    ]
    rows += [
        {"dataset": "synbirds", "variant": "diml_rerank", "seed": 0, "ESD": 99.0, "rho": 99.0, "R@1": 0.9}
    ]  # left out: ms's embeddings
    frame = pd.DataFrame(rows)
    esd = tables.geometry_table(frame, metric="ESD").set_index("variant")
    assert list(esd.index) == ["ms", "crt", "triplet"]
    assert esd.loc["ms", "synbirds"] == "1.050 ± 0.071"
    assert (
        esd.loc["ms", "paper (CUB)"] == 0.72
        and esd.loc["crt", "paper (CUB)"] == 0.90
        and esd.loc["triplet", "paper (CUB)"] == "–"
    )
    first, second = tables.geometry_readings(frame)
    assert "ESD +1.000, ρ -1.000" in first and first.endswith("both held.")
    assert "+1.00 for ESD and -1.00 for ρ" in second and "ESD agrees, ρ agrees" in second
    flat = frame.assign(rho=[1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    assert "ρ shows no clear relation" in tables.geometry_readings(flat)[1]


def test_diml_rerank_rows_from_parallel_processes_equal_the_serial_ones(tiny_config):
    from dmlstudy.run.train import run

    serial_runs = [run(tiny_config(method="ms", seed=seed, run_name=f"serial-{seed}", resume=True)) for seed in (0, 1)]
    parallel_runs = [
        run(tiny_config(method="ms", seed=seed, run_name=f"parallel-{seed}", resume=True)) for seed in (0, 1)
    ]
    serial = rerank.rerank_results(
        [("ms", r) for r in serial_runs],
        compare.CompareStudy(
            methods=["ms", "diml_rerank"], classic_methods=[], rerank_top_k=8, rerank_grid=2
        ).reranking(),
    )
    parallel_config = compare.CompareStudy(
        methods=["ms", "diml_rerank"], classic_methods=[], rerank_top_k=8, rerank_grid=2, protocol={"workers": 2}
    )
    parallel = rerank.rerank_results([("ms", r) for r in parallel_runs], parallel_config.reranking())
    for one, other in zip(serial, parallel):
        for metric in ("R@1", "R@2", "R@4", "R@8", "RP", "MAP@R"):
            assert one[metric] == pytest.approx(other[metric], abs=1e-6)


def test_claims_are_judged_in_each_regime_they_belong_to_and_the_forest_plot_shows_both():
    rows = seed_rows({("synbirds", "ms"): {0: 0.5, 1: 0.52, 2: 0.51}, ("synbirds", "crt"): {0: 0.6, 1: 0.6, 2: 0.7}})
    frame = pd.DataFrame(rows)
    residual = next(c for c in CLAIMS if c.a == "cross_attention-residual=True")
    components = next(c for c in CLAIMS if c.b == "crt-use_crt=False")
    assert residual.judged_in("pretrained") and residual.judged_in("scratch")
    assert components.judged_in("scratch") and not components.judged_in("pretrained")
    assert CLAIMS[0].judged_in("pretrained")  # a headline claim: every regime
    claims = [CLAIMS[0], components]
    scratch = claims_table(frame, claims=claims, regime="scratch")
    pretrained = claims_table(frame, claims=claims, regime="pretrained")
    assert list(scratch["regime"]) == ["scratch", "scratch"] and list(pretrained["regime"]) == ["pretrained"]
    both = pd.concat([scratch, pretrained], ignore_index=True)
    figure = forest_figure(both[both["claim"] == CLAIMS[0].name])
    axis = figure.axes[0]
    assert [t.get_text() for t in axis.get_yticklabels()] == ["CRT > MS baseline — synbirds"]  # one row, two markers
    markers = [line for line in axis.lines if line.get_marker() in ("o", "s") and len(line.get_xdata()) == 1]
    assert sorted(line.get_marker() for line in markers) == ["o", "s"]
    assert len({line.get_ydata()[0] for line in markers}) == 2  # side by side, not on top of each other
    plt.close(figure)


def test_a_compare_config_names_each_regime_once():
    config = compare.CompareStudy(protocol={"regime": "pretrained"}, compared_regimes=["scratch"])
    assert [c.protocol.regime for c in config.regime_configs()] == ["pretrained", "scratch"]
    assert [c.regime for c in config.regime_protocols()] == ["pretrained", "scratch"]
    assert [tables.table_suffix(c.regime) for c in config.regime_protocols()] == ["_pretrained", ""]
    with pytest.raises(ValueError, match="compared_regimes"):
        compare.CompareStudy(protocol={"regime": "scratch"}, compared_regimes=["scratch"])
    with pytest.raises(ValueError, match="unknown regime 'no-such-regime'"):
        compare.CompareStudy(compared_regimes=["no-such-regime"])


def test_the_comparison_runs_every_row_in_each_regime_from_the_committed_weights(tiny_comparison):
    import safetensors.torch
    import torch

    from dmlstudy.run.regimes import BACKBONE_LR_SCALE, PRETRAINED_WEIGHTS

    config = tiny_comparison(
        seeds=[0, 1],
        epochs=2,
        methods=["ms", "crt"],
        classic_methods=[],
        ablation_seeds=[],
        regime="pretrained",
        compared_regimes=["scratch"],
    )
    pretrained, scratch = (compare.compare_regime(c) for c in config.regime_configs())
    assert len(pretrained.main) == len(scratch.main) == 4
    folders = {r.run_dir for _, r in pretrained.main} | {r.run_dir for _, r in scratch.main}
    assert len(folders) == 8  # a regime never reuses the other's runs
    weights = safetensors.torch.load_file(str(project_root() / PRETRAINED_WEIGHTS))
    for _, result in pretrained.main:
        assert result.config.freeze_bn and result.config.warmup_epochs == 1
        assert result.config.backbone_lr_scale == BACKBONE_LR_SCALE  # the regime's rate reaches every row
        state = result.method.backbone.model.state_dict()  # frozen BatchNorm: the source set's statistics, untouched
        assert torch.equal(state["features.1.running_mean"], weights["features.1.running_mean"])
    for _, result in scratch.main:
        state = result.method.backbone.model.state_dict()
        assert not torch.equal(state["features.1.running_mean"], weights["features.1.running_mean"])
    transfer = regime_comparison.regime_differences([pretrained, scratch])
    assert set(transfer["variant"]) == {"ms", "crt"} and (transfer["seeds"] == 2).all()
    ms = transfer[transfer["variant"] == "ms"].iloc[0]
    by_regime = {c.protocol.regime: c.frame for c in (pretrained, scratch)}
    expected = [
        100
        * (
            by_regime["pretrained"].query("variant == 'ms' and seed == @s")["R@1"].item()
            - by_regime["scratch"].query("variant == 'ms' and seed == @s")["R@1"].item()
        )
        for s in (0, 1)
    ]
    assert ms["Δ"] == pytest.approx(np.mean(expected), abs=0.006) and (ms["A"], ms["B"]) == ("pretrained", "scratch")
    claims = regime_comparison.all_claims([pretrained, scratch])
    headline = claims[claims["claim"] == "CRT > MS baseline"]
    assert list(headline["regime"]) == ["pretrained", "scratch"] and (headline["seeds"] == 2).all()


def test_a_claim_of_no_difference_reads_an_interval_outside_the_margin_as_not_equivalent():
    similar = next(c for c in CLAIMS if c.claimed == "≈")
    rows = seed_rows(
        {("synbirds", similar.a): {0: 0.60, 1: 0.61, 2: 0.62}, ("synbirds", similar.b): {0: 0.50, 1: 0.50, 2: 0.51}}
    )
    table = claims_table(pd.DataFrame(rows), claims=[similar])
    assert table["verdict"].tolist() == ["not equivalent (A > B)"] and table["outcome"].tolist() == ["not held"]
    rows = seed_rows(
        {("synbirds", similar.a): {0: 0.50, 1: 0.501, 2: 0.50}, ("synbirds", similar.b): {0: 0.50, 1: 0.50, 2: 0.501}}
    )
    table = claims_table(pd.DataFrame(rows), claims=[similar])
    assert table["verdict"].tolist() == ["equivalent"] and table["outcome"].tolist() == ["held"]


def test_rerankings_compute_on_the_runs_device(tiny_config, monkeypatch):
    """The comparison's and the DIML notebook's re-rankings run on the device the run resolves to (on a GPU
    worker, the GPU), not on the CPU where the grid embeddings are kept between the embedding and the ranking."""
    from dmlstudy.experiments.papers import diml as diml_study
    from dmlstudy.run.compute import resolve_device
    from dmlstudy.run.train import run

    result = run(tiny_config(method="ms", seed=0))
    devices = []

    def recording(original):
        def rerank(*args, device=None, **kwargs):
            devices.append(device)
            return original(*args, device=device, **kwargs)

        return rerank

    monkeypatch.setattr(rerank, "reranked_retrieval_metrics", recording(rerank.reranked_retrieval_metrics))
    monkeypatch.setattr(diml_study, "reranked_retrieval_metrics", recording(diml_study.reranked_retrieval_metrics))
    rerank.rerank_metrics(result, top_k=4, grid=2)
    diml_study.rerank_sweeps(result, diml_study.DIMLStudy(top_ks=[0, 4], grid_sizes=[2], grid_size=2, top_k=4))
    assert devices and all(device == resolve_device(result.config.device) for device in devices)
    assert kit.evaluation_sets(result, grid_sizes=[2])["device"] == resolve_device(result.config.device)


def test_a_regime_waits_once_for_its_runs_and_once_for_its_rerankings(tiny_comparison, monkeypatch):
    """A regime's runs (main rows, classic baselines) go to the engine in one grid and its re-rankings (the
    table's and the claims') in one batch; judging it again reads everything from disk, with the same tables."""
    from dmlstudy.run.train import is_complete, run
    from dmlstudy.study import grids

    calls = {"train": [], "rerank": []}

    def train_on_engine(configs, *, workers, progress=True):  # the engine's work, done here: no cluster
        pending = [c for c in configs if not is_complete(c)]
        calls["train"].append(len(pending))
        for c in pending:
            run(c)

    def call_in_processes(function, arguments, *, workers, what="evaluations"):
        calls["rerank"].append(len(arguments))
        for args in arguments:
            function(*args)

    monkeypatch.setattr(grids, "train_on_engine", train_on_engine)
    monkeypatch.setattr(rerank, "call_in_processes", call_in_processes)
    config = tiny_comparison(
        seeds=[0],
        methods=["ms", "diml_rerank"],
        classic_methods=["triplet"],
        classic_seeds=[0],
        ablation_seeds=[],
        rerank_top_k=8,
        rerank_grid=2,
        regime="pretrained",
        compared_regimes=["scratch"],
        workers=2,
    )
    first = [compare.compare_regime(c) for c in config.regime_configs()]
    settings = {(8, 2)} | {(o.get("top_k", 8), o.get("grid", 2)) for o in claim_reranks().values()}
    assert [n for n in calls["train"] if n] == [2, 2]  # each regime's ms and triplet runs, as one grid
    assert calls["rerank"] == [len(settings), len(settings)]  # each regime's ms run × each distinct re-ranking
    again = [compare.compare_regime(c) for c in config.regime_configs()]  # loads runs and cached re-rankings
    assert [n for n in calls["train"] if n] == [2, 2] and calls["rerank"] == [len(settings)] * 2
    for a, b in zip(first, again, strict=True):
        pd.testing.assert_frame_equal(a.frame, b.frame)
        pd.testing.assert_frame_equal(a.claims, b.claims)


@pytest.mark.parametrize("autocast", ["off", "bf16"])
def test_grid_embeddings_are_the_runs_own_test_embeddings_at_its_precision(tiny_config, autocast):
    """DIML re-ranking is judged against the R@1 a run reports, so its global embeddings must be the run's test
    embeddings: under bf16 autocast too (the GPU default), not float32 ones of the same network. A float32 run
    keeps its re-ranking cache key (no precision in it); a bf16 run's key names its precision."""
    from dmlstudy.experiments.papers import diml as diml_study
    from dmlstudy.run.train import run

    result = run(tiny_config(method="ms", seed=0, autocast=autocast))
    saved = np.load(result.run_dir / "embeddings.npz")["embeddings"]
    grid = kit.evaluation_sets(result, grid_sizes=[2])["query"]
    np.testing.assert_array_equal(grid.global_, saved)
    precision = kit.embedding_precision(result.config)
    assert precision == ({} if autocast == "off" else {"autocast": "bfloat16"})
    study = diml_study.DIMLStudy(top_ks=[0, 4], grid_sizes=[2], grid_size=2, top_k=4)
    rows = diml_study.rerank_sweeps(result, study)
    unranked = next(row for row in rows if row["sweep"] == "K" and row["K"] == 0)
    assert unranked["R@1"] == pytest.approx(result.metrics["R@1"], abs=1e-12)
    assert ("autocast" in json.loads(diml_study._sweep_cache(result, study).read_text())["settings"]) == (
        autocast == "bf16"
    )


def test_an_undecided_claim_gets_more_seeds_for_its_rows_only_and_recomputes_from_the_per_seed_table(
    tiny_comparison, tmp_path
):
    """The sequential design: a claim undecided at its first look (2 seeds) gets the next look's seeds for its
    two rows (crt and ms), and only those; the claims table then recomputes from the per-seed table."""
    from dmlstudy import verdicts

    config = tiny_comparison(
        seeds=[0, 1], epochs=1, methods=["ms", "crt", "cross_attention"], classic_methods=[], ablation_seeds=[]
    )
    config.seed_cap, config.seed_batch = 3, 1
    assert config.design().looks == (2, 3)
    comparison = compare.compare_regime(config)
    claims = comparison.claims
    crt = claims[claims["claim"] == "CRT > MS baseline"].iloc[0]
    if crt["look"] == 1:  # decided at the first look: nothing to add (not expected with 2 seeds at 98.9 %)
        pytest.skip(f"decided at the first look: {crt['verdict']}")
    assert crt["seeds"] == 3 and crt["look"] == 2 and crt["confidence"] == pytest.approx(config.design().level(2))
    seeds = comparison.runs.groupby("variant")["seed"].apply(set)
    assert seeds["crt"] == seeds["ms"] == {0, 1, 2}
    cross = claims[claims["claim"] == "cross-attention > MS baseline"].iloc[0]
    expected = {0, 1} if cross["look"] == 1 else {0, 1, 2}  # its own row gets a seed only while it is undecided
    assert seeds["cross_attention"] == expected
    written = claims_module.write_claims(
        regime_comparison.all_claims([comparison]),
        config.claims_scope(),
        tmp_path,
        runs=regime_comparison.all_runs([comparison]),
    )
    per_seed = pd.read_csv(tmp_path / "runs_per_seed.csv")
    assert tmp_path / "runs_per_seed.csv" in written
    assert "`seed_cap` 3, `seed_batch` 1): every headline claim" in (tmp_path / "claims.md").read_text()
    assert set(per_seed.loc[per_seed["row"] == "crt", "seed"]) == {0, 1, 2}
    delta, low, high, n = verdicts.paired_interval(
        per_seed,
        seeds=int(crt["seeds"]),
        A="crt",
        B="ms",
        metric="R@1",
        dataset=crt["dataset"],
        regime=config.protocol.regime,
        confidence=crt["confidence"],
    )
    assert n == 3 and (round(delta, 2), round(low, 2), round(high, 2)) == (crt["Δ"], crt["CI low"], crt["CI high"])


def test_the_scale_table_reads_test_embeddings_at_the_validation_class_count():
    from types import SimpleNamespace

    from dmlstudy.metrics import class_subset_recall

    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(8), 4)

    def result(seed, val):
        embeddings = rng.normal(size=(32, 6)) + 2.0 * np.eye(8)[labels][:, :6]
        return SimpleNamespace(
            config=SimpleNamespace(dataset="synbirds", seed=seed),
            metrics={"val_R@1": val, "R@1": 0.25},
            embeddings={"embeddings": embeddings, "labels": labels},
        )

    unvalidated = SimpleNamespace(config=SimpleNamespace(dataset="glyphs", seed=0), metrics={"R@1": 0.1})
    runs = [("ms", result(0, 0.5)), ("ms", result(1, 0.7)), ("ms", unvalidated)]
    table = tables.scale_table(runs, validation_classes={"synbirds": 3}, draws=5)
    (row,) = table.to_dict("records")  # glyphs has no validation fold: left out
    assert (row["validation classes"], row["test classes"], row["runs"]) == (3, 8, 2)
    assert row["val R@1_mean"] == pytest.approx(60.0) and row["val R@1"] == "60.0 ± 14.1"
    expected = [
        class_subset_recall(r.embeddings["embeddings"], labels, classes=3, draws=5, seed=s).mean()
        for s, (_, r) in enumerate(runs[:2])
    ]
    assert row["test R@1 at the validation's class count_mean"] == pytest.approx(100 * np.mean(expected))
    assert tables.scale_table([], validation_classes={}).empty


def test_the_validation_fold_has_a_quarter_of_the_training_classes(tiny_data_root):
    protocol = {"datasets": ["cub200"], "data_root": str(tiny_data_root), "validation_folds": 4, "train_classes": 0}
    assert compare.validation_class_counts(compare.CompareStudy(protocol=protocol)) == {"cub200": 3}  # 12 train classes
    assert compare.validation_class_counts(compare.CompareStudy(protocol={**protocol, "train_classes": 8})) == {
        "cub200": 2
    }
    assert compare.validation_class_counts(compare.CompareStudy(protocol={**protocol, "validation_folds": 0})) == {}
