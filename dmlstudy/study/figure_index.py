"""``figures/README.md``: every figure of the study, grouped by the notebook that made it (from its file-name
prefix), with the plan entry and executed notebook it came from, a one-line caption (:data:`FIGURE_CAPTIONS`)
and the credit of the dataset images it shows (:data:`DATASET_IMAGE_FIGURES`), or "no dataset images"."""

from __future__ import annotations

from pathlib import Path

from dmlstudy.config import load_yaml
from dmlstudy.data.base import IMAGE_CREDITS, adaptation_licence
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
    "tuning_best_so_far_imagenet.png": "`make tune PLAN=plans/tune_imagenet.yaml` (`dmlstudy tune plans/tune_imagenet.yaml`)",
    "tuning_best_so_far_pretrained.png": "`make tune` (`dmlstudy tune plans/tune_pretrained.yaml`)",
    "tuning_best_so_far_partitions.png": "`make robustness-partitions` (`dmlstudy tune plans/tune_partitions.yaml`)",
    "robustness_forest.png": "`dmlstudy study robustness` (`make robustness`)",
}


FIGURE_CAPTIONS = {  # figure name, or a prefix ending in "_" followed by the dataset → what it shows, what to read
    "crt_transform.png": "CRT's forward pass drawn at the sizes of the study's runs (the protocol's backbone as they "
    "train it): codes, prototypes, the two branches and the three losses.",
    "crt_spectrum_": "Normalised singular-value spectra of the CRT variants' test embeddings (first seed), ρ in the "
    "legend; a curve that stays high longer uses more dimensions.",
    "crt_heatmaps.png": "Code heat maps of the most spatially selective CRT prototypes over test images; read which "
    "prototypes fire on the object and which on the background.",
    "crt_prototype_correlation.png": "Absolute cosine between CRT's prototypes, trained and before training, the "
    "diagonal masked and the colour scaled to the off-diagonal, with a histogram of both; L_DIV pushes the "
    "off-diagonal to 0.",
    "crt_tsne.png": "t-SNE of the test embeddings of CRT's two branches; similar cluster structure is what L_CON asks.",
    "diml_worked_example.png": "DIML's transport on a toy 3 × 3 example: at ε = 0.05 the plan finds the shifted "
    "diagonal, at ε = 0.5 it blurs; cross-correlation marginals move mass to matching cells.",
    "diml_truncation.png": "Re-ranking metrics against the number K of re-ranked neighbours.",
    "diml_grid_size.png": "Re-ranking metrics against the grid size G of the structural similarity.",
    "diml_transport_plans.png": "Queries and their top retrievals side by side with the transport plan as lines "
    "between grid cells and the marginals as heat maps; read which regions DIML matches.",
    "diml_cost.png": "Wall-clock cost of DIML's re-ranking against K and G (machine-dependent).",
    "cross_attention_hierarchy.png": "The cross-attention hierarchy drawn for one pair: each level queries with the "
    "other image's previous level.",
    "cross_attention_grid_": "R@1 of each similarity level sⁿ (columns) for models trained with n blocks (rows) on "
    "a test subset; compare within the grid.",
    "cross_attention_maps.png": "Attention over an image conditioned on a same-class and an other-class image, and "
    "their difference, per block; read how the map changes with the conditioning image.",
    "cross_attention_parts.png": "For a query cell (orange), the most similar cells of other test images, framed blue "
    "(same class) or vermillion; more blue than chance means local features describe parts.",
    "dgcrl_toy_decorrelation.png": "DGCRL's decorrelation on three 3-D centres: the paper's push makes them "
    "orthogonal, the authors' code regulariser more slowly; right: with the softmax loss.",
    "dgcrl_alpha_sweep.png": "DGCRL's R@K and training accuracy against α.",
    "dgcrl_loss_curves.png": "Validation R@1 per epoch of each loss the notebook's `losses` lists on DGCRL's head at "
    "equal settings, with DGCRL's own (first seed); a study that lists none shows DGCRL alone.",
    "dgcrl_tsne.png": "t-SNE of unseen test classes, one panel per variant the notebook's `tsne_variants` lists (the "
    "default: DGCRL alone); tight, separated clusters are what R@1 rewards.",
    "claims_forest.png": "Each headline claim's Δ with its interval against the grey ±margin band; the colour is the "
    "claim's outcome, a black ring a verdict that survives Holm's adjustment.",
    "compare_spectrum_": "Singular-value spectra of every method's test embeddings (first seed), ρ in the legend; a "
    "curve that stays high longer uses more dimensions.",
    "compare_tsne.png": "t-SNE of the first test classes' embeddings, one framed panel per method (first seed); "
    "the colours are the classes.",
    "compare_umap.png": "UMAP of the first test classes' embeddings, one framed panel per method (first seed); the "
    "colours are the classes.",
    "compare_recall_vs_time.png": "Each method's R@1 (mean ± std over seeds) against its training wall-clock time "
    "(mean, bar from the fastest to the slowest seed); up and left is better.",
    "robustness_forest.png": "Each headline claim (one panel) read in every declared column of the robustness "
    "study: the seven independent columns (blue: the default study, each class partition, the 30-epoch schedule "
    'stopped by patience, 30 epochs without early stopping, 224 px, unseen designers; "not run yet" where a '
    "column's study has not run) and the two cells that re-read their runs (grey: the pooled partitions, relatives "
    "out of the gallery); filled: decided, open: undecided. Below them the random-effects pooled Δ of the "
    "independent columns: a diamond over its Hartung–Knapp 95 % interval, the line through it the 95 % prediction "
    "interval of a further column (arrows where it runs past the panel; its bounds in the row's label). The title "
    "gives the across-columns reading, and says the claim varies with the compromise only where Cochran's Q "
    "rejects a common Δ at 5 %.",
    "tuning_best_so_far": "Best validation R@1 found so far against tuning trials, per method; a flat tail means the "
    "budget sufficed.",
}
DATASET_IMAGE_FIGURES = {  # figures that show images of the study's first dataset
    "crt_heatmaps.png",
    "diml_transport_plans.png",
    "cross_attention_maps.png",
    "cross_attention_parts.png",
}


