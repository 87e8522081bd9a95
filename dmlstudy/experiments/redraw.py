"""Figures a published study can redraw without its runs: from its committed tables, or from nothing but code.

    python -m dmlstudy.experiments.redraw default embedded sequential   # rewrites what each study's folder holds

* ``compare_recall_vs_time.png``: R@1 against training seconds, from ``compare_cost.csv`` (training seconds, mean ±
  std and, in tables that record it, their range over seeds) and ``compare_main_<dataset><suffix>.csv`` (R@1 mean
  and std) of the regime of the plan's comparison entry
  (:func:`dmlstudy.experiments.tables.time_summary_of_tables`): the same numbers the notebook drew (from a table
  without the range, without a spread of training time);
* ``dgcrl_toy_decorrelation.png``: the decorrelation toy, a seeded computation on three 3-D centres with the plan's
  ``toy_steps``.

Only a figure the study's figures folder already holds is redrawn (a study that never drew one does not get one);
every other figure needs the runs (``make study PLAN=plans/<study>.yaml`` draws them again from the runs it
finds). Decision: the plan file named like the study (``plans/<study>.yaml``) says which regime and toy size were
drawn; a study without such a plan is refused.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

import matplotlib

from dmlstudy.paths import project_root, study_outputs


def _entry_values(plan: Path, notebook: str) -> dict | None:
    """The parameters of the plan's first entry that runs ``notebooks/<notebook>.ipynb``, over the notebook's
    defaults; None when no entry runs it."""
    from dmlstudy.study.plan import load_plan, notebook_parameters

    for entry in load_plan(plan):
        if entry.notebook.stem == notebook:
            defaults = {}
            for name, spec in notebook_parameters(entry.notebook).items():
                try:
                    defaults[name] = ast.literal_eval(spec["default"])
                except (ValueError, SyntaxError):
                    continue
            return {**defaults, **entry.parameters}
    return None


def redraw(study: str) -> list[Path]:
    """Redraw the figures of ``study`` that need no runs (see the module docstring); returns the files written."""
    import matplotlib.pyplot as plt

    from dmlstudy import plots
    from dmlstudy.experiments.papers.dgcrl import toy_figure
    from dmlstudy.experiments.tables import draw_time_figure, time_summary_of_tables
    from dmlstudy.run.protocol import ProtocolConfig
    from dmlstudy.study.plan import PROTOCOL_PARAMETER

    plan = project_root() / "plans" / f"{study}.yaml"
    if not plan.is_file():
        raise FileNotFoundError(f"redraw: no plan {plan} says how study {study!r} drew its figures")
    figures, results = study_outputs(study, "figures"), study_outputs(study, "results")
    written = []
    compare = _entry_values(plan, "90_compare")
    if compare is not None and (figures / "compare_recall_vs_time.png").is_file():
        protocol = {k: v for k, v in (compare.get(PROTOCOL_PARAMETER) or {}).items() if k not in ("study", "runs_root")}
        summary = time_summary_of_tables(results, regime=ProtocolConfig(**protocol).regime)
        figure = draw_time_figure(summary)
        written.append(plots.save_figure(figure, "compare_recall_vs_time", study=study))
        plt.close(figure)
    dgcrl = _entry_values(plan, "40_dgcrl")
    if dgcrl is not None and (figures / "dgcrl_toy_decorrelation.png").is_file():
        figure = toy_figure(steps=int(dgcrl["toy_steps"]))
        written.append(plots.save_figure(figure, "dgcrl_toy_decorrelation", study=study))
        plt.close(figure)
    return written


def main(argv: list[str] | None = None) -> int:
    matplotlib.use("Agg")
    parser = argparse.ArgumentParser(prog="python -m dmlstudy.experiments.redraw", description=__doc__.split("\n\n")[0])
    parser.add_argument("studies", nargs="+", help="published studies (plans/<study>.yaml names each one's plan)")
    args = parser.parse_args(argv)
    for study in args.studies:
        for path in redraw(study):
            print("wrote", path.relative_to(project_root()) if path.is_relative_to(project_root()) else path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
