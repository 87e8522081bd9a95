"""dmlstudy: a reproducible, notebook-driven study of deep metric learning.

Packages: ``data`` (readers, embedded sets, transforms, sampler), ``models`` (timm backbones), ``methods``
(one file per method), and modules ``losses``, ``metrics``, ``train``, ``plots``, ``study``.
"""

__version__ = "0.1.0"
