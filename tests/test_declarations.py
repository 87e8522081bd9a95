"""The declaration language is checked when a declaration loads: a misspelt key at any level (paper, names,
table, row, sweep, readings, columns, the paper column, paper-specific keys), a method keyword the method does not
take, a config field the notebook's config lacks and a measurement its paper's module does not register each fail
there, naming the file, the key's path and what is valid. docs/declarations.md is the schema's own reference."""

import dataclasses
from pathlib import Path

import pytest
import yaml

from dmlstudy.experiments import ablations, declaration_schema
from dmlstudy.experiments.declaration_schema import DeclarationError
from dmlstudy.experiments.papers import cross_attention, crt, dgcrl, diml

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def declare(tmp_path, monkeypatch):
    """``declare(paper, edit, **binding)``: the paper's declaration after ``edit`` (a function of its mapping),
    loaded from a copy of the declarations' folder."""
    folder = tmp_path / "papers"
    folder.mkdir()
    monkeypatch.setattr(ablations, "DECLARATIONS", folder)

    def load(paper, edit, **binding):
        values = yaml.safe_load((ROOT / "dmlstudy/experiments/papers" / f"{paper}.yaml").read_text(encoding="utf-8"))
        edit(values)
        (folder / f"{paper}.yaml").write_text(yaml.safe_dump(values, allow_unicode=True), encoding="utf-8")
        ablations.declaration.cache_clear()
        return ablations.declaration(paper, **binding)

    yield load
    ablations.declaration.cache_clear()


def renamed(mapping, old, new):
    mapping[new] = mapping.pop(old)


TYPOS = {  # level → (paper, the edit, the key path the message names, a valid key it lists)
    "paper": ("crt", lambda v: renamed(v, "tables", "tabels"), "tabels", "tables"),
    "names": ("crt", lambda v: renamed(v["names"], "tags", "tag"), "names.tag", "tags"),
    "table": (
        "crt",
        lambda v: renamed(v["tables"]["components"], "readings", "readngs"),
        "tables.components.readngs",
        "readings",
    ),
    "row": (
        "crt",
        lambda v: renamed(v["tables"]["components"]["rows"]["−CRT"], "kwargs", "kwarg"),
        "tables.components.rows.−CRT.kwarg",
        "kwargs",
    ),
    "sweep": ("crt", lambda v: renamed(v["tables"]["K1"]["sweep"], "with", "width"), "tables.K1.sweep.width", "with"),
    "choice": (
        "dgcrl",
        lambda v: renamed(v["tables"]["losses"]["sweep"]["choices"]["triplet-ns"], "kwargs", "kwags"),
        "tables.losses.sweep.choices.triplet-ns.kwags",
        "kwargs",
    ),
    "seeds": ("crt", lambda v: v["tables"]["K1"].update(seeds="protcol"), "tables.K1.seeds", "protocol"),
    "readings": (
        "crt",
        lambda v: v["tables"]["K1"].update(readings="best_wrost"),
        "tables.K1.readings",
        "best_worst",
    ),
    "contrast": (
        "cross_attention",
        lambda v: renamed(v["tables"]["main"]["readings"][0][3], "metric", "metrc"),
        "tables.main.readings.0.3.metrc",
        "metric",
    ),
    "columns": (
        "dgcrl",
        lambda v: renamed(v["tables"]["λ"]["columns"]["centre |cos|"], "decimals", "decimal"),
        "tables.λ.columns.centre |cos|.decimal",
        "decimals",
    ),
    "paper column": (
        "crt",
        lambda v: renamed(v["tables"]["K1"]["paper"], "table", "tabel"),
        "tables.K1.paper",
        "table",
    ),
    "paper-specific": (
        "diml",
        lambda v: renamed(v["tables"]["grid"]["paper_specific"], "rerank", "rerang"),
        "tables.grid.paper_specific.rerang",
        "rerank",
    ),
}


@pytest.mark.parametrize("level", TYPOS)
def test_a_typo_at_any_level_fails_at_load_naming_file_path_and_valid_keys(declare, level):
    paper, edit, path, valid = TYPOS[level]
    with pytest.raises(DeclarationError) as error:
        declare(paper, edit)
    message = str(error.value)
    assert f"{paper}.yaml" in message and path in message and repr(valid) in message, message


def test_every_declaration_as_committed_loads_and_binds_to_its_config():
    assert set(ablations.declared_papers()) == {"crt", "diml", "cross_attention", "dgcrl"}
    for paper in ablations.declared_papers():
        declaration_schema.check(ablations.load_yaml((ablations.DECLARATIONS / f"{paper}.yaml").read_text()), paper)
    assert set(dgcrl.DECLARED.measurements) == {"training_accuracy", "centre_correlation"}


