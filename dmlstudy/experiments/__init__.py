"""Study notebooks' logic: one module per notebook, each with the typed config its ``parameters`` cell mirrors and
the functions (sweeps, tables) the notebook calls; notebooks stay thin (:func:`~dmlstudy.experiments.notebooks.
notebook_configs` pairs each notebook with its config). A paper's tables are a declaration read by one path
(:mod:`~dmlstudy.experiments.ablations`, its grammar :mod:`~dmlstudy.experiments.declaration_schema`), its own
figures and measurements a module of :mod:`~dmlstudy.experiments.papers`. The comparison
(:mod:`~dmlstudy.experiments.compare`) keeps its parts in modules of their own: ``rerank`` (DIML re-ranking of the
baseline runs), ``tables`` (retrieval, geometry and cost tables) and ``regime_comparison``. What every notebook
shares is in :mod:`~dmlstudy.experiments.kit`; the notebooks' sources and their build in
:mod:`~dmlstudy.experiments.notebooks`; re-drawing a study's figures from its records in
:mod:`~dmlstudy.experiments.redraw`.
"""
