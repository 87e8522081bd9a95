"""Which study the explorer (notebook 95) opens on: the published one when it has runs, else its own fallback
study (trained CI-sized when empty), or the one the parameter names; never training into a study it does not own."""

from __future__ import annotations

import json

import pytest
import yaml

from dmlstudy.experiments import explore
from dmlstudy.paths import PUBLISHED_STUDY


def complete_run(folder, *, dataset="synbirds", method="ms", seed=0):
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump({"dataset": dataset, "method": method, "seed": seed}))
    (folder / "metrics.json").write_text(json.dumps({"R@1": 0.5}))
    for name in ("embeddings.npz", "checkpoint.pt"):
        (folder / name).write_bytes(b"")


def test_opens_on_the_published_study_when_it_has_runs(tmp_path):
    complete_run(tmp_path / PUBLISHED_STUDY / "synbirds-ms-seed0")
    complete_run(tmp_path / "smoke" / "glyphs-crt-seed0", dataset="glyphs", method="crt")
    config = explore.ExploreConfig(runs_root=str(tmp_path))
    study, runs = explore.ensure_runs(config)
    assert study == PUBLISHED_STUDY and runs["run"].tolist() == ["synbirds-ms-seed0"]
    header = explore.study_header(config, runs)
    assert f"published study {PUBLISHED_STUDY!r}" in header and "smoke" in header and "study = '<name>'" in header
    named = explore.ExploreConfig(runs_root=str(tmp_path), study="smoke")
    assert explore.ensure_runs(named)[0] == "smoke"
    assert explore.studies_with_runs(runs_root=tmp_path) == [PUBLISHED_STUDY, "smoke"]


def test_falls_back_to_its_own_study_and_never_trains_into_a_named_one(tmp_path, monkeypatch):
    (tmp_path / PUBLISHED_STUDY / "unfinished").mkdir(parents=True)  # no records: not a run
    trained = []

    def fake_grid(grid, **_):
        for _, config in grid:
            trained.append(config)
            complete_run(tmp_path / config.study / f"{config.dataset}-{config.method}-seed{config.seed}")

    monkeypatch.setattr(explore, "run_grid", fake_grid)
    config = explore.ExploreConfig(runs_root=str(tmp_path))
    assert explore.choose_study(config)[0] == explore.OWN_STUDY
    study, runs = explore.ensure_runs(config)
    assert study == explore.OWN_STUDY and len(runs) == 1
    assert [(c.study, c.method, c.seed) for c in trained] == [(explore.OWN_STUDY, "diml", 0)]
    assert "has no runs here yet" in explore.study_header(config, runs)
    with pytest.raises(ValueError, match=r"no complete runs in study 'nothing-here'.*notebook-95_explore"):
        explore.ensure_runs(explore.ExploreConfig(runs_root=str(tmp_path), study="nothing-here"))
    assert len(trained) == 1


def test_the_first_method_shown_is_one_that_explains_among_the_studys_rows():
    assert explore.explains("diml") and explore.explains("crt") and explore.explains("cross_attention")
    assert not explore.explains("ms") and not explore.explains("triplet")  # preset builders of the baseline's losses
    assert not explore.explains("nope")
    rows = ["ms", "crt", "diml_rerank", "diml", "cross_attention", "dgcrl", "softmax", "triplet", "lifted"]
    assert explore.fallback_method() == "diml"  # the one method explaining by transport plans
    assert explore.first_method(rows) == "diml"
    assert explore.first_method(["ms", "cross_attention", "crt"]) == "cross_attention"  # else the study's order


def test_a_method_that_explains_names_the_kind_it_draws():
    from dmlstudy.methods import METHODS, HeatMaps, Method, TransportPlans

    classes = {name: builder for name, builder in METHODS.items() if isinstance(builder, type)}
    assert {"diml", "crt", "cross_attention"} <= set(classes)
    for name, cls in classes.items():
        overrides = cls.explain is not Method.explain
        assert overrides == (cls.explanation_kind is not None), name
        assert cls.explanation_kind in (None, HeatMaps, TransportPlans), name
    assert explore.first_method(["triplet", "ms", "dgcrl"]) == "ms"