def test_a_method_keyword_the_method_does_not_take_fails_at_load(declare):
    with pytest.raises(DeclarationError, match=r"tables\.components\.rows\.−CRT: crt takes no \['use_crtt'\]"):
        declare("crt", lambda v: v["tables"]["components"]["rows"]["−CRT"].update(kwargs={"use_crtt": False}))
    with pytest.raises(DeclarationError, match=r"tables\.K1\.sweep: crt takes no \['K11'\]"):
        declare("crt", lambda v: v["tables"]["K1"]["sweep"].update(kwarg="K11"))
    with pytest.raises(DeclarationError, match=r"names\.same\.ms: cross_attention takes no \['num_block'\]"):
        declare("cross_attention", lambda v: v["names"].update(same={"ms": {"num_block": 0}}))
    with pytest.raises(DeclarationError, match=r"no method 'mss'"):
        declare("crt", lambda v: v["tables"]["main"]["rows"]["ms"].update(method="mss"))


def test_config_fields_named_in_the_declaration_are_checked_against_the_notebook_config(declare):
    with pytest.raises(DeclarationError) as error:
        declare("crt", lambda v: v["tables"]["K1"]["sweep"].update(parameter="k1_value"), config=crt.CRTStudy)
    message = str(error.value)
    assert "crt.yaml" in message and "tables.K1.sweep.parameter: 'k1_value' is not a field of CRTStudy" in message
    assert "'k1_values'" in message  # the valid fields are listed
    with pytest.raises(DeclarationError, match=r"tables\.trained\.when: 'train_dimll'"):
        declare("diml", lambda v: v["tables"]["trained"].update(when="train_dimll"), config=diml.DIMLStudy)
    # a table on the ablation seeds needs the config's ablation fields
    without = dataclasses.make_dataclass("NoAblations", [("k1_values", list)])
    with pytest.raises(DeclarationError, match=r"tables\.K1\.seeds: 'ablation_seeds'"):
        declare("crt", lambda v: None, config=without)


def test_columns_name_measurements_the_papers_module_registers(declare):
    measurements = (dgcrl.training_accuracy, dgcrl.centre_correlation)
    with pytest.raises(DeclarationError, match=r"tables\.α\.columns\.train accuracy: no measurement 'training_acc'"):
        declare(
            "dgcrl",
            lambda v: v["tables"]["α"]["columns"].update({"train accuracy": "training_acc"}),
            config=dgcrl.DGCRLStudy,
            measurements=measurements,
        )
    declared = declare("dgcrl", lambda v: None, config=dgcrl.DGCRLStudy, measurements=measurements)
    assert declared.measurements["centre_correlation"] is dgcrl.centre_correlation


def test_a_paper_specific_table_is_refused_by_the_generic_path_with_a_reason():
    with pytest.raises(KeyError, match="paper-specific"):
        ablations.table_rows(diml.DECLARED, "truncation", diml.DIMLStudy())
    assert set(diml.RERANKED) == {"K", "G"}


def test_the_reference_page_is_written_from_the_schema():
    page = (ROOT / "docs" / "declarations.md").read_text(encoding="utf-8")
    assert page == declaration_schema.reference_markdown(), (
        "docs/declarations.md is out of date: python -m dmlstudy.experiments.declaration_schema > docs/declarations.md"
    )
    for level in declaration_schema.LEVELS:  # every key of every level is on the page
        for key in level.get("properties", {}):
            assert f"| `{key}`" in page


def test_every_declared_table_is_shown_by_the_generic_path_or_typed_paper_specific():
    """23 tables: 14 shown by the generic table (:func:`ablations.table`); 9 whose declaration names the function
    that shows them (``paper_specific.shown_by``: one of the paper's module or of the kit), 7 of them with runs the
    generic path resolves and DIML's two re-ranking sweeps, which are its module's alone."""
    from dmlstudy.experiments import kit
    from dmlstudy.experiments.notebooks import notebook_configs

    configs = notebook_configs()
    papers = {crt: "10_crt", diml: "20_diml", cross_attention: "30_cross_attention", dgcrl: "40_dgcrl"}
    generic, shown_by = [], []
    for module, notebook in papers.items():
        paper, config = module.DECLARED.paper, configs[f"{notebook}.ipynb"]()
        for table, spec in module.DECLARED.tables.items():
            if "rows" in spec or "sweep" in spec:
                ablations.table_rows(module.DECLARED, table, config)  # the runs: the generic path
            function = (spec.get("paper_specific") or {}).get("shown_by")
            if function is None:
                generic.append((paper, table))
                continue
            owner, _, name = function.rpartition(".")
            assert callable(getattr(kit if owner == "kit" else module, name, None)), (paper, table, function)
            shown_by.append((paper, table))
    assert len(generic) == 14 and len(shown_by) == 9
    assert {paper for paper, _ in generic} == {"crt", "dgcrl", "cross_attention"}


def test_the_generic_table_refuses_a_table_its_paper_shows():
    with pytest.raises(ValueError, match="shown by its paper's loss_table"):
        ablations.table(dgcrl.DECLARED, "losses", [], dgcrl.DGCRLStudy())
    with pytest.raises(DeclarationError, match=r"tables\.grid\.paper_specific: 'shown_by' is a required property"):
        declaration_schema.check({"paper": "p", "method": "m", "tables": {"grid": {"paper_specific": {}}}}, "p.yaml")
