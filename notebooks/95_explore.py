# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Exploring by hand: what does each model retrieve, and why?
#
# **This notebook executed by the published study** (its first view, without the controls):
# [`published/95_explore.ipynb`](../published/95_explore.ipynb). Open it here to use the controls.
#
# Tables average over thousands of queries; this notebook shows single ones. Choose a **dataset**, a
# **method** and one of its **runs** (every finished run folder under `runs/<study>/`), then a **query**
# image of that run's test set. You see the query's top-K retrievals by cosine similarity of the stored
# test embeddings — framed **solid blue** when of the query's class, **dashed vermillion** otherwise — and, where the method
# has one, its explanation of those retrievals:
#
# * **DIML** — the optimal-transport plan between the query's and each retrieval's grid cells (lines,
#   thicker = more mass moved) and the two marginals: which parts were matched to which.
# * **cross-attention** — the last block's attention: where the query looks when conditioned on the
#   retrieval, and where the retrieval looks when conditioned on the query.
# * **CRT** — the codes of the most spatially selective prototypes on the query and its retrievals: which
#   "perspectives" fire where.
# * other methods — no explanation: their similarity is a plain cosine of pooled features.
#
# **Which runs.** By default (`study = ''`) it opens on the published study, `default` — the runs `make study`
# trained, the ones behind `figures/` and `results/` — as soon as they exist under `runs/default/`. Without
# them (a fresh clone) it opens on its own study `notebook-95_explore`, training one CI-sized DIML run there
# first (under a minute on 2 cores), so there is always something to look at, explanation included. It shows
# first a method with an explanation (DIML, cross-attention, then CRT), else MS. To look at another study (`smoke`, `full`, your own), set
# `study` below; the first cell prints which study is shown and which others have runs.
#
# Run it in JupyterLab to use the controls. Executed without a live kernel (CI, papermill) the controls are
# built and drawn once with the parameters below, and the same first view is drawn again as ordinary cell
# output.

# %% tags=["parameters"]
study: str = ''  # "": the published study ('default') when it has runs, else the explorer's own fallback run
runs_root: str = ''  # default: <project>/runs
data_root: str = ''  # default: <project>/data
dataset: str = ''  # dataset shown first ("": the first with runs)
method: str = ''  # method shown first ("": the first with an explanation, diml, cross_attention, crt, else ms)
run: str = ''  # run folder shown first ("": the lowest seed of that dataset and method)
query: int = 0  # query image shown first (index into the run's test set)
top_k: int = 5  # retrievals shown
explain: bool = True  # draw the method's explanation where it has one (diml, cross_attention, crt)
save_figures: bool = False  # also save the first view as <study's figures>/explore_*.png

# %%
from dmlstudy.experiments import explore
from dmlstudy.records import seed_everything

config = explore.ExploreConfig.from_namespace(globals())
seed_everything(0)
shown_study, runs = explore.ensure_runs(config)
print(explore.study_header(config, runs))
explore.runs_table(runs)

# %% [markdown]
# ## The explorer
#
# Changing the dataset lists its methods; changing the method lists its runs (folder name and test R@1).
# The query slider indexes the run's test set; the top-K slider sets the number of retrievals shown (the
# explanation covers the first three).

# %%
from IPython.display import display

explorer = explore.Explorer(runs, data_root=config.data_root)
selection = explorer.selection(config)
ui = explore.ExplorerUI(explorer, selection)
display(ui.box)
ui.update()  # draw the first view now, so it exists without anyone touching the controls

# %% [markdown]
# ## The first view, as plain output
#
# The same drawing for the parameters above, as ordinary cell output (it stays in the executed notebook,
# where widget outputs need a live kernel). Things to try: a query whose first retrieval is vermillion — is the
# other class a near neighbour in the dataset's class definitions? Does the DIML plan match the same parts
# in a correct retrieval and different parts in a wrong one? Does cross-attention look at the same region
# of the query for every retrieval, or does the region move with the conditioning image?

# %%
items = explorer.render(
    selection["run_dir"], query=selection["query"], top_k=selection["top_k"], explain=selection["explain"]
)
if config.save_figures:
    print("saved:", *explore.save_items(study=shown_study, items=items))
explore.show_items(items)
