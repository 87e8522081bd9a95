"""docs/adding_an_ablation.md as written: its table added to CRT's declaration resolves to runs named from what
they change, trains at CI size through the one generic path, and reads its contrast by the study's rule; its
parameter line is a valid field of the paper's config."""

import dataclasses
import re
import shutil
from pathlib import Path

import pytest
import yaml

from dmlstudy.experiments import ablations
from dmlstudy.experiments.papers import crt

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "adding_an_ablation.md"
TINY_RUN = dict(image_size=32, classes_per_batch=4, samples_per_class=3, steps_per_epoch=2)


def page_block(marker: str | None, language: str) -> str:
    """The page's first ``language`` block after ``<!-- marker -->`` (or anywhere, without a marker)."""
    text = PAGE.read_text(encoding="utf-8")
    if marker:
        assert f"<!-- {marker} -->" in text, f"the page has its {marker!r} marker"
        text = text.split(f"<!-- {marker} -->", 1)[1]
    block = re.search(rf"```{language}\n(.*?)\n```", text, re.DOTALL)
    assert block, f"the page has a {language} block"
    return block.group(1)


@pytest.fixture
def declared(tmp_path, monkeypatch):
    """CRT's declaration with the page's table added, read from a copy of the declarations' folder."""
    folder = tmp_path / "papers"
    shutil.copytree(ablations.DECLARATIONS, folder)
    values = yaml.safe_load((folder / "crt.yaml").read_text(encoding="utf-8"))
    added = yaml.safe_load(page_block("ablation: dmlstudy/experiments/papers/crt.yaml", "yaml"))
    assert set(added).isdisjoint(values["tables"]), "the page's table is not declared yet"
    values["tables"].update(added)
    (folder / "crt.yaml").write_text(yaml.safe_dump(values, allow_unicode=True, sort_keys=False), encoding="utf-8")
    monkeypatch.setattr(ablations, "DECLARATIONS", folder)
    ablations.declaration.cache_clear()
    yield ablations.declaration("crt")
    ablations.declaration.cache_clear()


def page_config(tmp_path, data_root, **values):
    """CRT's notebook config with the page's parameter line added as a field (as step 2 adds it)."""
    line = page_block(None, "python").strip()
    name, rest = line.split(":", 1)
    kind, default = (part.strip() for part in rest.split("#", 1)[0].split("="))
    assert kind == "bool" and default in {"True", "False"}
    study = dataclasses.make_dataclass(
        "PageStudy", [(name.strip(), bool, dataclasses.field(default=default == "True"))], bases=(crt.CRTStudy,)
    )
    protocol = dict(
        study="test",
        runs_root=str(tmp_path / "runs"),
        data_root=str(data_root),
        datasets=["cub200"],
        **TINY_RUN,
        epochs=1,
        train_classes=0,
        test_classes=0,
    )
    return study(protocol=protocol, ablation_datasets=["cub200"], ablation_seeds=[0, 1], **values), name.strip()


def test_the_pages_table_names_its_runs_from_what_they_change(declared, tmp_path, tiny_data_root):
    config, parameter = page_config(tmp_path, tiny_data_root)
    assert parameter == declared.table("coding")["when"]
    assert not ablations.enabled(declared, "coding", config)  # off unless the plan asks for it
    rows = ablations.table_rows(declared, "coding", config)
    assert {label: name for label, (name, _) in rows.items()} == {
        "softplus (the paper)": "crt",  # the method at its defaults: the run the main table trains
        "cosine": "crt-coding=cosine",
    }
    assert rows["cosine"][1] == {"method": "crt", "method_kwargs": {"coding": "cosine"}}


def test_the_pages_table_trains_and_reads_its_contrast(declared, tmp_path, tiny_data_root):
    config, parameter = page_config(tmp_path, tiny_data_root, **{"coding_ablation": True})
    assert ablations.enabled(declared, "coding", config)
    results = ablations.run_table(declared, "coding", config)
    assert sorted({name for name, _ in results}) == ["crt", "crt-coding=cosine"]
    assert {result.config.seed for _, result in results} == {0, 1}
    assert {result.config.method_kwargs.get("coding", "softplus") for _, result in results} == {"softplus", "cosine"}
    table, sentences = ablations.table(declared, "coding", results, config)
    assert list(table["setting"]) == ["softplus (the paper)", "cosine"]
    assert len(sentences) == 1 and sentences[0].startswith("cub200: raw − cosine-normalised codes")
