"""One path for a run's settings: :func:`resolve_run` gives every run of the default plan the configuration the
hand-written copy before it gave (same fields, same run folders), names each value's origin, copies the protocol's
fields by name, and its run records the origins as comments of config.yaml, outside the configuration's identity."""

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from dmlstudy.config import load_yaml
from dmlstudy.experiments.compare import CompareStudy, trained_methods
from dmlstudy.findings.claims import CLAIMS, ablation_grid
from dmlstudy.methods import list_methods
from dmlstudy.rows import SHARED_VARIANTS, method_grid
from dmlstudy.run import identity
from dmlstudy.run import protocol as protocol_module
from dmlstudy.run.protocol import ProtocolConfig, resolve_run
from dmlstudy.run.regimes import regime_overrides, run_prefix
from dmlstudy.run.train import TrainConfig
from dmlstudy.run.tuned import RowResult, write_tuned
from dmlstudy.search_space import merged
from dmlstudy.study import engine
from dmlstudy.study.grids import train_on_engine
from dmlstudy.study.plan import load_plan


def hand_copied_config(protocol, *, dataset, method, seed, name, method_kwargs=None, **overrides) -> TrainConfig:
    """The protocol → TrainConfig path as it was written before :func:`resolve_run`: the reference."""
    values = dict(
        study=protocol.study,
        runs_root=protocol.runs_root,
        data_root=protocol.data_root,
        dataset=dataset,
        method=method,
        method_kwargs=dict(method_kwargs or {}),
        backbone=protocol.backbone,
        image_size=protocol.image_size,
        embedding_dim=protocol.embedding_dim,
        classes_per_batch=protocol.classes_per_batch,
        samples_per_class=protocol.samples_per_class,
        epochs=protocol.epochs,
        steps_per_epoch=protocol.steps_per_epoch,
        train_classes=protocol.train_classes,
        test_classes=protocol.test_classes,
        lr=protocol.lr,
        eval_every=protocol.eval_every,
        validation_folds=protocol.validation_folds,
        patience=protocol.patience,
        autocast=protocol.autocast,
        seed=seed,
        run_name=f"{run_prefix(protocol.regime)}{dataset}-{name}-seed{seed}",
        resume=True,
        progress=protocol.progress,
        **regime_overrides(protocol.regime, backbone=protocol.backbone, epochs=protocol.epochs),
    )
    values = merged(merged(values, protocol.tuned_values(dataset=dataset, name=name, method=method)), overrides)
    values["method_kwargs"] = merged(values["method_kwargs"], dict(method_kwargs or {}))
    return TrainConfig(**values)


def default_comparison(plan: str = "embedded") -> CompareStudy:
    [entry] = [
        entry
        for entry in load_plan(Path(__file__).resolve().parents[1] / "plans" / f"{plan}.yaml")
        if entry.notebook.name == "90_compare.ipynb"
    ]
    return CompareStudy(**{**entry.parameters, "protocol": {**entry.parameters["protocol"], "study": plan}})


def default_plan_variants(config: CompareStudy) -> dict[str, dict]:
    """Every row the default comparison trains, its ablation variants, and every registered method and shared
    variant (untuned ones included), each with a variant of its own that overrides a field and a keyword."""
    variants = {
        **method_grid(trained_methods(config.methods)),
        **method_grid(config.classic_methods),
        **ablation_grid(CLAIMS),
        **method_grid([*list_methods(), *SHARED_VARIANTS]),
    }
    variants["ms-beta=10-epochs=3"] = {"method": "ms", "method_kwargs": {"loss_kwargs": {"beta": 10.0}}, "epochs": 3}
    variants["dgcrl-lr"] = {"method": "dgcrl", "lr": 0.01, "head_lr": 0.02}
    return variants


@pytest.mark.filterwarnings("ignore::dmlstudy.run.protocol.UntunedRowWarning")
@pytest.mark.parametrize("plan, regime", [("embedded", "pretrained"), ("embedded", "scratch"), ("default", "imagenet")])
def test_every_run_of_a_published_plan_resolves_to_the_configuration_of_the_hand_written_copy(plan, regime):
    config = default_comparison(plan)
    protocol = dataclasses.replace(config.protocol, regime=regime, seeds=[0, 3])
    variants = default_plan_variants(config)
    assert len(variants) > 25
    grid = protocol.grid(variants)
    assert len(grid) == len(variants) * len(protocol.datasets) * 2  # × datasets × seeds
    for variant, resolved in grid:
        spec = dict(variants[variant])
        expected = hand_copied_config(protocol, dataset=resolved.dataset, seed=resolved.seed, name=variant, **spec)
        assert dataclasses.asdict(resolved) == dataclasses.asdict(expected), variant
        assert resolved.run_dir == expected.run_dir  # the same run folders: nothing trains again


def _tuned_folder(tmp_path):
    folder = tmp_path / "tuned"
    ms = RowResult("synbirds", "ms", {"lr": 0.002, "method_kwargs": {"loss_kwargs": {"alpha": 3.0}}}, 0.5, 4, [], 1.0)
    write_tuned(folder / "synbirds.yaml", "synbirds", [ms], {"command": "test"})
    return folder


