"""dmlstudy: a reproducible, notebook-driven study of deep metric learning.

Packages: ``data`` (readers, embedded sets, transforms, sampler), ``models`` (timm backbones), ``methods``
(one file per method), and modules ``losses``, ``metrics``, ``train``, ``plots``, ``study``.
"""

from dmlstudy import numerics

numerics.configure()  # before torch, numpy or faiss choose their kernels (dmlstudy.numerics)

__version__ = "0.1.0"
