"""The command line explains itself (help from the config's comments, valid names listed) and answers help,
``list`` and a mistyped name without importing torch (from a catalogue that equals the registries), and every long
wait shows progress: dataset generation, the study runner (without the kernel's TCP warning)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import json
import os
import re
import subprocess
import sys
import textwrap
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest
import yaml

from dmlstudy import catalog
from dmlstudy.cli import LISTABLE, build_parser, listing, main
from dmlstudy.config import TypedConfig

REPO = Path(__file__).resolve().parents[1]


@functools.cache
def help_text(*argv: str) -> str:
    """``dmlstudy <argv> --help`` with whitespace normalised (argparse wraps lines); built once per command."""
    output = io.StringIO()
    with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stdout(output):
        build_parser().parse_args([*argv, "--help"])
    assert exit_info.value.code == 0
    return " ".join(output.getvalue().split())


def source_comment(field_name: str) -> str:
    """The comment after a TrainConfig field, read by a plain regular expression from run/train.py (a run's own
    fields) or run/settings.py (those it shares with the protocol and tuning plans)."""
    sources = [(REPO / "dmlstudy" / "run" / name).read_text() for name in ("train.py", "settings.py")]
    matches = [re.search(rf"^    {field_name}: \w+ = .*?  # (.*)$", source, re.MULTILINE) for source in sources]
    [match] = [match for match in matches if match]
    return match.group(1).strip()


@pytest.mark.parametrize(
    "name, default",
    [("epochs", "2"), ("train_classes", "16"), ("lr_schedule", "'cosine'"), ("method", "'ms'"), ("progress", "True")],
)
def test_train_option_help_is_the_field_comment_and_default(name, default):
    text = help_text("train")
    option = "--" + name.replace("_", "-")
    options = text[text.index(" options: ") :]  # after the usage lines, which name every option too
    entry = options[re.search(rf"{option}[ ,]", options).start() :]
    assert entry.split("[default: ", 1)[0].endswith(source_comment(name) + " ")
    assert entry.split("[default: ", 1)[1].startswith(default + "]")


def test_choice_options_list_the_registered_names():
    from dmlstudy.data import list_datasets
    from dmlstudy.methods import list_methods

    text = help_text("train")
    text = text[text.index(" options: ") :]
    method_help = text[text.index("--method NAME") : text.index("--method-kwargs")]
    dataset_help = text[text.index("--dataset NAME") : text.index("--method NAME")]
    assert all(name in method_help for name in list_methods())
    assert all(name in dataset_help for name in list_datasets())
    backbone_help = text[text.index("--backbone BACKBONE") : text.index("--pretrained")]
    assert "dml_convnet" in backbone_help and "any timm model name" in backbone_help


@pytest.mark.parametrize(
    "option, registry", [("--method", "methods"), ("--dataset", "datasets"), ("--optimizer", "optimizers")]
)
def test_an_unknown_name_is_refused_with_the_valid_names(capsys, option, registry):
    from dmlstudy.data import list_datasets
    from dmlstudy.methods import list_methods
    from dmlstudy.run.train import OPTIMIZERS

    valid = {"methods": list_methods(), "datasets": list_datasets(), "optimizers": list(OPTIMIZERS)}[registry]
    with pytest.raises(SystemExit) as exit_info:
        main(["train", option, "no_such_name"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "invalid choice: 'no_such_name'" in error
    assert all(f"'{name}'" in error for name in valid)


def listed(capsys, what: str) -> dict[str, str]:
    assert main(["list", what]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    return {line.split()[0]: line.split(None, 1)[1] if len(line.split()) > 1 else "" for line in lines}


def test_list_methods_lists_every_registered_method_with_a_description(capsys):
    from dmlstudy.methods import list_methods

    rows = listed(capsys, "methods")
    assert sorted(rows) == list_methods()
    assert all(rows.values())
    from dmlstudy.methods import method_info

    for name, row in rows.items():  # the registry's label and group lead every line
        info = method_info(name)
        assert row.startswith(f"{info.label} [{info.group}]"), row
    assert rows["crt"].startswith("CRT [paper] — Kan et al., NeurIPS 2022") and "[classic]" in rows["triplet"]


def test_list_datasets_backbones_and_plans(capsys):
    from dmlstudy.data import list_datasets

    datasets = listed(capsys, "datasets")
    assert sorted(datasets) == list_datasets() and all(datasets.values())
    backbones = listed(capsys, "backbones")
    assert {"dml_convnet", "resnet50.tv_in1k"} <= set(backbones)
    plans = listed(capsys, "plans")
    expected = {str(p.relative_to(REPO)) for p in (REPO / "plans").rglob("*.yaml")}
    assert expected <= set(plans)
    assert plans["plans/smoke.yaml"].startswith("Every notebook at its CI-sized defaults")


HEAVY_MODULES = ("torch", "torchvision", "timm", "pandas", "matplotlib")
RUN_CLI = textwrap.dedent(f"""
    import contextlib, io, json, sys
    from dmlstudy import cli
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(sys.argv[1:])
        except SystemExit as exit:
            code = exit.code
    heavy = sorted(m for m in {HEAVY_MODULES!r} if m in sys.modules)
    print(json.dumps({{"code": code, "out": out.getvalue(), "err": err.getvalue(), "heavy": heavy}}))
