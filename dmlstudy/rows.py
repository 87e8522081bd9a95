"""The rows of the comparison: what each row is (label, group, paper, summary) and the runs that make it.

Most rows are registered methods (their :class:`~dmlstudy.methods.MethodInfo` comes from the registry); the
others are :data:`EXTRA_ROWS`: ``diml_rerank`` (the ``ms`` runs re-ranked by DIML at test time) and the shared
variants (:data:`SHARED_VARIANTS`: runs one notebook trains under a name and another shows, such as ``softmax``).
Every row has its own colour, the same in every figure (:data:`ROW_COLOURS`, read by
:func:`dmlstudy.plots.method_style`); the marker says its group. Only the method registry is imported here, so the
figure style, tuning and the study notebooks read the rows from below all of them.

Decision (the colours): no two rows share a colour. The ten rows the default study draws together (its comparison's
rows and classic baselines) come first, picked from Okabe and Ito's and Paul Tol's colour-blind-safe sets so that
every pair stays apart (CIEDE2000 ΔE ≥ 10) in normal vision and under simulated deuteranopia, protanopia and
tritanopia, and against the white page; the other rows, which only the full study draws, take further colours from
those sets, distinct in normal vision. A row added to the study gets its colour here (``tests/test_figures.py``
fails for a row without one, or for two rows whose colours a reader could confuse).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dmlstudy.methods import MethodInfo, list_methods, method_info

BASELINE = "ms"  # the baseline every paper builds on: the first main row, and the runs DIML re-ranks at test time
RERANK = "diml_rerank"  # the pseudo-method: the :data:`BASELINE` runs re-ranked by DIML at test time
CI_ROWS = (BASELINE, "crt", RERANK)  # the comparison's main rows at CI size (its notebook's defaults)
CI_CLASSIC_ROWS = ("triplet",)  # the comparison's classic baselines at CI size
SHARED_VARIANTS: dict[str, dict] = {  # named runs one notebook trains and another shows (same name, same spec)
    "softmax": {"method": "dgcrl", "method_kwargs": {"normalize_scale": False, "margin": 0.0, "decorrelation": "none"}},
}
SHARED_ROWS = {  # how the comparison shows them
    "softmax": MethodInfo(
        "softmax",
        "softmax (DGCRL head, no N-S)",
        "paper",
        "DGCRL's own baseline",
        "DGCRL's head as a plain softmax classifier: no normalize-scale, no margin, no decorrelation (the run of notebook 40)",
    ),
}
ROW_COLOURS: dict[str, str] = {  # row → its colour in every figure (module docstring: how they were chosen)
    # the default study's rows, drawn together
    "ms": "#0072b2",  # blue
    "crt": "#cc3311",  # red
    "dgcrl": "#000000",  # black
    "diml_rerank": "#33bbee",  # sky blue
    "cross_attention": "#ccbb44",  # olive yellow
    "softmax": "#777777",  # grey
    "diml": "#332288",  # indigo
    "triplet": "#663333",  # brown
    "normsoftmax": "#bbbbbb",  # light grey
    "lifted": "#cc79a7",  # pink
    # the rows only the full study draws
    "gcrl": "#999933",  # olive
    "arcface": "#009e73",  # bluish green
    "contrastive": "#e69f00",  # orange
    "cosface": "#aa3377",  # purple
    "margin": "#99ddff",  # pale blue
    "npairs": "#228833",  # green
    "proxyanchor": "#882255",  # wine
    "proxynca": "#ee6677",  # rose
    "softtriple": "#44aa99",  # teal
}
EXTRA_ROWS = {  # rows of the comparison that are not registered methods (the others come from the method registry)
    RERANK: MethodInfo(
        RERANK,
        "MS + DIML re-ranking",
        "paper",
        "Zhao et al., ICCV 2021 (test-time use)",
        "the same ms models; each query's cosine top-K re-ranked by cos + s_struct (optimal transport between G × G local embeddings)",
        reranks=BASELINE,
    ),
    "softmax": SHARED_ROWS["softmax"],
}


def row_info(name: str) -> MethodInfo:
    """What a row of the comparison is: :data:`EXTRA_ROWS`, else the registry's :func:`method_info`."""
    if name in EXTRA_ROWS:
        return EXTRA_ROWS[name]
    try:
        return method_info(name)
    except KeyError:
        return MethodInfo(name, name, "classic")


def trained_row(name: str) -> str:
    """The row whose trained runs make row ``name``: the row it re-ranks (:attr:`MethodInfo.reranks`), else itself."""
    return row_info(name).reranks or name


def is_reranked(name: str) -> bool:
    """Whether row ``name`` re-ranks another row's runs at test time (and so has no embeddings of its own)."""
    return bool(row_info(name).reranks)


def method_label(name: str) -> str:
    """The row label of a method in every table and figure (the registry's ``label``)."""
    return row_info(name).label


def main_rows() -> list[str]:
    """Every main row the study can show: ``ms``, the registered paper methods, and :data:`EXTRA_ROWS`."""
    return [BASELINE, *list_methods(group="paper"), *EXTRA_ROWS]


def classic_rows() -> list[str]:
    """Every classic baseline the registry has (group ``classic``), ``ms`` aside (a main row)."""
    return [name for name in list_methods(group="classic") if name != BASELINE]


def method_grid(methods: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``{name: {"method": name}}``: every method with its defaults, named as the method notebooks name it;
    the names of :data:`SHARED_VARIANTS` get the spec their notebook gives them (``softmax``: 40_dgcrl's
    DGCRL head without normalize-scale, margin or decorrelation)."""
    return {name: dict(SHARED_VARIANTS.get(name, {"method": name})) for name in methods}


def rows_markdown(names: Iterable[str]) -> str:
    """A notebook's table of the rows ``names``, in order: label (name), what it is, paper; from the registry."""
    lines = ["| row | what it is | paper |", "|---|---|---|"]
    for name in names:
        info = row_info(name)
        lines.append(f"| {info.label} (`{name}`) | {info.summary} | {info.paper} |")
    return "\n".join(lines)
