"""The four papers, each a declaration (``<paper>.yaml``: its variants and tables, read by
:mod:`dmlstudy.experiments.ablations`, its keys in ``docs/declarations.md``) and a module of what is truly its own
(``<paper>.py``: its notebook config, figures and measurements); their numbers are ``papers.yaml``
(:mod:`dmlstudy.findings.numbers`) and their claims ``claims.yaml`` (:mod:`dmlstudy.findings.claims`)."""
