"""Study notebooks' logic: one module per notebook, each with the typed config its ``parameters`` cell
mirrors and the functions (sweeps, tables) the notebook calls. Notebooks stay thin. The comparison
(:mod:`~dmlstudy.experiments.compare`) keeps its parts in modules of their own: ``rows``, ``rerank``, ``tables``,
``claims``, ``regime_comparison`` and ``figure_index``. What every notebook shares is in
:mod:`~dmlstudy.experiments.kit`; the papers' numbers are in ``papers.yaml``
(:mod:`~dmlstudy.findings.numbers`); the notebooks' sources and their build in
:mod:`~dmlstudy.experiments.notebooks`.

``NOTEBOOK_CONFIGS`` maps each notebook to the dataclass its ``parameters`` cell mirrors one to one
(checked by ``tests/test_notebooks.py``).
"""

NOTEBOOK_CONFIGS = {
    "00_datasets.ipynb": "dmlstudy.experiments.datasets:DatasetTour",
    "01_train.ipynb": "dmlstudy.experiments.one_run:OneRun",
    "10_crt.ipynb": "dmlstudy.experiments.papers.crt:CRTStudy",
    "20_diml.ipynb": "dmlstudy.experiments.papers.diml:DIMLStudy",
    "30_cross_attention.ipynb": "dmlstudy.experiments.papers.cross_attention:CrossAttentionStudy",
    "40_dgcrl.ipynb": "dmlstudy.experiments.papers.dgcrl:DGCRLStudy",
    "90_compare.ipynb": "dmlstudy.experiments.compare:CompareStudy",
    "95_explore.ipynb": "dmlstudy.experiments.explore:ExploreConfig",
}