""")


def run_light(*argv: str) -> dict:
    """``dmlstudy <argv>`` in a fresh interpreter: its exit code, stdout, stderr and the heavy modules it loaded."""
    env = {k: v for k, v in os.environ.items() if k != catalog.PLUGIN_VARIABLE}
    if catalog.stored_catalog() is None:  # the first command after a source change reads the registries and caches them
        subprocess.run([sys.executable, "-m", "dmlstudy", "list", "methods"], cwd=REPO, env=env, capture_output=True)
    assert catalog.stored_catalog() is not None, "the catalogue cache was not written"
    done = subprocess.run(
        [sys.executable, "-c", RUN_CLI, *argv], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    "argv, shown",
    [
        ((), "usage: dmlstudy"),
        (("train",), "--method NAME"),
        (("pretrain",), "--epochs EPOCHS"),
        (("tune",), "plans/tune.yaml"),
        (("study", "run"), "--scheduler ADDRESS"),
        (("list",), "methods,datasets,backbones,plans"),
    ],
)
def test_help_imports_no_heavy_module(argv, shown):
    result = run_light(*argv, "--help")
    assert (result["code"], result["heavy"]) == (0, [])
    assert shown in result["out"]


def test_listing_imports_no_heavy_module_and_shows_the_registries():
    from dmlstudy.data import list_datasets
    from dmlstudy.methods import list_methods, method_info
    from dmlstudy.models import list_backbones

    methods = run_light("list", "methods")
    assert (methods["code"], methods["heavy"]) == (0, [])
    rows = dict(line.split(None, 1) for line in methods["out"].splitlines())
    assert sorted(rows) == list_methods()
    for name, row in rows.items():
        info = method_info(name)
        assert row == f"{info.label} [{info.group}]" + (f" — {info.paper}" if info.paper else "") + f": {info.summary}"
    datasets, backbones = run_light("list", "datasets"), run_light("list", "backbones")
    assert datasets["heavy"] == backbones["heavy"] == []
    assert [line.split()[0] for line in datasets["out"].splitlines()] == list_datasets()
    assert [line.split()[0] for line in backbones["out"].splitlines()][:-1] == list(list_backbones())


@pytest.mark.parametrize(
    "argv, valid",
    [
        (("train", "--method", "nosuch"), "methods"),
        (("train", "--dataset", "nosuch"), "datasets"),
        (("train", "--lr-schedule", "nosuch"), "lr_schedules"),
        (("list", "nosuch"), "listable"),
    ],
)
def test_an_unknown_name_is_refused_before_any_heavy_import(argv, valid):
    from dmlstudy.data import list_datasets
    from dmlstudy.methods import list_methods
    from dmlstudy.run.train import SCHEDULES

    names = {"methods": list_methods(), "datasets": list_datasets(), "lr_schedules": SCHEDULES, "listable": LISTABLE}
    result = run_light(*argv)
    assert (result["code"], result["heavy"], result["out"]) == (2, [], "")
    assert "invalid choice: 'nosuch'" in result["err"]
    assert all(f"'{name}'" in result["err"] for name in names[valid])


def test_the_catalogue_equals_the_registries(monkeypatch, tmp_path):
    """Names and every shown field, against the registries and configs themselves (not through the catalogue)."""
    from dmlstudy.data import DATASETS
    from dmlstudy.methods import METHOD_INFO, list_methods
    from dmlstudy.models import list_backbones
    from dmlstudy.run.pretrain import PretrainConfig
    from dmlstudy.run.train import OPTIMIZERS, SCHEDULES, TrainConfig

    monkeypatch.delenv(catalog.PLUGIN_VARIABLE, raising=False)
    monkeypatch.setenv(catalog.CACHE_VARIABLE, str(tmp_path))
    names = catalog.catalog()  # read from the registries and cached
    assert catalog.stored_catalog() == names
    assert {name: (entry.label, entry.group, entry.paper, entry.summary) for name, entry in names.methods.items()} == {
        name: (i.label, i.group, i.paper, i.summary) for name, i in METHOD_INFO.items()
    }
    assert list(names.methods) == list_methods()
    assert names.datasets == {
        name: (builder.__doc__ or "").strip().splitlines()[0].replace("``", "")
        for name, builder in sorted(DATASETS.items())
    }
    assert names.backbones == list_backbones()
    assert (names.optimizers, names.lr_schedules) == (sorted(OPTIMIZERS), sorted(SCHEDULES))
    for config, options in ((TrainConfig, names.train_options), (PretrainConfig, names.pretrain_options)):
        hints, defaults = typing.get_type_hints(config), config()
        expected = [(f.name, hints[f.name].__name__, getattr(defaults, f.name)) for f in dataclasses.fields(config)]
        assert [(o.name, o.type, o.default) for o in options] == expected
        assert {o.name: o.help for o in options} == config.field_help()
    assert names == catalog.live_catalog()


def test_a_cached_catalogue_is_read_only_for_the_sources_it_was_read_from(tmp_path, monkeypatch):
    monkeypatch.delenv(catalog.PLUGIN_VARIABLE, raising=False)
    monkeypatch.setenv(catalog.CACHE_VARIABLE, str(tmp_path))
    live = catalog.live_catalog()
    shortened = dataclasses.replace(live, methods={"ms": live.methods["ms"]})
    catalog.write_catalog(live=shortened)
    assert catalog.catalog() == shortened  # the cache of these sources is what is read
    monkeypatch.setattr(catalog, "source_digest", lambda: "0" * 64)  # the sources changed
    assert catalog.catalog() == live and catalog.stored_catalog() == live  # read again and cached under the new digest
    catalog.cache_file().write_text("{damaged")
    assert catalog.catalog() == live


PLUGIN = textwrap.dedent('''
    from dmlstudy.methods import Method, register_method


    @register_method("throwaway_cli", label="throwaway (test)", group="classic", summary="a plugin method")
    class ThrowawayCLI(Method):
        """Never built."""
''')


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A plugin method module on sys.path and in DMLSTUDY_METHOD_MODULES; unregistered afterwards."""
    from dmlstudy.methods import METHOD_INFO, METHODS

    (tmp_path / "throwaway_cli_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(catalog.PLUGIN_VARIABLE, "throwaway_cli_plugin")
    yield "throwaway_cli"
    METHODS.pop("throwaway_cli", None)
    METHOD_INFO.pop("throwaway_cli", None)
    sys.modules.pop("throwaway_cli_plugin", None)


def test_a_plugin_method_is_listed_and_accepted(plugin):
    import dmlstudy.methods

    assert catalog.PLUGIN_VARIABLE == dmlstudy.methods.PLUGIN_VARIABLE
    assert listing("methods")[plugin] == "throwaway (test) [classic]: a plugin method"
    assert build_parser().parse_args(["train", "--method", plugin]).method == plugin


def test_run_warnings_print_as_one_line(monkeypatch, capsys):
    from dmlstudy.cli import _show_run_warnings
    from dmlstudy.run.identity import RunWarning

    shown_before = []
    monkeypatch.setattr(
        warnings, "showwarning", lambda message, category, *_: shown_before.append((str(message), category))
    )
    _show_run_warnings()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("the lock was stale", RunWarning, stacklevel=1)
        warnings.warn("something else", UserWarning, stacklevel=1)
    assert capsys.readouterr().err == "warning: the lock was stale\n"
    assert shown_before == [("something else", UserWarning)]  # other warnings go where they went before


@dataclass
class _Base(TypedConfig):
    name: str = "a # not a comment"  # the name
    sizes: list = field(  # sizes, comment on the first line
        default_factory=lambda: [1, 2],
    )
    bare: int = 0


@dataclass
class _Derived(_Base):
    name: str = "b"
    extra: float = 1.0  # ratio: 100 % means all


def test_field_help_reads_comments_from_the_source():
    assert _Base.field_help() == {"name": "the name", "sizes": "sizes, comment on the first line", "bare": ""}
    assert _Derived.field_help() == {
        "name": "the name",
        "sizes": "sizes, comment on the first line",
        "bare": "",
        "extra": "ratio: 100 % means all",
    }


def test_paper_configs_state_full_sizes():
    """TrainConfig's defaults are CI-sized, so a paper config must not rely on them for its sizes."""
    for path in sorted((REPO / "plans" / "papers").glob("*.yaml")):
        parameters = yaml.safe_load(path.read_text())["parameters"]
        assert {parameters.get(k) for k in ("steps_per_epoch", "train_classes", "test_classes")} == {0}, path.name


def test_generation_shows_a_progress_bar(tmp_path, capsys):
    from dmlstudy.data.embedded import ensure_generated
    from dmlstudy.data.synbirds import SynBirdsGenerator

    ensure_generated(tmp_path / "birds", SynBirdsGenerator(num_classes=4, images_per_class=5, workers=2), seed=0)
    error = capsys.readouterr().err
    assert "generating synbirds" in error and "20/20" in error


def write_notebook(path: Path) -> Path:
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    parameters = nbformat.v4.new_code_cell("study: str = 'x'\nrun_name: str = ''\nruns_root: str = ''\nvalue: int = 1")
    parameters.metadata["tags"] = ["parameters"]
    notebook.cells = [parameters, nbformat.v4.new_code_cell("print(value * 2)")]
    path.write_text(nbformat.writes(notebook))
    return path


def test_study_runner_shows_progress_without_the_kernel_tcp_warning(tmp_path, capfd):
    import zmq

    from dmlstudy.study.executor import run_plan

    if not zmq.has("curve"):
        pytest.skip("this pyzmq has no CurveZMQ: the kernel manager cannot encrypt, and the kernel warns")
    notebook = write_notebook(tmp_path / "echo.ipynb")
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"study: s\nentries:\n  - name: e\n    notebook: {notebook}\n    grid: {{value: [1, 2]}}\n")
    outcomes = run_plan(plan, root=tmp_path / "runs")
    assert [o.status for o in outcomes] == ["complete", "complete"]
    captured = capfd.readouterr()
    everything = captured.out + captured.err
    assert "Kernel is running over TCP" not in everything and "without encryption" not in everything
    assert "notebooks 2/2 ended" in captured.err  # the bar over the plan's runs counts its notebooks too
    assert "cell" in captured.err  # papermill's bar over the cells
    assert "[1/2] e-value=1" in captured.out and "plan plan.yaml: 2 ran" in captured.out
