"""The four papers, each a declaration (``<paper>.yaml``: its variants, tables and claims, read by
:mod:`dmlstudy.experiments.ablations`) and a module of what is truly its own (``<paper>.py``: its figures and
measurements); their numbers are ``papers.yaml`` (:mod:`dmlstudy.findings.numbers`)."""
