"""A study of runs: plans of notebooks (:mod:`dmlstudy.study.plan`, what they read first
:mod:`dmlstudy.study.plan_inputs`) executed with progress and published (:mod:`dmlstudy.study.executor`,
:mod:`dmlstudy.study.progress`, :mod:`dmlstudy.study.publish`), grids of runs on the engine
(:mod:`dmlstudy.study.grids`, :mod:`dmlstudy.study.engine`), tuning (:mod:`dmlstudy.study.tuning`), seeds added
look by look (:mod:`dmlstudy.study.sequential`), mean ± std tables (:mod:`dmlstudy.study.report`) and the index of
a study's figures (:mod:`dmlstudy.study.figure_index`). The verdict rule these read is :mod:`dmlstudy.verdicts`,
a root module below them."""