def figure_caption(name: str) -> str:
    """The caption of figure ``name``: its own entry of :data:`FIGURE_CAPTIONS`, else the longest matching prefix."""
    if name in FIGURE_CAPTIONS:
        return FIGURE_CAPTIONS[name]
    matches = [key for key in FIGURE_CAPTIONS if not key.endswith(".png") and name.startswith(key)]
    return FIGURE_CAPTIONS[max(matches, key=len)] if matches else ""


def plan_datasets(study: str) -> list[str]:
    """The datasets of the protocol of ``plans/<study>.yaml`` (empty when no such plan)."""
    plan = project_root() / "plans" / f"{study}.yaml"
    if not plan.is_file():
        return []
    return list(((load_yaml(plan.read_text()) or {}).get("protocol") or {}).get("datasets") or [])


def figure_credit(name: str, datasets: list[str]) -> str:
    """The credit line of figure ``name`` in a study on ``datasets``: "no dataset images", or the dataset whose
    images it shows, the licence the figure carries when they include ShareAlike drawings, and where the full
    credit is."""
    if name not in DATASET_IMAGE_FIGURES:
        return "no dataset images"
    if not datasets:
        return "shows dataset images; their credit is in the PNG's metadata"
    dataset = datasets[0]
    if not IMAGE_CREDITS.get(dataset):
        return f"images of the generated `{dataset}` set (no third-party images)"
    licence = adaptation_licence(dataset)
    marked = f"; licensed {licence} as an adaptation of {licence} drawings" if licence else ""
    return f"shows `{dataset}` images{marked}; full credit under Image credit below, in the figure and in the PNG's metadata"


