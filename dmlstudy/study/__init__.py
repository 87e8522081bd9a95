"""A study of runs: plans of notebooks (:mod:`dmlstudy.study.plan`), grids of runs on the engine
(:mod:`dmlstudy.study.engine`), tuning (:mod:`dmlstudy.study.tuning`), mean ± std tables
(:mod:`dmlstudy.study.report`) and the statistics of claims (:mod:`dmlstudy.verdicts`)."""
