"""The ``dmlstudy`` command: ``train``, ``list``, ``data generate``, ``data fetch``, ``study run``, ``study table``
and ``tune``.

``dmlstudy train --method ms --epochs 8 --steps-per-epoch 0 --train-classes 0 --test-classes 0`` runs
:func:`dmlstudy.run.train.run` (with no options: the CI-sized run of TrainConfig's defaults); every field of
:class:`dmlstudy.run.train.TrainConfig` is an option (``--method-kwargs '{"K1": 16}'`` for dicts and lists,
``--resume/--no-resume`` for booleans), whose help is the field's comment and default. ``dmlstudy list
methods|datasets|backbones|plans`` prints the valid names with one line each. A finished run is loaded, not
retrained; ``--overwrite`` replaces it.

Help, ``list`` and a mistyped name answer without importing torch: the names, descriptions and options come
from :mod:`dmlstudy.catalog`; a command imports what it runs when it runs.

Errors print one line, ``error: <message>``, and exit with status 1; ``--debug`` (anywhere on the command
line) or ``DMLSTUDY_DEBUG=1`` shows the traceback instead. A run stopped by SIGTERM/SIGINT exits 143/130
after printing how to resume it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dmlstudy.catalog import OPTION_TYPES, Catalog, ConfigOption, catalog, first_line
from dmlstudy.config import load_yaml


def _config_choices(registered: Catalog) -> dict[str, list[str]]:
    """Valid names of TrainConfig's choice-valued fields, from their registries (argparse enforces them)."""
    return {
        "method": list(registered.methods),
        "dataset": list(registered.datasets),
        "optimizer": registered.optimizers,
        "lr_schedule": registered.lr_schedules,
    }


def _option_help(comment: str, default: object, choices: list[str] | None) -> str:
    text = f"{comment} [default: {default!r}]" if comment else f"[default: {default!r}]"
    if choices and not all(name in comment for name in choices):
        text += f"; one of: {', '.join(choices)}"
    return text.replace("%", "%%")  # argparse %-formats help strings


def _add_config_options(parser: argparse.ArgumentParser, registered: Catalog) -> None:
    """One option per TrainConfig field; its help is the field's comment (:meth:`TypedConfig.field_help`)
    and default, plus the valid names of choice-valued fields."""
    choices = _config_choices(registered)
    for spec in registered.train_options:
        option = "--" + spec.name.replace("_", "-")
        kind = OPTION_TYPES[spec.type]
        text = _option_help(spec.help, spec.default, choices.get(spec.name))
        if spec.name == "backbone":
            text += "; e.g. " + ", ".join(registered.backbones)
        if kind is bool:
            parser.add_argument(
                option, dest=spec.name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=text
            )
        elif kind in (dict, list):
            parser.add_argument(
                option, dest=spec.name, type=load_yaml, default=argparse.SUPPRESS, metavar="YAML", help=text
            )
        elif spec.name in choices:
            parser.add_argument(
                option, dest=spec.name, choices=choices[spec.name], default=argparse.SUPPRESS, metavar="NAME", help=text
            )
        else:
            parser.add_argument(option, dest=spec.name, type=kind, default=argparse.SUPPRESS, help=text)


def config_options(fields: Mapping[str, Any]) -> list[str]:
    """The ``dmlstudy train`` options that set ``fields`` (TrainConfig field → value), the inverse of
    :func:`_add_config_options`: ``--name value``, ``--flag``/``--no-flag`` for booleans, JSON (which YAML
    reads) for dicts and lists."""
    arguments: list[str] = []
    for name, value in fields.items():
        option = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            arguments.append(option if value else "--no-" + option[2:])
        elif isinstance(value, (dict, list)):
            arguments += [option, json.dumps(value)]
        else:
            arguments += [option, str(value)]
    return arguments


def _train(args: argparse.Namespace) -> int:
    from dmlstudy.distributed import is_main_process
    from dmlstudy.run.train import TrainConfig, is_complete, run

    values = _config_file_values(args.config) if args.config else {}
    values.update({k: v for k, v in vars(args).items() if k in TrainConfig.field_names()})
    config = TrainConfig(**values)
    reused = is_complete(config) and not config.overwrite
    result = run(config)
    if not is_main_process():
        return 0
    shown = {k: round(v, 4) for k, v in result.metrics.items() if isinstance(v, float)}
    note = " (finished earlier: loaded, not retrained; --overwrite trains it again)" if reused else ""
    print(f"run folder: {result.run_dir}{note}\nmetrics: {shown}")
    return 0


