"""What the papers claim and what the study finds of it: the papers' numbers (:mod:`dmlstudy.findings.numbers`,
``papers.yaml``), their claims judged by the study's one rule (:mod:`dmlstudy.findings.claims`, ``claims.yaml``),
the error each published verdict carries under the declared chain of readings (:mod:`dmlstudy.findings.chain`),
the robustness study's table and labels (:mod:`dmlstudy.findings.robustness`), its readings over the independent
columns (:mod:`dmlstudy.findings.across_columns`) and every reading's false rate and power
(:mod:`dmlstudy.findings.power`). Below the papers' studies
(:mod:`dmlstudy.experiments`), above the plans that run them (:mod:`dmlstudy.study`)."""
