"""One declaration of the protocol: a tuning plan reads the shared settings from its study plan's ``protocol``
block, its trials resolve through :func:`dmlstudy.run.protocol.resolve_run`, and the default plan's
``train`` entry names the run it shows. The expected values below are what the plans gave when each tuning plan
still repeated its study plan's protocol: reading them from one place changes no resolved value and no run's
identity."""

import inspect
import re
from pathlib import Path

import pytest

from dmlstudy import search_space as search
from dmlstudy.experiments.one_run import OneRun
from dmlstudy.methods import search_space
from dmlstudy.run import identity
from dmlstudy.run.protocol import ProtocolConfig, plan_protocol
from dmlstudy.run.settings import RunSettings, StudySettings
from dmlstudy.run.train import TrainConfig
from dmlstudy.study.plan import load_plan
from dmlstudy.study.tuning import PROTOCOL_FIELDS, TuneConfig, load_tune_config, row_spec, trial_config

ROOT = Path(__file__).resolve().parents[1]
ROWS = ["ms", "crt", "diml", "cross_attention", "dgcrl", "softmax", "triplet", "lifted", "normsoftmax"]
SIZES = {
    "runs_root": "", "data_root": "", "storage": "", "validation_folds": 4, "validation_fold": 0, "eval_every": 1,
    "seed": 0, "embedding_dim": 128, "classes_per_batch": 16, "samples_per_class": 4, "steps_per_epoch": 0,
    "train_classes": 0, "test_classes": 0, "trials": 6, "startup_trials": 3, "sampler_seed": 0, "pruner": "median",
    "prune_after": 2, "workers": 2, "patience": 2, "rows": ROWS,
}  # fmt: skip
EMBEDDED = SIZES | {"trials": 16, "epochs": 6, "backbone": "dml_convnet", "image_size": 64}
IMAGENET = SIZES | {"epochs": 10, "backbone": "dml_efficientnet_lite0", "image_size": 128, "regime": "imagenet"}
EXPECTED = {
    "tune": EMBEDDED | {
        "name": "tune", "datasets": ["synbirds", "glyphs"], "out_dir": "plans/tuned",
        "figure": "figures/tuning_best_so_far.png", "regime": "scratch",
    },
    "tune_pretrained": EMBEDDED | {
        "name": "tune_pretrained", "datasets": ["glyphs", "synbirds"], "out_dir": "plans/tuned/pretrained",
        "figure": "figures/tuning_best_so_far_pretrained.png", "regime": "pretrained",
    },
    "tune_imagenet": IMAGENET | {
        "name": "tune_imagenet", "datasets": ["emoji"], "out_dir": "plans/tuned/imagenet",
        "figure": "figures/tuning_best_so_far_imagenet.png",
    },
    "tune_partitions": IMAGENET | {
        "name": "tune_partitions", "datasets": ["emoji_p1", "emoji_p2"], "out_dir": "plans/tuned_partitions/imagenet",
        "figure": "figures/robustness/tuning_best_so_far_partitions.png",
    },
    "tune_cub": IMAGENET | {
        "name": "tune_cub", "datasets": ["cub200"], "out_dir": "runs/tune_cub/tuned/imagenet",
        "figure": "runs/tune_cub/tuning_best_so_far_imagenet.png",
    },
    "tune_smoke": SIZES | {
        "name": "tune_smoke", "datasets": ["synbirds"], "rows": ["ms", "softmax"], "trials": 3, "startup_trials": 1,
        "prune_after": 1, "workers": 1, "out_dir": "runs/tune_smoke/tuned",
        "figure": "runs/tune_smoke/tuning_best_so_far.png", "patience": 1, "epochs": 2, "backbone": "dml_convnet",
        "image_size": 32, "embedding_dim": 16, "classes_per_batch": 4, "samples_per_class": 3, "steps_per_epoch": 2,
        "train_classes": 12, "test_classes": 8, "regime": "scratch",
    },
}  # fmt: skip


@pytest.mark.parametrize("plan", sorted(EXPECTED))
def test_every_tuning_plan_resolves_to_the_values_it_held_when_it_repeated_the_protocol(plan):
    values = load_tune_config(ROOT / "plans" / f"{plan}.yaml").to_dict()
    values.pop("protocol", None)
    # lr and autocast joined the shared fields later: every plan's protocol holds the values trials trained at
    assert (values.pop("lr"), values.pop("autocast")) == (TrainConfig.lr, TrainConfig.autocast)
    assert values == EXPECTED[plan]


