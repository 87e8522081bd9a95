"""One run: a :class:`~dmlstudy.run.train.TrainConfig` resolved from the settings (:mod:`dmlstudy.run.settings`,
:mod:`dmlstudy.run.protocol`), trained and evaluated (:mod:`dmlstudy.run.train`) into one folder
``runs/<study>/<run>-<hash8>/`` whose name is its identity (:mod:`dmlstudy.run.identity`)."""
