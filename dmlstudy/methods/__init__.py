"""Methods: one file each, all registered by name (``build_method``).

Every module of this package is imported when the package is (:func:`discover`), so adding a method is one new
file with an ``@register_method(...)`` class. Methods outside the package (plugins, tests) are modules named in
the environment variable ``DMLSTUDY_METHOD_MODULES`` (comma-separated, importable): an environment variable
rather than a call, so that the processes a parallel study grid spawns register them too.
"""

from __future__ import annotations

import importlib
import os
import pkgutil

from dmlstudy.methods.base import (
    EVAL_BATCH_SIZE,
    GROUPS,
    METHOD_INFO,
    METHODS,
    VARIANT_SEARCH_SPACES,
    Explanation,
    HeatMaps,
    Method,
    MethodInfo,
    TransportPlans,
    build_method,
    global_pool,
    list_methods,
    method_info,
    register_method,
    register_variant_search_space,
    search_space,
)

PLUGIN_VARIABLE = "DMLSTUDY_METHOD_MODULES"


def discover() -> list[str]:
    """Import every module of this package and every module named in ``DMLSTUDY_METHOD_MODULES``; returns the
    module names imported (importing twice is a no-op)."""
    names = [f"{__name__}.{module.name}" for module in pkgutil.iter_modules(__path__) if module.name != "base"]
    names += [name.strip() for name in os.environ.get(PLUGIN_VARIABLE, "").split(",") if name.strip()]
    for name in names:
        importlib.import_module(name)
    return names


discover()

__all__ = [
    "Explanation",
    "HeatMaps",
    "TransportPlans",
    "EVAL_BATCH_SIZE",
    "GROUPS",
    "METHODS",
    "METHOD_INFO",
    "VARIANT_SEARCH_SPACES",
    "Method",
    "MethodInfo",
    "build_method",
    "discover",
    "global_pool",
    "list_methods",
    "method_info",
    "register_method",
    "register_variant_search_space",
    "search_space",
]
