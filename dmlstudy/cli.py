"""The ``dmlstudy`` command: ``train``, ``data generate``, ``study run`` and ``study table``.

``dmlstudy train --method ms --dataset synbirds --epochs 8`` runs :func:`dmlstudy.train.run`; every field of
:class:`dmlstudy.train.TrainConfig` is an option (``--method-kwargs '{"K1": 16}'`` for dicts and lists,
``--resume/--no-resume`` for booleans).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from pathlib import Path

import yaml


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    from dmlstudy.train import TrainConfig

    hints = typing.get_type_hints(TrainConfig)
    for spec in dataclasses.fields(TrainConfig):
        option = "--" + spec.name.replace("_", "-")
        kind = hints[spec.name]
        if kind is bool:
            parser.add_argument(option, dest=spec.name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS)
        elif kind in (dict, list):
            parser.add_argument(option, dest=spec.name, type=yaml.safe_load, default=argparse.SUPPRESS, metavar="YAML")
        else:
            parser.add_argument(option, dest=spec.name, type=kind, default=argparse.SUPPRESS)


def _train(args: argparse.Namespace) -> int:
    from dmlstudy.distributed import is_main_process
    from dmlstudy.train import TrainConfig, run

    values = {}
    if args.config:
        loaded = yaml.safe_load(Path(args.config).read_text()) or {}
        parameters = loaded.get("parameters", loaded)
        unknown = sorted(set(parameters) - set(TrainConfig.field_names()))
        if unknown:
            raise SystemExit(f"{args.config}: unknown TrainConfig fields {unknown}; valid: {TrainConfig.field_names()}")
        values.update(parameters)
    values.update({k: v for k, v in vars(args).items() if k in TrainConfig.field_names()})
    result = run(TrainConfig(**values))
    if not is_main_process():
        return 0
    shown = {k: round(v, 4) for k, v in result.metrics.items() if isinstance(v, float)}
    print(f"run folder: {result.run_dir}\nmetrics: {shown}")
    return 0


def _generate(args: argparse.Namespace) -> int:
    from dmlstudy.data import build_dataset
    from dmlstudy.paths import data_root

    root = Path(args.data_root) if args.data_root else data_root()
    for name in args.datasets:
        train, test = build_dataset(name, root / name, "train"), build_dataset(name, root / name, "test")
        print(f"{name}: {len(train)} train images / {train.num_classes} classes, {len(test)} test images / {test.num_classes} classes in {root / name}")
    return 0


def _study_run(args: argparse.Namespace) -> int:
    from dmlstudy.study import run_plan

    outcomes = run_plan(args.plan, root=args.runs_root, only=args.only)
    return 1 if any(o.status == "failed" for o in outcomes) else 0


def _study_table(args: argparse.Namespace) -> int:
    from dmlstudy.paths import study_outputs
    from dmlstudy.study import gather_runs, summarize, write_table

    frame = gather_runs(args.study, root=args.runs_root)
    if frame.empty:
        print(f"no finished runs under study {args.study!r}", file=sys.stderr)
        return 1
    table = summarize(frame, by=args.by, metrics=args.metrics)
    out = Path(args.out) if args.out else study_outputs(args.study, "results", runs_root_override=args.runs_root or "") / "runs"
    csv_path, md_path = write_table(table, out)
    print(table[[c for c in table.columns if not c.endswith(("_mean", "_std"))]].to_markdown(index=False))
    print(f"\nwritten: {csv_path}, {md_path}")
    return 0


def _pretrain(args: argparse.Namespace) -> int:
    from dmlstudy.pretrain import PretrainConfig, pretrain, verify

    if args.verify:
        return 0 if verify(args.verify) else 1
    pretrain(PretrainConfig(**{k: v for k, v in vars(args).items() if k in PretrainConfig.field_types()}))
    return 0


def _add_pretrain_parser(commands: argparse._SubParsersAction) -> None:
    from dmlstudy.pretrain import PretrainConfig

    parser = commands.add_parser("pretrain", help="pretrain a backbone on the fractals source set; writes weights/ + a model card")
    for name, kind in PretrainConfig.field_types().items():
        parser.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, default=argparse.SUPPRESS)
    parser.add_argument("--verify", default="", metavar="CARD", help="rebuild what a model card describes; compare hash (or accuracy)")
    parser.set_defaults(handler=_pretrain)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dmlstudy", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train and evaluate one method on one dataset")
    train.add_argument("--config", default="", help="YAML file of TrainConfig fields (its 'parameters' mapping, or the top level); options given here override it")
    _add_config_options(train)
    train.set_defaults(handler=_train)

    data = commands.add_parser("data", help="embedded datasets")
    data_commands = data.add_subparsers(dest="data_command", required=True)
    generate = data_commands.add_parser("generate", help="generate the embedded datasets (cached under data/)")
    generate.add_argument("datasets", nargs="*", default=["synbirds", "glyphs"])
    generate.add_argument("--data-root", default="")
    generate.set_defaults(handler=_generate)

    study = commands.add_parser("study", help="run plans of notebooks and gather their tables")
    study_commands = study.add_subparsers(dest="study_command", required=True)
    run = study_commands.add_parser("run", help="execute a plan (plans/*.yaml) with papermill; resumes")
    run.add_argument("plan")
    run.add_argument("--runs-root", default=None)
    run.add_argument("--only", default="", help="regular expression: run only matching run names")
    run.set_defaults(handler=_study_run)
    table = study_commands.add_parser("table", help="gather metrics.json of a study into mean ± std tables")
    table.add_argument("study")
    table.add_argument("--by", nargs="+", default=["dataset", "method"])
    table.add_argument("--metrics", nargs="+", default=["R@1", "R@2", "R@4", "R@8", "RP", "MAP@R", "NMI"])
    table.add_argument("--runs-root", default=None)
    table.add_argument("--out", default="", help="output stem (default results/<study>/runs)")
    table.set_defaults(handler=_study_table)
    _add_pretrain_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
