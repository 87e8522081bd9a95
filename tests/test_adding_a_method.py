"""docs/adding_a_method.md, followed as written: its example file (taken from the page itself, and equal to
examples/methods/circle.py) registers as a plugin, builds, is tuned by a CI-sized tuning plan that takes its rows
from a study plan's comparison, and trains in the comparison's classic rows with its tuned values, which its
run's config.yaml attributes to the tuned-values file; the page's claim (its claims.yaml entry) loads and is
judged on the row's runs against the MS runs."""

import re
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

import dmlstudy.methods as methods
from dmlstudy.config import load_yaml
from dmlstudy.experiments import compare, tables
from dmlstudy.findings.claims import claims_table, load_claims
from dmlstudy.methods import METHOD_INFO, METHODS, build_method, method_info
from dmlstudy.models import build_backbone
from dmlstudy.rows import rows_markdown
from dmlstudy.run.identity import identity_hash
from dmlstudy.run.protocol import UntunedRowWarning, resolve_run
from dmlstudy.run.tuned import tuned_overrides
from dmlstudy.study import engine
from dmlstudy.study.grids import results_frame, run_grid
from dmlstudy.study.tuning import load_tune_config, run_tune_plan

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "docs" / "adding_a_method.md"
EXAMPLE = ROOT / "examples" / "methods" / "circle.py"
MODULE = "recipe_circle"  # the example's module name here, unlike any module on the path


def recipe_block(marker: str, language: str) -> str:
    """The ``language`` code block that follows the page's ``<!-- marker -->``."""
    text = RECIPE.read_text(encoding="utf-8")
    assert f"<!-- {marker} -->" in text, f"the recipe has its {marker!r} marker"
    after = text.split(f"<!-- {marker} -->", 1)[1]
    block = re.match(rf"\s*```{language}\n(.*?)\n```", after, re.DOTALL)
    assert block, f"the recipe's {language} block follows its {marker!r} marker"
    return block.group(1) + "\n"


def recipe_example() -> str:
    """The Python block that follows the page's ``<!-- example: examples/methods/circle.py -->`` marker."""
    return recipe_block("example: examples/methods/circle.py", "python")


