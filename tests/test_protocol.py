"""The shared study protocol on the Dask engine: parallel grids train each run once on a worker process, keep
finished runs, and report failures by name; per-run evaluations (call_in_processes) run as engine tasks."""

import json

import pytest

from dmlstudy.records import write_json
from dmlstudy.study import engine
from dmlstudy.study.grids import GridRunError, call_in_processes, is_complete, run_grid


@pytest.fixture(autouse=True)
def one_thread_tasks(monkeypatch):
    """One torch thread per task whatever the machine's cores (the engine's DMLSTUDY_TASK_THREADS)."""
    monkeypatch.setenv(engine.THREADS_VARIABLE, "1")
    monkeypatch.delenv(engine.SCHEDULER_VARIABLE, raising=False)


def test_parallel_grid_trains_each_run_once_on_a_worker(tiny_config):
    configs = [(f"seed{seed}", tiny_config(seed=seed, run_name=f"ms-seed{seed}", resume=True)) for seed in (0, 1)]
    results = run_grid(configs, workers=2)
    assert [variant for variant, _ in results] == ["seed0", "seed1"]
    for (_, config), (_, result) in zip(configs, results):
        assert is_complete(config)
        environment = json.loads((config.run_dir / "environment.json").read_text())
        assert environment["torch_threads"] == 1  # trained by a worker task with DMLSTUDY_TASK_THREADS threads
        assert result.metrics == json.loads((config.run_dir / "metrics.json").read_text())
    stamps = [(config.run_dir / "metrics.json").stat().st_mtime_ns for _, config in configs]
    run_grid(configs, workers=2)  # finished runs are loaded, not retrained
    assert stamps == [(config.run_dir / "metrics.json").stat().st_mtime_ns for _, config in configs]


def test_parallel_grid_keeps_finished_runs_and_names_the_failed_one(tiny_config):
    good = tiny_config(run_name="good", resume=True)
    bad = tiny_config(run_name="bad", resume=True, method="no_such_method")
    with pytest.raises(
        GridRunError, match=r"(?s)1 of 2 runs failed.*runs/test/bad-[0-9a-f]{8} failed.*unknown method .no_such_method."
    ):
        run_grid([("good", good), ("bad", bad)], workers=2)
    assert is_complete(good) and not is_complete(bad)


