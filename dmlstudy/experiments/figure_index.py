"""``figures/README.md``: every figure of the study, grouped by the notebook that made it (from its file-name
prefix), with the plan entry and executed notebook it came from."""

from __future__ import annotations

from pathlib import Path

from dmlstudy.config import load_yaml
from dmlstudy.paths import project_root

FIGURE_PREFIXES = {  # file-name prefix → the notebook that writes figures with it (in notebook order)
    "datasets_": "00_datasets.ipynb",
    "train_": "01_train.ipynb",
    "crt_": "10_crt.ipynb",
    "diml_": "20_diml.ipynb",
    "cross_attention_": "30_cross_attention.ipynb",
    "dgcrl_": "40_dgcrl.ipynb",
    "compare_": "90_compare.ipynb",
    "claims_": "90_compare.ipynb",
    "explore_": "95_explore.ipynb",
}


FIGURE_COMMANDS = {  # figures that no notebook draws → the command that writes them
    "tuning_best_so_far.png": "`make tune` (`dmlstudy tune plans/tune.yaml`)",
    "tuning_best_so_far_pretrained.png": "`make tune` (`dmlstudy tune plans/tune_pretrained.yaml`)",
}


def figure_notebook(name: str) -> str | None:
    """The notebook that made figure ``name`` (by its longest matching prefix), or None."""
    matches = [prefix for prefix in FIGURE_PREFIXES if name.startswith(prefix)]
    return FIGURE_PREFIXES[max(matches, key=len)] if matches else None


def plan_entries(study: str) -> dict[str, str]:
    """Notebook file name → the entry of ``plans/<study>.yaml`` that runs it (empty when no such plan)."""
    plan = project_root() / "plans" / f"{study}.yaml"
    if not plan.is_file():
        return {}
    entries = (load_yaml(plan.read_text()) or {}).get("entries") or []
    return {Path(entry["notebook"]).name: entry["name"] for entry in entries if "notebook" in entry and "name" in entry}


def figures_readme(folder: str | Path, *, study: str = "") -> str:
    """The text of ``figures/README.md``: every PNG of ``folder``, grouped by the notebook that made it (in
    notebook order; unknown prefixes last), each with a line naming the notebook and the image embedded.
    With ``study``, each notebook's section also names its entry of ``plans/<study>.yaml`` and the executed
    notebook ``runs/<study>/<entry>/<notebook>``, whose cells list the runs each figure was drawn from."""
    folder = Path(folder)
    entries = plan_entries(study) if study else {}
    names = sorted(path.name for path in folder.glob("*.png"))
    order = list(dict.fromkeys(FIGURE_PREFIXES.values()))
    by_notebook: dict[str | None, list[str]] = {}
    for name in names:
        by_notebook.setdefault(figure_notebook(name), []).append(name)
    lines = [
        "# Figures",
        "",
        "Written by the study's notebooks (`make study` regenerates them from the run records; do not edit by hand).",
        "Each figure names the notebook that made it, from its file-name prefix.",
        "",
    ]
    for notebook in [*order, None]:
        if notebook not in by_notebook:
            continue
        lines += [f"## {notebook or 'not made by a notebook'}", ""]
        if notebook in entries:
            lines += [
                f"Plan entry `{entries[notebook]}` of `plans/{study}.yaml`; executed notebook "
                f"`runs/{study}/{entries[notebook]}/{notebook}`; runs under `runs/{study}/`.",
                "",
            ]
        for name in by_notebook[notebook]:
            made_by = (
                f"made by `notebooks/{notebook}`"
                if notebook
                else f"made by {FIGURE_COMMANDS.get(name, 'an unknown command (no known file-name prefix)')}"
            )
            lines += [f"**{name}** — {made_by}", "", f"![]({name})", ""]
    if not names:
        lines += ["(no figures yet)", ""]
    return "\n".join(lines)


def write_figures_readme(folder: str | Path, *, study: str = "") -> Path:
    """Write ``<folder>/README.md`` listing every PNG with its notebook (and plan entry, given ``study``)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "README.md"
    path.write_text(figures_readme(folder, study=study))
    return path
