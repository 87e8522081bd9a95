"""What the papers claim and what the study finds of it: the papers' numbers (:mod:`dmlstudy.findings.numbers`,
``papers.yaml``), their claims judged by the study's one rule (:mod:`dmlstudy.findings.claims`, ``claims.yaml``),
the error each published verdict carries under the declared chain of readings (:mod:`dmlstudy.findings.chain`)
and the robustness study's table and labels (:mod:`dmlstudy.findings.robustness`). Below the papers' studies
(:mod:`dmlstudy.experiments`), above the plans that run them (:mod:`dmlstudy.study`)."""
