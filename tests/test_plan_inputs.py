"""What a plan reads before its notebooks start: its datasets (``dmlstudy data generate --plan``) and the frozen
stems it caches (``dmlstudy study run``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dmlstudy import cli
from dmlstudy.paths import project_root
from dmlstudy.study import plan_inputs

NOTEBOOKS = project_root() / "notebooks"


def _plan(tmp_path: Path, entries: list[dict]) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump({"study": "inputs", "entries": entries}))
    return path


def test_a_plans_datasets_are_those_its_entries_name_or_their_notebooks_default(tmp_path):
    plan = _plan(
        tmp_path,
        [
            {"name": "data", "notebook": str(NOTEBOOKS / "00_datasets.ipynb"), "parameters": {"datasets": ["emoji"]}},
            {
                "name": "compare",
                "notebook": str(NOTEBOOKS / "90_compare.ipynb"),
                "parameters": {"protocol": {"datasets": ["glyphs", "emoji"]}, "ablation_datasets": ["glyphs"]},
            },
            {"name": "train", "notebook": str(NOTEBOOKS / "01_train.ipynb")},  # its default dataset: synbirds
            {"name": "explore", "notebook": str(NOTEBOOKS / "95_explore.ipynb")},  # '' reads every run's dataset
        ],
    )
    assert plan_inputs.plan_datasets(str(plan)) == ["emoji", "glyphs", "synbirds"]
    assert plan_inputs.plan_datasets(str(plan), only="^train") == ["synbirds"]


def test_the_published_plans_read_the_datasets_their_texts_name():
    assert plan_inputs.plan_datasets("plans/default.yaml") == ["emoji"]
    assert plan_inputs.plan_datasets("plans/embedded.yaml") == ["synbirds", "glyphs"]


def test_only_a_regime_with_a_cached_stem_is_prepared_once_per_dataset():
    configs = plan_inputs.stem_configs("plans/default.yaml")
    assert list(configs) == ["emoji (imagenet, 128 px)"]  # five entries and the ablations share one cache
    (config,) = configs.values()
    assert (config.dataset, config.stem_views, config.image_size, config.conv_head) == ("emoji", 4, 128, False)
    assert plan_inputs.stem_configs("plans/embedded.yaml") == {}


def test_a_stem_cached_at_two_sizes_is_prepared_at_both(tmp_path):
    compare = str(NOTEBOOKS / "90_compare.ipynb")
    protocol = {"datasets": ["emoji"], "regime": "imagenet", "backbone": "dml_efficientnet_lite0"}
    ablation = {"ablation_datasets": []}
    plan = _plan(
        tmp_path,
        [
            {
                "name": "small",
                "notebook": compare,
                "parameters": {"protocol": {**protocol, "image_size": 96}, **ablation},
            },
            {
                "name": "large",
                "notebook": compare,
                "parameters": {"protocol": {**protocol, "image_size": 128}, **ablation},
            },
        ],
    )
    configs = plan_inputs.stem_configs(str(plan))
    assert list(configs) == ["emoji (imagenet, 96 px)", "emoji (imagenet, 128 px)"]
    assert [c.image_size for c in configs.values()] == [96, 128]


def test_preparing_loads_each_dataset_once_and_says_what_it_cached(monkeypatch):
    loaded = []
    monkeypatch.setattr(plan_inputs, "load_datasets", lambda config: loaded.append(config.dataset))
    shown = []
    lines = plan_inputs.prepare_stem_caches(
        plan_inputs.stem_configs("plans/default.yaml"), echo=lambda line, **_: shown.append(line)
    )
    assert loaded == ["emoji"] and shown == lines
    assert lines[0].startswith(
        "emoji (imagenet, 128 px): the frozen stem's activations (4 training views and the test view)"
    )


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["data", "generate"], ["synbirds", "glyphs"]),
        (["data", "generate", "--plan", "plans/default.yaml"], ["emoji"]),
        (["data", "generate", "glyphs", "--plan", "plans/embedded.yaml"], ["glyphs", "synbirds"]),
    ],
)
def test_data_generate_builds_the_named_datasets_and_the_plans(monkeypatch, capsys, argv, expected):
    built = []

    class Split:
        num_classes = 1

        def __len__(self):
            return 1

    def build(name, root, split):
        if split == "train":
            built.append(name)
        return Split()

    monkeypatch.setattr("dmlstudy.data.build_dataset", build)
    assert cli.main(argv) == 0
    assert built == expected
    assert capsys.readouterr().out.count("train images") == len(expected)