def test_each_value_names_the_layer_it_came_from(tmp_path):
    folder = _tuned_folder(tmp_path)
    protocol = ProtocolConfig(tuned=str(folder), regime="pretrained", epochs=4, lr=0.004, image_size=48)
    resolved = resolve_run(
        protocol,
        dataset="synbirds",
        method="ms",
        seed=2,
        name="ms-beta",
        method_kwargs={"loss_kwargs": {"beta": 10.0}},
        weight_decay=0.0,
    )
    origins, config = resolved.origins, resolved.config
    tuned = f"tuned: {folder / 'synbirds.yaml'}"
    assert set(TrainConfig.field_names()) <= set(origins)
    assert {key: origins[key] for key in ("image_size", "dataset", "seed", "run_name", "study")} == dict.fromkeys(
        ("image_size", "dataset", "seed", "run_name", "study"), "protocol"
    )
    assert origins["optimizer"] == origins["head_lr"] == origins["final_test"] == "default"
    assert origins["freeze_bn"] == origins["warmup_epochs"] == "regime: pretrained"
    assert origins["lr"] == origins["method_kwargs.loss_kwargs.alpha"] == tuned and config.lr == 0.002
    assert origins["method"] == origins["weight_decay"] == origins["method_kwargs.loss_kwargs.beta"] == "variant"
    assert config.method_kwargs == {"loss_kwargs": {"beta": 10.0, "alpha": 3.0}}
    assert identity.origins_of(config) == origins, "the config carries its origins to its run"
    assert identity.origins_of(dataclasses.replace(config)) == {}, "a copy does not: its values may have changed"


def test_the_protocol_fields_reach_the_run_by_name_without_a_hand_list():
    shared = set(ProtocolConfig.field_names()) & set(TrainConfig.field_names())
    assert {"lr", "epochs", "backbone", "autocast", "patience", "progress"} <= shared and len(shared) >= 15
    changed = {}
    for field in dataclasses.fields(ProtocolConfig):
        if field.name in shared:
            value = getattr(ProtocolConfig(), field.name)
            changed[field.name] = {bool: lambda v: not v, int: lambda v: v + 3, float: lambda v: v / 2}.get(
                type(value), lambda v: f"{v}x"
            )(value)
    changed["autocast"] = "off"  # a choice: another valid value
    protocol = ProtocolConfig(**changed)
    resolved = resolve_run(protocol, dataset="synbirds", method="ms", seed=0, name="ms")
    assert {name: getattr(resolved.config, name) for name in shared} == changed
    assert all(resolved.origins[name] == "protocol" for name in shared)


def test_the_record_shows_each_origin_as_a_comment_and_reads_back_as_the_plain_record():
    values = TrainConfig(
        method_kwargs={"loss_kwargs": {"alpha": 2.0}, "blocks": [1, 2], "empty": {}},
        recall_ks=[1, 2],
        checkpoint_path="a folder with spaces/" * 6,
    ).to_dict()
    assert identity.commented_yaml(values, {}) == yaml.safe_dump(values, sort_keys=False)
    origins = {
        "lr": "tuned: plans/tuned/glyphs.yaml",
        "method_kwargs": "variant",
        "method_kwargs.loss_kwargs.alpha": "tuned: plans/tuned/glyphs.yaml",
        "method_kwargs.blocks": "variant",
        "recall_ks": "protocol",
        "checkpoint_path": "regime: pretrained",
    }
    text = identity.config_record_text(values, origins)
    assert load_yaml(text) == values
    lines = text.splitlines()
    assert "lr: 0.004  # tuned: plans/tuned/glyphs.yaml" in lines
    assert "method_kwargs:  # variant" in lines and "    alpha: 2.0  # tuned: plans/tuned/glyphs.yaml" in lines
    assert "  blocks:  # variant" in lines and "recall_ks:  # protocol" in lines
    assert re.search(r"^  .*spaces/  # regime: pretrained$", text, re.MULTILINE), "a wrapped value: on its last line"
    assert identity.config_record_text(values, {}) == yaml.safe_dump(values, sort_keys=False)


def test_an_engine_task_writes_the_origins_its_config_carried(tiny_config, tmp_path, monkeypatch):
    config = tiny_config(run_name="origins", resume=True)
    origins = {name: "protocol" for name in TrainConfig.field_names()} | {"lr": "tuned: plans/tuned/cub200.yaml"}
    identity.with_origins(config, origins)
    submitted = []
    monkeypatch.setattr(engine, "get_client", lambda workers: None)
    monkeypatch.setattr(engine, "run_tasks", lambda client, submissions, **kw: submitted.extend(submissions))
    train_on_engine([config], workers=2)
    [(_, function, arguments, _)] = submitted
    assert function is engine.train_task and arguments[1] == origins
    function(*arguments)  # what the worker runs
    record = (config.run_dir / "config.yaml").read_text()
    assert record.startswith(identity.ORIGINS_HEADER)
    assert f"lr: {config.lr!r}  # tuned: plans/tuned/cub200.yaml" in record.splitlines()
    assert "resume: false\n" in record, "resume and overwrite are actions: recorded off, without an origin"
    stored = load_yaml(record)
    assert stored == {**config.to_dict(), "resume": False, "overwrite": False}
    assert identity.differing_fields(stored, config.to_dict()) == {}
    assert config.run_dir.name.endswith(identity.identity_hash(stored))