def _config_file_values(path: str) -> dict:
    """The TrainConfig fields of a ``--config`` YAML file (its ``parameters`` mapping, or the top level)."""
    from dmlstudy.run.train import TrainConfig

    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"--config {path}: file not found")
    loaded = load_yaml(file.read_text()) or {}
    parameters = loaded.get("parameters", loaded) if isinstance(loaded, dict) else loaded
    if not isinstance(parameters, dict):
        raise ValueError(f"--config {path}: expected a mapping of TrainConfig fields, got {type(parameters).__name__}")
    unknown = sorted(set(parameters) - set(TrainConfig.field_names()))
    if unknown:
        raise ValueError(f"--config {path}: unknown TrainConfig fields {unknown}; valid: {TrainConfig.field_names()}")
    return dict(parameters)


def _generate(args: argparse.Namespace) -> int:
    from dmlstudy.data import build_dataset
    from dmlstudy.paths import data_root

    root = Path(args.data_root) if args.data_root else data_root()
    names = list(args.datasets)
    if args.plan:
        from dmlstudy.study.plan_inputs import plan_datasets

        names += [name for name in plan_datasets(args.plan) if name not in names]
    for name in names or ["synbirds", "glyphs"]:
        train, test = build_dataset(name, root / name, "train"), build_dataset(name, root / name, "test")
        print(
            f"{name}: {len(train)} train images / {train.num_classes} classes, {len(test)} test images / {test.num_classes} classes in {root / name}"
        )
        if name == "emoji":
            from dmlstudy.data.emoji import fingerprint_report

            print(fingerprint_report(root / name))
            if args.plan:
                from dmlstudy.paths import different_build_message
                from dmlstudy.study.plan import plan_study

                message = different_build_message(plan_study(args.plan))
                if message:
                    print(message)
    return 0


def _fetch(args: argparse.Namespace) -> int:
    from dmlstudy.data.fetch import NotDownloadable, fetch
    from dmlstudy.paths import data_root

    try:
        fetch(args.name, args.data_root or data_root(), url=args.url, keep_archive=args.keep_archive)
    except NotDownloadable as where_to_get_it:
        print(where_to_get_it)
        return 1
    return 0


def _method_description(registered: Catalog, name: str) -> str:
    """One line about a registered method, from the registry: its label, group and paper or summary."""
    info = registered.methods[name]
    return (
        f"{info.label} [{info.group}]"
        + (f" — {info.paper}" if info.paper else "")
        + (f": {info.summary}" if info.summary else "")
    )


def _plan_description(path: Path, *, width: int = 110) -> str:
    """The first sentence of a plan file's opening comment, cut to ``width`` characters."""
    words = []
    for line in path.read_text().splitlines():
        text = line.lstrip("#").strip()
        if not line.startswith("#") or not text:
            break
        words.append(text)
    sentence = re.split(r"(?<=\.)\s", " ".join(words), maxsplit=1)[0]
    return sentence if len(sentence) <= width else sentence[: width - 1].rstrip() + "…"


def listing(what: str) -> dict[str, str]:
    """``name → one line`` for ``what`` in methods, datasets, backbones, plans (what ``dmlstudy list`` prints)."""
    if what == "methods":
        registered = catalog()
        return {name: _method_description(registered, name) for name in registered.methods}
    if what == "datasets":
        return dict(catalog().datasets)
    if what == "backbones":
        return {
            **catalog().backbones,
            "<any timm model name>": "any name of timm.list_models(); --pretrained takes its weights from the Hugging Face cache (downloaded once when online)",
        }
    if what == "plans":
        from dmlstudy.paths import project_root

        plans = project_root() / "plans"
        return {
            str(path.relative_to(project_root())): _plan_description(path)
            for path in sorted(plans.rglob("*.yaml"), key=lambda path: (len(path.parts), path))  # shallow first
        }
    raise ValueError(f"cannot list {what!r}; valid: {', '.join(LISTABLE)}")


LISTABLE = ("methods", "datasets", "backbones", "plans")


def _list(args: argparse.Namespace) -> int:
    items = listing(args.what)
    width = max(map(len, items), default=0)
    for name, line in items.items():
        print(f"{name:<{width}}  {line}".rstrip())
    if args.what == "plans":
        print(
            "\nrun a study plan: dmlstudy study run plans/<plan>.yaml; train one paper config: dmlstudy train --config "
            "plans/papers/<config>.yaml; tune: make tune PLAN=plans/tune_imagenet.yaml writes "
            "plans/tuned/imagenet/emoji.yaml, the values the default study reads (make tune alone also tunes the embedded "
            "study's two regimes: plans/tune.yaml, plans/tune_pretrained.yaml)"
        )
    return 0