@pytest.fixture
def circle(tmp_path, monkeypatch):
    """The recipe's file as a plugin module (``DMLSTUDY_METHOD_MODULES``); unregistered afterwards."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / f"{MODULE}.py").write_text(recipe_example())
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv(methods.PLUGIN_VARIABLE, MODULE)
    assert MODULE in methods.discover()
    yield "circle"
    METHODS.pop("circle", None)
    METHOD_INFO.pop("circle", None)
    sys.modules.pop(MODULE, None)


@pytest.fixture
def engine_in_this_process(monkeypatch):
    """The engine as one worker thread of this process, which has the plugin registered (no worker process to
    start: the test does not wait on process start-up)."""
    from distributed import Client, LocalCluster

    monkeypatch.setenv(engine.THREADS_VARIABLE, "1")
    monkeypatch.delenv(engine.SCHEDULER_VARIABLE, raising=False)
    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None)
    client = Client(cluster)
    monkeypatch.setattr(engine, "get_client", lambda workers=1: client)
    yield client
    client.close()
    cluster.close()


def test_the_recipes_example_is_the_example_file():
    assert recipe_example() == EXAMPLE.read_text(encoding="utf-8")


def test_the_recipes_method_builds_tunes_and_trains_in_the_comparison_with_its_tuned_values(
    circle, engine_in_this_process, tiny_data_root, tiny_comparison, tmp_path
):
    info = method_info(circle)
    assert (info.label, info.group) == ("Circle loss", "classic")
    assert info.summary == "Pooled features → linear → L2-norm, trained with the Circle loss (pytorch-metric-learning)."
    method = build_method(circle, backbone=build_backbone("dml_convnet"), embedding_dim=16, num_classes=4, margin=0.3)
    images, labels = torch.randn(8, 3, 32, 32), torch.arange(4).repeat_interleave(2)
    torch.testing.assert_close(method(images).norm(dim=1), torch.ones(8))
    loss, parts = method.loss(images, labels)
    assert torch.isfinite(loss) and set(parts) == {"circle"}

    study_plan = tmp_path / "study.yaml"  # a study whose comparison shows the new row among its classic baselines
    study_plan.write_text(
        yaml.safe_dump(
            {
                "study": "recipe",
                "entries": [
                    {
                        "name": "compare",
                        "notebook": "notebooks/90_compare.ipynb",
                        "parameters": {"classic_methods": [circle]},
                    }
                ],
            }
        )
    )
    tune_plan = tmp_path / "tune.yaml"
    tune_plan.write_text(
        yaml.safe_dump(
            {
                "name": "tune_recipe",
                "datasets": ["cub200"],
                "rows": str(study_plan),
                "trials": 2,
                "startup_trials": 1,
                "pruner": "none",
                "workers": 1,
                "out_dir": str(tmp_path / "tuned"),
                "figure": "",
                "runs_root": str(tmp_path / "runs"),
                "data_root": str(tiny_data_root),
                "validation_folds": 4,
                "patience": 1,
                "epochs": 2,
                "image_size": 32,
                "embedding_dim": 16,
                "classes_per_batch": 4,
                "samples_per_class": 3,
                "steps_per_epoch": 2,
                "train_classes": 0,
                "test_classes": 0,
            }
        )
    )
    assert load_tune_config(tune_plan).rows == [circle], "the tuning plan takes its rows from the study plan"
    [tuned_file] = run_tune_plan(tune_plan, poll_seconds=0.1)
    tuned = tuned_overrides(tuned_file, "cub200", circle)
    assert set(tuned) == {"lr", "method_kwargs"} and set(tuned["method_kwargs"]) == {"margin", "gamma"}

    config = tiny_comparison(
        study="recipe", methods=["ms"], classic_methods=[circle], tuned=str(tmp_path / "tuned"), umap=False, tsne=False
    )
    with pytest.warns(UntunedRowWarning, match=r"row 'ms' has no tuned values in .*cub200\.yaml \(scratch regime\)"):
        main = compare.main_grid(config)  # ms was not tuned here: said, and listed in the protocol line
    assert "untuned rows (lr 0.004, paper defaults): ms (cub200)" in config.protocol.protocol_text()
    [(row, run_config)] = compare.classic_grid(config)
    assert row == circle and run_config.lr == tuned["lr"] and run_config.method_kwargs == tuned["method_kwargs"]
    origins = resolve_run(config.protocol, dataset="cub200", method=circle, seed=0, name=circle).origins
    assert origins["lr"] == origins["method_kwargs.margin"] == f"tuned: {tuned_file}"

    results = run_grid([(row, run_config), *main])
    [result] = [result for name, result in results if name == circle]
    record = (result.run_dir / "config.yaml").read_text()
    assert re.search(rf"^lr: {tuned['lr']!r}  # tuned: {re.escape(str(tuned_file))}$", record, re.MULTILINE)
    stored = load_yaml(record)
    assert stored == {**run_config.to_dict(), "resume": False, "overwrite": False}
    assert result.run_dir.name.endswith(identity_hash(stored)), "the comments leave the identity alone"

    table = tables.comparison_table(tables.comparison_frame([], [(row, result)], [], methods=config.methods))
    assert table["method"].tolist() == ["Circle loss"] and table.loc[0, "group"] == "classic"
    assert "| Circle loss (`circle`) | Pooled features → linear → L2-norm" in rows_markdown(config.rows())

    claims_file = tmp_path / "claims.yaml"  # the page's claim, as an entry under `claims:` of claims.yaml
    claims_file.write_text(
        "claims:\n" + textwrap.indent(recipe_block("claim: dmlstudy/findings/claims.yaml", "yaml"), "  ")
    )
    [claim] = load_claims(claims_file)
    assert (claim.a, claim.b, claim.runs) == (circle, "ms", "protocol")
    runs = results_frame(results)
    [judged] = claims_table(runs, claims=[claim], regime=config.protocol.regime).to_dict("records")
    assert (judged["A"], judged["B"], judged["seeds"]) == (circle, "ms", 1), judged["verdict"]
    r1 = runs.set_index("variant")["R@1"]
    assert judged["Δ"] == pytest.approx(100 * (r1[circle] - r1["ms"]), abs=0.01), "the claim reads the rows' runs"
