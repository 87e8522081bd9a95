"""Structural similarity (DIML: Zhao et al., Towards Interpretable Deep Metric Learning with Structural
Matching): entropic optimal transport between G × G grids of local embeddings (:mod:`dmlstudy.structural.transport`,
Sinkhorn) and the test-time re-ranking of a cosine top-K by cos + s_struct (:mod:`dmlstudy.structural.reranking`)."""