def _study_run(args: argparse.Namespace) -> int:
    from dmlstudy.study.executor import run_plan

    _use_scheduler(args.scheduler)
    from dmlstudy.paths import PUBLISH_DIFFERENT_BUILD, different_build_message
    from dmlstudy.study.plan import plan_study
    from dmlstudy.study.plan_inputs import prepare_stem_caches, stem_configs

    if args.publish_different_build:
        os.environ[PUBLISH_DIFFERENT_BUILD] = "1"  # the notebooks' kernels inherit it
    message = different_build_message(plan_study(args.plan))
    if message:
        print(message, flush=True)
    prepare_stem_caches(stem_configs(args.plan, only=args.only))
    outcomes = run_plan(args.plan, root=args.runs_root, only=args.only, overwrite=args.overwrite)
    return 1 if any(o.status == "failed" for o in outcomes) else 0


def _study_publish(args: argparse.Namespace) -> int:
    from dmlstudy.paths import PUBLISH_DIFFERENT_BUILD, different_build_message, project_root, study_outputs
    from dmlstudy.study.plan import plan_study
    from dmlstudy.study.publish import publish_plan

    if args.publish_different_build:
        os.environ[PUBLISH_DIFFERENT_BUILD] = "1"
    study = plan_study(args.plan)
    message = different_build_message(study)
    if message:
        print(message, flush=True)
    published = publish_plan(args.plan, root=args.runs_root, html=not args.no_html)
    figures = study_outputs(study, "figures", runs_root_override=args.runs_root or "")
    if (figures / "README.md").is_file():  # written by the plan's notebooks before the copies existed
        from dmlstudy.study.figure_index import write_figures_readme

        write_figures_readme(figures, study=study)  # now it links them
    folder = study_outputs(study, "published", runs_root_override=args.runs_root or "")
    shown = folder.relative_to(project_root()) if folder.is_relative_to(project_root()) else folder
    print(f"published {len(published)} executed notebooks of study {study!r} into {shown}/ (index: {shown}/README.md)")
    changed = [item.notebook for item in published if item.source_changed]
    if changed:
        print(
            f"note: {', '.join(changed)} changed after {'it' if len(changed) == 1 else 'they'} executed, so "
            f"{'its copy shows' if len(changed) == 1 else 'their copies show'} the old text; "
            f"`dmlstudy study run {args.plan}` executes {'it' if len(changed) == 1 else 'them'} again (finished runs "
            "are loaded, not retrained); publish after it (`make study` does both)"
        )
    return 0


def _use_scheduler(address: str) -> None:
    """``--scheduler``: check the address now (a clear error within seconds), then hand it to the notebook
    kernels through ``DMLSTUDY_SCHEDULER``, which :mod:`dmlstudy.study.engine` reads."""
    from dmlstudy.study import engine

    if address:
        try:
            engine.connect(address).close()
        except engine.EngineError as error:
            raise SystemExit(str(error)) from None
        os.environ[engine.SCHEDULER_VARIABLE] = address


def _study_robustness(args: argparse.Namespace) -> int:
    import pandas as pd

    from dmlstudy.experiments import rerank
    from dmlstudy.findings import robustness
    from dmlstudy.paths import runs_root, study_outputs

    kept = study_outputs(robustness.STUDY, "results") / robustness.RELATIVES_PER_SEED
    runs = Path(args.runs_root or runs_root()) / "default"
    if kept.is_file() and not args.recompute_relatives:
        relatives = pd.read_csv(kept)
    elif runs.is_dir():
        print(f"relatives out of the gallery: evaluating the default study's runs in {runs}", flush=True)
        default_per_seed = pd.read_csv(study_outputs("default", "results") / robustness.PER_SEED)
        relatives = rerank.relatives_per_seed(default_per_seed, runs)
        kept.parent.mkdir(parents=True, exist_ok=True)
        relatives.to_csv(kept, index=False)
    else:
        print(f"relatives out of the gallery: not computed (no runs in {runs}; run `make study` first)")
        relatives = None
    table = robustness.write_robustness(relatives)
    print(robustness.wide_table(table).to_string(index=False))
    print(f"written: {study_outputs(robustness.STUDY, 'results')}/claims.md, figures/robustness/robustness_forest.png")
    return 0