PAPER_TRIALS = {  # row → run folder of its trial 0 (the paper defaults) on emoji in plans/tune_imagenet.yaml
    "ms": "emoji-ms-b432b62093-949bce17",
    "crt": "emoji-crt-962fd2677a-2963b862",
    "diml": "emoji-diml-ba994c19ca-19db23bd",
    "cross_attention": "emoji-cross_attention-8e052a0f74-e1c88cf1",
    "dgcrl": "emoji-dgcrl-c0b7f8e86b-b81add73",
    "softmax": "emoji-softmax-7cc3d3a20d-1a4f0215",
    "triplet": "emoji-triplet-51fb5c4682-23049831",
    "lifted": "emoji-lifted-7e8fc289fe-c159932f",
    "normsoftmax": "emoji-normsoftmax-13372b17e7-d80ebd91",
}
MS_TRIAL = {
    "lr": 0.0123,
    "method_kwargs.loss_kwargs.alpha": 3.5,
    "method_kwargs.loss_kwargs.beta": 40.0,
    "method_kwargs.loss_kwargs.base": 0.6,
    "method_kwargs.loss_kwargs.margin": 0.2,
}


def trial(config, dataset: str, row: str, params: dict):
    return trial_config(
        config.base_config(dataset), search.merged(row_spec(row), search.nested(params)), f"{dataset}-{row}"
    )


def test_the_trials_of_the_imagenet_tuning_plan_keep_their_run_folders():
    config = load_tune_config(ROOT / "plans" / "tune_imagenet.yaml")
    for row, folder in PAPER_TRIALS.items():
        assert trial(config, "emoji", row, search.paper_values(search_space(row))).run_dir.name == folder, row
    assert trial(config, "emoji", "ms", MS_TRIAL).run_dir.name == "emoji-ms-04f4004416-6f109208"
    softmax = trial(config, "emoji", "softmax", {"lr": 0.001, "head_lr": 0.05})
    assert softmax.run_dir.name == "emoji-softmax-3c089c3e6e-8e73547c"
    assert softmax.run_dir.parent.name == "tune_imagenet"
    smoke = load_tune_config(ROOT / "plans" / "tune_smoke.yaml")
    assert trial(smoke, "synbirds", "ms", {"lr": 0.002}).run_dir.name == "synbirds-ms-7c63ef7669-43614dd4"


def test_a_trial_records_where_each_of_its_values_came_from():
    config = load_tune_config(ROOT / "plans" / "tune_imagenet.yaml")
    assert config.origins["patience"] == "protocol: plans/default.yaml"
    assert config.origins["trials"] == config.origins["validation_fold"] == "plan: plans/tune_imagenet.yaml"
    origins = identity.origins_of(trial(config, "emoji", "ms", MS_TRIAL))
    assert origins["patience"] == origins["backbone"] == origins["dataset"] == "protocol: plans/default.yaml"
    assert origins["study"] == origins["validation_fold"] == "plan: plans/tune_imagenet.yaml"
    assert origins["warmup_epochs"] == origins["stem_views"] == "regime: imagenet"
    assert origins["lr"] == origins["method"] == origins["method_kwargs.loss_kwargs.alpha"] == "trial"
    assert origins["final_test"] == "variant" and origins["optimizer"] == "default"


def test_a_value_changed_in_the_study_plans_protocol_reaches_its_runs_and_its_tuning_trials(tmp_path):
    study_plan = tmp_path / "default.yaml"
    study_plan.write_text((ROOT / "plans" / "default.yaml").read_text().replace("  patience: 2\n", "  patience: 5\n"))
    tune_plan = tmp_path / "tune.yaml"
    tune_plan.write_text(
        (ROOT / "plans" / "tune_imagenet.yaml")
        .read_text()
        .replace("protocol: plans/default.yaml", f"protocol: {study_plan}")
    )
    protocol = ProtocolConfig(**plan_protocol(study_plan))
    assert protocol.train_config(dataset="emoji", method="ms", seed=0, name="ms").patience == 5
    config = load_tune_config(tune_plan)
    trial_run = trial(config, "emoji", "ms", MS_TRIAL)
    assert trial_run.patience == 5 and identity.origins_of(trial_run)["patience"] == f"protocol: {study_plan}"
    assert trial_run.run_dir.name != "emoji-ms-04f4004416-6f109208"  # another protocol, another run

    lr_plan = tmp_path / "default_lr.yaml"  # lr, declared once in the study plan, reaches a trial at the paper defaults
    lr_plan.write_text(
        (ROOT / "plans" / "default.yaml")
        .read_text()
        .replace("protocol: &protocol\n", "protocol: &protocol\n  lr: 0.002\n")
    )
    lr_tune = tmp_path / "tune_lr.yaml"
    lr_tune.write_text(tune_plan.read_text().replace(f"protocol: {study_plan}", f"protocol: {lr_plan}"))
    untuned = ProtocolConfig(**(plan_protocol(lr_plan) | {"tuned": ""}))  # a tuned row's lr is its tuned value
    assert untuned.train_config(dataset="emoji", method="ms", seed=0, name="ms").lr == 0.002
    lr_config = load_tune_config(lr_tune)
    assert lr_config.lr == 0.002 and lr_config.origins["lr"] == f"protocol: {lr_plan}"
    assert lr_config.base_config("emoji").lr == 0.002

    tune_plan.write_text(tune_plan.read_text() + "patience: 3\n")  # the tuning plan's own value wins, and says so
    config = load_tune_config(tune_plan)
    assert config.patience == 3 and config.origins["patience"] == f"plan: {tune_plan}"