def figure_notebook(name: str) -> str | None:
    """The notebook that made figure ``name`` (by its longest matching prefix), or None."""
    matches = [prefix for prefix in FIGURE_PREFIXES if name.startswith(prefix)]
    return FIGURE_PREFIXES[max(matches, key=len)] if matches else None


def plan_note(study: str) -> str:
    """The ``note`` of ``plans/<study>.yaml`` ('' without one): what a reader of the study's figures must know
    first, such as the data build it ran on."""
    plan = project_root() / "plans" / f"{study}.yaml"
    return str((load_yaml(plan.read_text()) or {}).get("note") or "").strip() if plan.is_file() else ""


def published_copy(study: str, notebook: str, folder: Path) -> str:
    """A Markdown link from ``folder`` to the published copy of ``notebook`` (:mod:`dmlstudy.study.publish`)
    when it exists, else ''."""
    import os

    from dmlstudy.paths import study_outputs
    from dmlstudy.study.plan import load_plan
    from dmlstudy.study.publish import published_names

    plan = project_root() / "plans" / f"{study}.yaml"
    if not plan.is_file():
        return ""
    entries = [entry for entry in load_plan(plan) if entry.notebook.name == notebook]
    names = published_names(load_plan(plan))
    for entry in entries[:1]:
        copy = study_outputs(study, "published") / f"{names[entry.run_name]}.ipynb"
        if copy.is_file():
            link = Path(os.path.relpath(copy, folder)).as_posix()
            return f"[`{copy.relative_to(project_root()).as_posix()}`]({link})"
    return ""


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
    datasets = plan_datasets(study) if study else []
    names = sorted(path.name for path in folder.glob("*.png"))
    order = list(dict.fromkeys(FIGURE_PREFIXES.values()))
    by_notebook: dict[str | None, list[str]] = {}
    for name in names:
        by_notebook.setdefault(figure_notebook(name), []).append(name)
    note = plan_note(study) if study else ""
    lines = [
        "# Figures",
        "",
        *([note, ""] if note else []),
        "Written by the study's notebooks (`make study` regenerates them from the run records; do not edit by hand).",
        "Each figure names the notebook that made it, from its file-name prefix.",
        "",
    ]
    for notebook in [*order, None]:
        if notebook not in by_notebook:
            continue
        lines += [f"## {notebook or 'not made by a notebook'}", ""]
        if notebook in entries:
            copy = published_copy(study, notebook, folder)
            executed = (
                f"the executed notebook, with its outputs: {copy}"
                if copy
                else f"executed notebook `runs/{study}/{entries[notebook]}/{notebook}`"
            )
            lines += [
                f"Plan entry `{entries[notebook]}` of `plans/{study}.yaml`; {executed}; runs under `runs/{study}/`.",
                "",
            ]
        for name in by_notebook[notebook]:
            made_by = (
                f"made by `notebooks/{notebook}`"
                if notebook
                else f"made by {FIGURE_COMMANDS.get(name, 'an unknown command (no known file-name prefix)')}"
            )
            caption = figure_caption(name)
            lines += [
                f"**{name}** — {made_by}",
                "",
                *([caption] if caption else []),
                f"Credit: {figure_credit(name, datasets)}.",
                "",
                f"![]({name})",
                "",
            ]
    if not names:
        lines += ["(no figures yet)", ""]
    credited = [d for d in datasets[:1] if IMAGE_CREDITS.get(d) and DATASET_IMAGE_FIGURES & set(names)]
    for dataset in credited:
        lines += ["## Image credit", "", IMAGE_CREDITS[dataset], ""]
    return "\n".join(lines)


def write_figures_readme(folder: str | Path, *, study: str = "") -> Path:
    """Write ``<folder>/README.md`` listing every PNG with its notebook (and plan entry, given ``study``)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "README.md"
    path.write_text(figures_readme(folder, study=study))
    return path