def _study_robustness_power(args: argparse.Namespace) -> int:
    from dmlstudy.findings import power
    from dmlstudy.paths import study_outputs

    simulation = power.write_power(draws=args.draws)
    print(power.summary(simulation).to_string(index=False))
    folder = study_outputs("robustness", "results")
    print(f"written: {folder}/{power.POWER_CSV}, {folder}/{power.POWER_MD}")
    return 0


def _study_table(args: argparse.Namespace) -> int:
    from dmlstudy.paths import study_outputs
    from dmlstudy.study.report import configuration_columns, configuration_text, gather_runs, summarize, write_table

    frame = gather_runs(args.study, root=args.runs_root)
    if frame.empty:
        print(f"no finished runs under study {args.study!r}", file=sys.stderr)
        return 1
    if frame.attrs.get("superseded"):
        left_out = frame.attrs["superseded"]
        print(
            f"left out {len(left_out)} run folder(s) that a newer configuration of the same run replaced "
            f"(not reported by the plan's last execution): {', '.join(left_out[:5])}{' …' if len(left_out) > 5 else ''}",
            file=sys.stderr,
        )
    settings = configuration_columns(frame, args.by)
    table = summarize(frame, by=[*args.by, *settings], metrics=args.metrics)
    table.insert(len(args.by), "configuration", configuration_text(table, settings))
    out = (
        Path(args.out)
        if args.out
        else study_outputs(args.study, "results", runs_root_override=args.runs_root or "") / "runs"
    )
    shown = [*args.by, *(["configuration"] if settings else []), "runs", *args.metrics]
    csv_path, md_path = write_table(table, out, display_columns=shown)
    print(table[shown].to_markdown(index=False))
    print(f"\nwritten: {csv_path}, {md_path}")
    return 0


def _tune(args: argparse.Namespace) -> int:
    from dmlstudy.study.tuning import run_tune_plan

    _use_scheduler(args.scheduler)
    command = (
        " ".join(["dmlstudy", "tune", *sys.argv[2:]]) if sys.argv[1:2] == ["tune"] else f"dmlstudy tune {args.plan}"
    )
    written = run_tune_plan(
        args.plan, command=command, runs_root=args.runs_root, out_dir=args.out_dir, figure=args.figure
    )
    print("written: " + ", ".join(map(str, written)))
    return 0


def _add_tune_parser(commands: argparse._SubParsersAction) -> None:
    tune = commands.add_parser(
        "tune",
        help="tune every row of a tuning plan with Optuna on validation classes; writes plans/tuned/<dataset>.yaml",
        description="Per-row Optuna search (TPE, paper defaults first, median pruning) on validation classes; resumes "
        "from its journal files. The plan is a mapping of TuneConfig fields (see dmlstudy/study/tuning.py).",
    )
    tune.add_argument("plan", nargs="?", default="plans/tune.yaml", help="a tuning plan [default: plans/tune.yaml]")
    tune.add_argument("--runs-root", default=None, help="where trial runs and journals go [default: the plan's]")
    tune.add_argument("--out-dir", default=None, help="folder of the tuned-values files [default: the plan's]")
    tune.add_argument("--figure", default=None, help="best-so-far figure path, '' for none [default: the plan's]")
    tune.add_argument("--scheduler", default="", metavar="ADDRESS", help="Dask scheduler to train trials on")
    tune.set_defaults(handler=_tune)


def _train_description(registered: Catalog) -> str:
    return (
        first_line(registered.train_description)
        + "\n\n"
        + registered.train_description.split("\n\n", 1)[1].replace("``", "")
    )


TRAIN_EPILOG = """examples:
  dmlstudy train                                   the CI-sized run of the defaults (seconds)
  dmlstudy train --method crt --dataset glyphs --epochs 6 --steps-per-epoch 0 --train-classes 0 --test-classes 0
                                                   one run of the default study's protocol
  dmlstudy train --config plans/papers/crt_cub200.yaml --data-root /data/dml
valid names: dmlstudy list methods|datasets|backbones|plans"""


def _pretrain(args: argparse.Namespace) -> int:
    from dmlstudy.run.pretrain import PretrainConfig, pretrain, verify

    if args.verify:
        return 0 if verify(args.verify) else 1
    pretrain(PretrainConfig(**{k: v for k, v in vars(args).items() if k in PretrainConfig.field_names()}))
    return 0