def test_a_tuning_plan_naming_a_study_plan_without_a_protocol_block_is_refused(tmp_path):
    tune_plan = tmp_path / "tune.yaml"
    tune_plan.write_text("protocol: plans/smoke.yaml\nrows: [ms]\n")
    with pytest.raises(ValueError, match=r"tune.yaml: parameter 'protocol': plans/smoke.yaml: expected a 'protocol:'"):
        load_tune_config(tune_plan)
    tune_plan.write_text("protocol: plans/nowhere.yaml\nrows: [ms]\n")
    with pytest.raises(ValueError, match="study plan plans/nowhere.yaml not found"):
        load_tune_config(tune_plan)


def test_the_default_plans_train_entry_shows_the_compared_ms_run_resolved_from_the_plan():
    [entry] = [entry for entry in load_plan(ROOT / "plans" / "default.yaml") if entry.run_name == "train"]
    assert entry.parameters == {"study_plan": "plans/default.yaml", "dataset": "emoji", "method": "ms", "seed": 0}
    config = OneRun(**entry.parameters, study=entry.study).resolved()
    assert config.run_dir.name == "imagenet-emoji-ms-seed0-006c64ae"  # the folder the comparison trains
    compared = ProtocolConfig(**plan_protocol(ROOT / "plans" / "default.yaml"), study="default")
    assert config == compared.train_config(dataset="emoji", method="ms", seed=0, name="ms")
    origins = identity.origins_of(config)
    assert origins["patience"] == "protocol" and origins["warmup_epochs"] == "regime: imagenet"
    assert origins["lr"] == "tuned: plans/tuned/imagenet/emoji.yaml"
    assert OneRun(epochs=3).resolved() == TrainConfig(epochs=3)  # without a study plan: the fields as given


OWN_MEANING = {"study", "seed", "validation_fold", "progress"}  # same name, another meaning per config (run_settings)


def _declarations(klass) -> dict[str, bool]:
    """The fields ``klass``'s own body annotates: name → whether the line carries a description comment."""
    source = inspect.getsource(klass)
    return {
        match[1]: bool(match[2])
        for match in re.finditer(r"^    (\w+): [\w\[\], |]+ = .*?(  # .*)?$", source, re.MULTILINE)
    }


def test_the_settings_the_configs_share_are_declared_once():
    configs = [TrainConfig, ProtocolConfig, TuneConfig]
    names = [set(config.field_names()) for config in configs]
    shared = {
        name for index, own in enumerate(names) for name in own if any(name in other for other in names[index + 1 :])
    }
    assert shared - OWN_MEANING == set(StudySettings.field_names())
    declared_where = {name: [] for name in shared - OWN_MEANING}
    for klass in [RunSettings, StudySettings, *configs]:
        for name, described in _declarations(klass).items():
            if name in declared_where and described:
                declared_where[name].append(klass.__name__)
    assert {name: where for name, where in declared_where.items() if len(where) != 1} == {}, (
        "a shared setting is described in exactly one class; a config restates only its default"
    )
    assert all(issubclass(config, RunSettings) for config in configs)
    for name in shared - OWN_MEANING:
        helps = {config.__name__: config.field_help()[name] for config in configs if name in config.field_names()}
        assert len(set(helps.values())) == 1, (name, helps)
    assert set(PROTOCOL_FIELDS) == set(ProtocolConfig.field_names()) & set(TuneConfig.field_names())


def test_a_restated_default_keeps_the_one_description():
    assert TuneConfig().epochs == 12 and TrainConfig().epochs == 2 and ProtocolConfig().steps_per_epoch == 4
    assert (
        TuneConfig.field_help()["epochs"]
        == TrainConfig.field_help()["epochs"]
        == "training epochs; with patience, the cap"
    )
    with pytest.raises(ValueError, match=r"^parameter 'autocast' must be one of \['auto', 'bf16', 'off'\], got 'fp8'"):
        TuneConfig(autocast="fp8")