def test_calls_run_as_engine_tasks_and_failures_are_reported_together(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    arguments = [(tmp_path / f"out{i}.json", {"i": i}) for i in range(3)] + [(blocker / "out.json", {})]
    with pytest.raises(
        GridRunError, match=r"(?s)1 of 4 evaluations failed.*write_json.*a-file.*(NotADirectoryError|FileExistsError)"
    ):
        call_in_processes(write_json, arguments, workers=2)
    assert [json.loads((tmp_path / f"out{i}.json").read_text()) for i in range(3)] == [{"i": 0}, {"i": 1}, {"i": 2}]


def test_workers_must_be_positive(tiny_config):
    with pytest.raises(ValueError, match="workers must be ≥ 1"):
        run_grid([("a", tiny_config())], workers=0)


def _tuned_folder(tmp_path):
    from dmlstudy.run.tuned import RowResult, write_tuned

    folder = tmp_path / "tuned"
    write_tuned(
        folder / "synbirds.yaml",
        "synbirds",
        [
            RowResult(
                "synbirds",
                "ms",
                {"lr": 0.002, "method_kwargs": {"loss_kwargs": {"alpha": 3.0, "beta": 40.0}}},
                0.5,
                4,
                [],
                1.0,
            ),
            RowResult("synbirds", "softmax", {"lr": 0.001, "head_lr": 0.05}, 0.4, 4, [], 1.0),
        ],
        {"command": "test"},
    )
    return folder


def test_tuned_values_reach_rows_variants_and_yield_to_explicit_settings(tmp_path):
    from dmlstudy.run.protocol import ProtocolConfig, UntunedRowWarning

    protocol = ProtocolConfig(tuned=str(_tuned_folder(tmp_path)), lr=0.004)
    ms = protocol.train_config(dataset="synbirds", method="ms", seed=0, name="ms")
    assert ms.lr == 0.002 and ms.method_kwargs == {"loss_kwargs": {"alpha": 3.0, "beta": 40.0}}
    variant = protocol.train_config(
        dataset="synbirds", method="ms", seed=0, name="ms-beta=10", method_kwargs={"loss_kwargs": {"beta": 10.0}}
    )
    assert variant.lr == 0.002, "an ablation variant starts from its method's tuned values"
    assert variant.method_kwargs == {"loss_kwargs": {"alpha": 3.0, "beta": 10.0}}, "the variant's own value wins"
    softmax = protocol.train_config(
        dataset="synbirds", method="dgcrl", seed=0, name="softmax", method_kwargs={"normalize_scale": False}
    )
    assert (softmax.lr, softmax.head_lr) == (0.001, 0.05) and softmax.method_kwargs == {"normalize_scale": False}
    assert protocol.train_config(dataset="synbirds", method="ms", seed=0, name="ms", lr=0.01).lr == 0.01
    with pytest.warns(UntunedRowWarning, match="row 'crt' has no tuned values"):
        untuned = protocol.train_config(dataset="synbirds", method="crt", seed=0, name="crt")
    assert untuned.lr == 0.004 and untuned.method_kwargs == {}
    assert ProtocolConfig(lr=0.004).train_config(dataset="synbirds", method="ms", seed=0, name="ms").lr == 0.004


def test_a_regime_tuned_on_its_own_reads_its_own_values_and_says_so(tmp_path):
    from dmlstudy.run.protocol import ProtocolConfig
    from dmlstudy.run.tuned import RowResult, write_tuned

    folder = _tuned_folder(tmp_path)
    pretrained = ProtocolConfig(tuned=str(folder), regime="pretrained")
    assert pretrained.train_config(dataset="synbirds", method="ms", seed=0, name="ms").lr == 0.002, "reused"
    assert f"tuned values of {folder}," in pretrained.protocol_text()
    own = RowResult("synbirds", "ms", {"lr": 0.0007}, 0.6, 4, [], 1.0)
    write_tuned(folder / "pretrained" / "synbirds.yaml", "synbirds", [own], {"command": "test"})
    assert pretrained.train_config(dataset="synbirds", method="ms", seed=0, name="ms").lr == 0.0007
    assert f"tuned values of {folder / 'pretrained'}," in pretrained.protocol_text()
    scratch = ProtocolConfig(tuned=str(folder))
    assert scratch.train_config(dataset="synbirds", method="ms", seed=0, name="ms").lr == 0.002
    with pytest.raises(FileNotFoundError, match=r"pretrained/glyphs\.yaml does not exist"):
        pretrained.train_config(dataset="glyphs", method="ms", seed=0, name="ms")  # never the scratch file instead


def test_a_missing_tuned_file_is_named(tmp_path):
    from dmlstudy.run.protocol import ProtocolConfig

    protocol = ProtocolConfig(tuned=str(_tuned_folder(tmp_path)))
    with pytest.raises(FileNotFoundError, match=r"glyphs\.yaml does not exist; run `make tune`"):
        protocol.train_config(dataset="glyphs", method="ms", seed=0, name="ms")


def test_a_regime_sets_the_start_and_schedule_of_every_run_and_keeps_scratch_folders():
    from dmlstudy.run.protocol import ProtocolConfig
    from dmlstudy.run.regimes import REGIMES

    scratch = ProtocolConfig(epochs=3).train_config(dataset="synbirds", method="ms", seed=1, name="ms")
    pretrained = ProtocolConfig(epochs=3, regime="pretrained").train_config(
        dataset="synbirds", method="ms", seed=1, name="ms"
    )
    for key, value in REGIMES["pretrained"].overrides.items():
        assert getattr(pretrained, key) == value
    assert (scratch.checkpoint_path, scratch.freeze_bn, scratch.backbone_lr_scale, scratch.warmup_epochs) == (
        "",
        False,
        1.0,
        0,
    )
    assert pretrained.run_name == "pretrained-synbirds-ms-seed1" and scratch.run_name == "synbirds-ms-seed1"
    # a run of one epoch cannot warm up for one: it warms up for none
    one_epoch = ProtocolConfig(epochs=1, regime="pretrained").train_config(
        dataset="synbirds", method="ms", seed=1, name="ms"
    )
    assert one_epoch.warmup_epochs == 0
    with pytest.raises(ValueError, match="unknown regime 'no-such-regime'"):
        ProtocolConfig(regime="no-such-regime")
    with pytest.raises(ValueError, match="loads weights of backbone 'dml_convnet'.*'resnet18'"):
        ProtocolConfig(regime="pretrained", backbone="resnet18")


def test_the_protocol_sets_the_precision_of_every_run_and_refuses_an_unknown_one():
    from dmlstudy.run.protocol import ProtocolConfig

    def config(**protocol):
        return ProtocolConfig(**protocol).train_config(dataset="synbirds", method="ms", seed=0, name="ms")

    assert config().autocast == "auto"
    bf16 = config(autocast="bf16")
    assert bf16.autocast == "bf16"
    assert bf16.run_dir != config().run_dir  # a bf16 study never reuses the float32 runs of the same plan
    with pytest.raises(ValueError, match="parameter 'autocast' must be one of .*'fp16'"):
        ProtocolConfig(autocast="fp16")


def test_a_study_config_builds_its_protocol_from_one_mapping_parameter():
    """Papermill injects the shared protocol as a dict: the study config builds the ProtocolConfig (keys left out
    keep their defaults, ints become floats where a float is declared), names a wrong value by its key and lists
    the valid keys when one is unknown."""
    from dmlstudy.experiments.papers.dgcrl import DGCRLStudy
    from dmlstudy.run.protocol import ProtocolConfig

    config = DGCRLStudy.from_namespace({"protocol": {"seeds": [0, 1], "lr": 1, "regime": "pretrained"}, "alphas": []})
    assert isinstance(config.protocol, ProtocolConfig)
    assert config.protocol == ProtocolConfig(seeds=[0, 1], lr=1.0, regime="pretrained")
    assert isinstance(config.protocol.lr, float) and config.alphas == []
    assert config.ablation_protocol() == ProtocolConfig(seeds=[0], lr=1.0, regime="pretrained")
    assert DGCRLStudy(protocol=config.protocol).protocol is config.protocol  # a built protocol is taken as it is
    assert DGCRLStudy().protocol == ProtocolConfig(), "no protocol: the CI-sized defaults"
    with pytest.raises(TypeError, match=r"^parameter 'protocol\.seeds' must be of type list, got int 3$"):
        DGCRLStudy(protocol={"seeds": 3})
    with pytest.raises(ValueError, match=r"^parameter 'protocol\.autocast' must be one of \['auto'"):
        DGCRLStudy(protocol={"autocast": "fp16"})
    with pytest.raises(ValueError, match=r"^parameter 'protocol\.regime': unknown regime 'no-such-regime'"):
        DGCRLStudy(protocol={"regime": "no-such-regime"})
    with pytest.raises(
        TypeError, match=r"parameter 'protocol' has no keys \['alphas', 'sedes'\]; valid keys: \['runs_root'"
    ):
        DGCRLStudy(protocol={"sedes": [0], "alphas": [1.0]})
    with pytest.raises(
        TypeError, match=r"parameter 'protocol' must be a mapping \(dict\) of ProtocolConfig fields, got list"
    ):
        DGCRLStudy(protocol=[0, 1])