def test_a_row_without_tuned_values_is_untuned_by_name_once_per_row_and_regime(tmp_path):
    folder = _tuned_folder(tmp_path)
    protocol = ProtocolConfig(tuned=str(folder), datasets=["synbirds"])
    with pytest.warns(protocol_module.UntunedRowWarning) as caught:
        for seed in (0, 1):
            protocol.train_config(dataset="synbirds", method="crt", seed=seed, name="crt")
            protocol.train_config(dataset="synbirds", method="crt", seed=seed, name="crt-no-consistency")
            protocol.train_config(dataset="synbirds", method="ms", seed=seed, name="ms-beta=10")  # ms is tuned
    messages = [str(warning.message) for warning in caught if warning.category is protocol_module.UntunedRowWarning]
    assert len(messages) == 1, messages
    assert f"row 'crt' has no tuned values in {folder / 'synbirds.yaml'} (scratch regime)" in messages[0]
    assert "make tune" in messages[0]
    assert "; untuned rows (lr 0.004, paper defaults): crt (synbirds)" in protocol.protocol_text()
    assert "untuned" not in ProtocolConfig(tuned=str(folder), datasets=["glyphs"]).protocol_text()


def test_the_default_plans_training_notebook_shows_the_comparisons_ms_run_of_seed_0():
    """Same configuration, so the same run folder: the run is trained once and the notebook reads it."""
    import dataclasses

    from dmlstudy.experiments.one_run import OneRun
    from dmlstudy.run import identity
    from dmlstudy.run.protocol import ProtocolConfig
    from dmlstudy.study.plan import load_plan

    entries = {entry.run_name: entry.parameters for entry in load_plan("plans/default.yaml")}
    protocol = ProtocolConfig(**{**entries["compare"]["protocol"], "study": "default"})
    compared = protocol.train_config(dataset="emoji", method="ms", seed=0, name="ms")
    shown = OneRun(**entries["train"], study="default").resolved()
    assert identity.folder_name(dataclasses.asdict(shown)) == identity.folder_name(dataclasses.asdict(compared))


def test_every_search_space_starts_from_the_defaults_a_run_has():
    """Trial 0 of a tuning search is the run every plan trains untuned: each search space's ``paper`` value of a
    run setting (``lr``, ``head_lr``) is that setting's default (RunSettings, TrainConfig), and of a method's own
    keyword the method's default."""
    from dmlstudy.experiments.kit import method_defaults
    from dmlstudy.methods import METHODS
    from dmlstudy.methods.base import VARIANT_SEARCH_SPACES, search_space
    from dmlstudy.run.settings import RunSettings

    settings, config = RunSettings(), TrainConfig()
    checked = 0
    for row in [*list_methods(), *sorted(VARIANT_SEARCH_SPACES)]:
        spec = SHARED_VARIANTS.get(row, {"method": row})
        defaults = {**method_defaults(METHODS[spec["method"]]), **(spec.get("method_kwargs") or {})}
        for key, parameter in search_space(row).items():
            parts = key.split(".")
            if parts[0] != "method_kwargs":
                default = getattr(settings, key) if hasattr(settings, key) else getattr(config, key)
            elif len(parts) == 2 and parts[1] in defaults:
                default = defaults[parts[1]]
            else:
                continue  # a loss's own keyword (loss_kwargs.*): the loss class holds its default
            assert parameter.paper == default, f"{row}: {key} starts at {parameter.paper}, a run at {default}"
            checked += 1
    assert checked >= 2 * len(list_methods())  # every method tunes lr and head_lr at least


ROOT = Path(__file__).resolve().parents[1]
STATED_ALWAYS = {"datasets", "seeds", "study", "data_root"}  # what a study runs on, how often and where its data lives


@pytest.mark.parametrize("plan", sorted(p.name for p in (ROOT / "plans").glob("*.yaml")))
def test_a_plan_states_only_the_protocol_fields_that_differ_from_the_defaults(plan):
    values = yaml.safe_load((ROOT / "plans" / plan).read_text(encoding="utf-8"))
    defaults = dataclasses.asdict(ProtocolConfig())
    restated = {
        (entry["name"], key)
        for entry in values.get("entries") or []
        for key, value in ((entry.get("parameters") or {}).get("protocol") or {}).items()
        if key in defaults and key not in STATED_ALWAYS and value == defaults[key]
    }
    assert not restated, (
        f"plans/{plan} restates ProtocolConfig's defaults (dmlstudy/run/protocol.py): {sorted(restated)}"
    )
