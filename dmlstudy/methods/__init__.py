"""Methods: one file each, all registered by name (``build_method``)."""
from dmlstudy.methods.base import METHODS, Method, build_method, global_pool, list_methods, register_method
from dmlstudy.methods import baseline, crt, diml, cross_attention, dgcrl  # noqa: F401,E401  (register methods)

__all__ = ["METHODS", "Method", "build_method", "global_pool", "list_methods", "register_method"]
