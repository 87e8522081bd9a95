"""Writes notebooks/95_explore.ipynb (run: PYTHONPATH=tools .venv/bin/python tools/make_95_explore.py)."""
from nbtools import build_notebook, parameter_lines

from dmlstudy.experiments.explore import ExploreConfig

build_notebook([
    ("md", """
    # Exploring by hand: what does each model retrieve, and why?

    Tables average over thousands of queries; this notebook shows single ones. Choose a **dataset**, a
    **method** and one of its **runs** (every finished run folder under `runs/<study>/`), then a **query**
    image of that run's test set. You see the query's top-K retrievals by cosine similarity of the stored
    test embeddings — framed **green** when of the query's class, **red** otherwise — and, where the method
    has one, its explanation of those retrievals:

    * **DIML** — the optimal-transport plan between the query's and each retrieval's grid cells (lines,
      thicker = more mass moved) and the two marginals: which parts were matched to which.
    * **cross-attention** — the last block's attention: where the query looks when conditioned on the
      retrieval, and where the retrieval looks when conditioned on the query.
    * **CRT** — the codes of the most spatially selective prototypes on the query and its retrievals: which
      "perspectives" fire where.
    * other methods — no explanation: their similarity is a plain cosine of pooled features.

    Run it in JupyterLab to use the controls. Executed without a live kernel (CI, papermill) the controls are
    built and drawn once with the parameters below, and the same first view is drawn again as ordinary cell
    output. When the study has no runs yet (a fresh clone), one CI-sized run of `fallback_method` is trained
    first, so there is always something to look at.
    """),
    ("parameters", parameter_lines(ExploreConfig)),
    ("code", """
    from dmlstudy.experiments import explore
    from dmlstudy.records import seed_everything

    config = explore.ExploreConfig.from_namespace(globals())
    seed_everything(0)
    runs = explore.ensure_runs(config)
    print(f"{len(runs)} complete runs in study {config.study!r}:")
    print(runs[["dataset", "method", "run", "seed", "R@1"]].to_string(index=False))
    """),
    ("md", """
    ## The explorer

    Changing the dataset lists its methods; changing the method lists its runs (folder name and test R@1).
    The query slider indexes the run's test set; top K is the number of retrievals shown (the explanation
    covers the first three).
    """),
    ("code", """
    from IPython.display import display

    explorer = explore.Explorer(runs, data_root=config.data_root)
    selection = explorer.selection(config)
    ui = explore.ExplorerUI(explorer, selection)
    display(ui.box)
    ui.update()  # draw the first view now, so it exists without anyone touching the controls
    """),
    ("md", """
    ## The first view, as plain output

    The same drawing for the parameters above, as ordinary cell output (it stays in the executed notebook,
    where widget outputs need a live kernel). Things to try: a query whose first retrieval is red — is the
    other class a near neighbour in the dataset's class definitions? Does the DIML plan match the same parts
    in a correct retrieval and different parts in a wrong one? Does cross-attention look at the same region
    of the query for every retrieval, or does the region move with the conditioning image?
    """),
    ("code", """
    items = explorer.render(selection["run_dir"], query=selection["query"], top_k=selection["top_k"], explain=selection["explain"])
    if config.save_figures:
        print("saved:", *explore.save_items(study=config.study, items=items))
    explore.show_items(items)
    """),
], "notebooks/95_explore.ipynb")