def _add_pretrain_parser(commands: argparse._SubParsersAction, options: list[ConfigOption]) -> None:
    parser = commands.add_parser(
        "pretrain", help="pretrain a backbone on the shapes source set; writes weights/ + a model card"
    )
    for spec in options:
        text = _option_help(spec.help, spec.default, None)
        parser.add_argument(
            "--" + spec.name.replace("_", "-"),
            dest=spec.name,
            type=OPTION_TYPES[spec.type],
            default=argparse.SUPPRESS,
            help=text,
        )
    parser.add_argument(
        "--verify", default="", metavar="CARD", help="rebuild what a model card describes; compare hash (or accuracy)"
    )
    parser.set_defaults(handler=_pretrain)


def build_parser() -> argparse.ArgumentParser:
    registered = catalog()
    parser = argparse.ArgumentParser(
        prog="dmlstudy",
        description=__doc__.splitlines()[0],
        epilog="help on one command: dmlstudy <command> --help (e.g. dmlstudy train --help)",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        help="show the traceback of an error (anywhere on the line; or DMLSTUDY_DEBUG=1)",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser(
        "train",
        help="train and evaluate one method on one dataset",
        description=_train_description(registered),
        epilog=TRAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train.add_argument(
        "--config",
        default="",
        help="YAML file of TrainConfig fields (its 'parameters' mapping, or the top level); options given here override it",
    )
    _add_config_options(train, registered)
    train.set_defaults(handler=_train)

    listed = commands.add_parser("list", help="list the valid methods, datasets, backbones or plans, one line each")
    listed.add_argument("what", choices=LISTABLE, help="what to list")
    listed.set_defaults(handler=_list)

    data = commands.add_parser("data", help="the datasets: generate or fetch them")
    data_commands = data.add_subparsers(dest="data_command", required=True)
    generate = data_commands.add_parser(
        "generate", help="generate the embedded datasets, fetch and render emoji (under data/)"
    )
    generate.add_argument(
        "datasets",
        nargs="*",
        default=[],
        help="datasets to generate or fetch (dmlstudy list datasets) [default: synbirds glyphs, or --plan's]",
    )
    generate.add_argument(
        "--plan", default="", help="also every dataset this plan's entries read, e.g. plans/default.yaml"
    )
    generate.add_argument("--data-root", default="", help="where datasets live [default: <project>/data]")
    generate.set_defaults(handler=_generate)
    fetch = data_commands.add_parser(
        "fetch",
        help="download a real benchmark (cub200), or say where to get it (cars196, sop, inshop) and where it goes",
        description="cub200: download CUB-200-2011 from its publisher (resumable), verify its MD5, unpack it into "
        "<data root>/cub200/ and read it back. cars196, sop, inshop: no stable URL with a checksum is published; "
        "prints where to get them, the expected layout and the folder. A dataset already in place is only read.",
    )
    fetch.add_argument("name", help="cub200, cars196, sop or inshop")
    fetch.add_argument("--data-root", default="", help="where datasets live [default: <project>/data]")
    fetch.add_argument(
        "--url", default="", help="download from this URL instead (a mirror; or DMLSTUDY_<NAME>_URL); same checksum"
    )
    fetch.add_argument("--keep-archive", action="store_true", help="keep the downloaded archive after unpacking")
    fetch.set_defaults(handler=_fetch)

    study = commands.add_parser("study", help="run plans of notebooks and gather their tables")
    study_commands = study.add_subparsers(dest="study_command", required=True)
    run = study_commands.add_parser("run", help="execute a plan (plans/*.yaml) with papermill; resumes")
    run.add_argument("plan", help="a plan file, e.g. plans/smoke.yaml (dmlstudy list plans)")
    run.add_argument("--runs-root", default=None, help="where run folders go [default: <project>/runs]")
    run.add_argument("--only", default="", help="regular expression: run only matching run names")
    run.add_argument(
        "--overwrite",
        action="store_true",
        help="execute every entry again and retrain its runs (replaces their records)",
    )
    run.add_argument(
        "--scheduler",
        default="",
        metavar="ADDRESS",
        help="Dask scheduler to train on (e.g. tcp://host:8786; sets DMLSTUDY_SCHEDULER); default: a local cluster of the plan's workers",
    )
    run.add_argument(
        "--publish-different-build",
        action="store_true",
        help="write a published study's results/, figures/ and published/ even when the emoji build differs from "
        "the published one (default: beside its runs, runs/<study>/…)",
    )
    run.set_defaults(handler=_study_run)
    publish = study_commands.add_parser(
        "publish",
        help="publish a plan's executed notebooks, cleaned, with HTML pages and an index (published/ for the "
        "default study); trains and executes nothing",
    )
    publish.add_argument("plan", help="a plan file whose entries have run, e.g. plans/default.yaml")
    publish.add_argument("--runs-root", default=None, help="where run folders are [default: <project>/runs]")
    publish.add_argument("--no-html", action="store_true", help="only the executed .ipynb copies, no HTML pages")
    publish.add_argument(
        "--publish-different-build",
        action="store_true",
        help="publish into the repository's folder even when the emoji build differs from the published one",
    )
    publish.set_defaults(handler=_study_publish)
    table = study_commands.add_parser("table", help="gather metrics.json of a study into mean ± std tables")
    table.add_argument("study", help="a study name: the folder runs/<study>/ (e.g. default, smoke)")
    table.add_argument(
        "--by",
        nargs="+",
        default=["dataset", "method"],
        help="config fields to group runs by [default: dataset method]",
    )
    table.add_argument(
        "--metrics",
        nargs="+",
        default=["R@1", "R@2", "R@4", "R@8", "RP", "MAP@R", "NMI"],
        help="metrics.json keys to tabulate [default: R@1 R@2 R@4 R@8 RP MAP@R NMI]",
    )
    table.add_argument("--runs-root", default=None, help="where run folders are [default: <project>/runs]")
    table.add_argument(
        "--out",
        default="",
        help="output stem [default: results/runs for the default study, runs/<study>/results/runs otherwise]",
    )
    table.set_defaults(handler=_study_table)
    robustness = study_commands.add_parser(
        "robustness",
        help="the headline claims under every perturbation run so far → results/robustness/ (docs/protocol.md)",
        description="Reads the per-seed tables of the default study and of each robustness study (robust_partitions, "
        "robust_budget, robust_224, robust_designers; those not run yet are reported as such), computes the "
        "relatives-out column from the default study's runs (once; kept in results/robustness/), and writes "
        "results/robustness/claims.{csv,md}, runs_per_seed.csv and figures/robustness/robustness_forest.png.",
    )
    robustness.add_argument("--runs-root", default=None, help="where run folders are [default: <project>/runs]")
    robustness.add_argument(
        "--recompute-relatives", action="store_true", help="compute the relatives-out column again from the runs"
    )
    robustness.set_defaults(handler=_study_robustness)
    robustness_power = study_commands.add_parser(
        "robustness-power",
        help="false rate and power of every robustness reading, simulated → results/robustness/power.{csv,md}",
        description="Simulates tables of the 9 declared robustness columns at each cell's observed paired sd (read "
        "from the committed results/robustness/runs_per_seed.csv; seeded) and writes how often each reading (the "
        'two labels, held in every column, across columns, Q) says held or varies (docs/protocol.md, "Second '
        'amendment to the robustness study").',
    )
    robustness_power.add_argument("--draws", type=int, default=20_000, help="simulated tables per claim and scenario")
    robustness_power.set_defaults(handler=_study_robustness_power)
    _add_pretrain_parser(commands, registered.pretrain_options)
    _add_tune_parser(commands)
    return parser


def _error_text(error: BaseException) -> str:
    """The message of an error as one would write it (a KeyError's message without its quotes)."""
    text = (
        error.args[0]
        if isinstance(error, KeyError) and len(error.args) == 1 and isinstance(error.args[0], str)
        else str(error)
    )
    return text or type(error).__name__


def _show_run_warnings() -> None:
    """Run warnings (:class:`dmlstudy.run.identity.RunWarning`) print as ``warning: <message>``; others as usual."""
    default = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        runs = sys.modules.get(
            "dmlstudy.run.identity"
        )  # loaded by whatever warns; not imported here (it imports torch)
        if runs is not None and issubclass(category, runs.RunWarning):
            print(f"warning: {message}", file=sys.stderr, flush=True)
        else:
            default(message, category, filename, lineno, file, line)

    warnings.showwarning = show


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("DMLSTUDY_DEBUG", "") not in ("", "0")
    args = build_parser().parse_args([a for a in argv if a != "--debug"])
    _show_run_warnings()
    try:
        return args.handler(args)
    except KeyboardInterrupt:  # before a command installed its own handler (a run's or a plan's): nothing started
        if debug:
            raise
        print("stopped by Ctrl-C before the command started its work; nothing changed", file=sys.stderr)
        return 130
    except Exception as error:  # SystemExit (also a run stopped by a signal) and KeyboardInterrupt pass through
        if debug:
            raise
        print(f"error: {_error_text(error)}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
