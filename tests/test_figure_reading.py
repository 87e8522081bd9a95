"""Every figure function of the study, drawn on small data, checked for what a reader looks at first: a heat map or
an image shows all of itself (the axis view covers the image's extent, whichever way the axis runs), no two
colour bars lie on one another, no title runs into another axes, another title or a tick label, the tick labels
of one axis do not overprint each other, and the names written beside points do not overprint each other."""

from __future__ import annotations

import itertools
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from dmlstudy import explanations, plots  # noqa: E402
from dmlstudy.experiments import tables  # noqa: E402
from dmlstudy.experiments.papers import cross_attention, crt, dgcrl, diml  # noqa: E402
from dmlstudy.findings import robustness  # noqa: E402
from dmlstudy.findings.claims import CLAIMS, claims_table, forest_figure  # noqa: E402
from dmlstudy.methods import build_method  # noqa: E402
from dmlstudy.models import build_backbone  # noqa: E402
from dmlstudy.rows import RERANK  # noqa: E402
from dmlstudy.study.tuning import plot_best_so_far  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


TOLERANCE = 1e-6


def is_colourbar(axis) -> bool:
    return hasattr(axis, "_colorbar")


def text_box(text, renderer):
    """The box of the words of ``text`` (an annotation's own extent also holds its leader line); None if blank."""
    return Text.get_window_extent(text, renderer) if text.get_visible() and text.get_text().strip() else None


def reading_faults(figure: plt.Figure) -> list[str]:
    """What a reader would trip over in ``figure`` (empty when nothing)."""
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    faults = []
    axes = [axis for axis in figure.axes if axis.get_visible()]
    for axis in axes:  # every image is seen whole
        if is_colourbar(axis) or axis.name == "3d":
            continue
        x_low, x_high = sorted(axis.get_xlim())
        y_low, y_high = sorted(axis.get_ylim())
        for image in axis.images:
            left, right, bottom, top = image.get_extent()
            if (
                min(left, right) < x_low - TOLERANCE
                or max(left, right) > x_high + TOLERANCE
                or min(bottom, top) < y_low - TOLERANCE
                or max(bottom, top) > y_high + TOLERANCE
            ):
                faults.append(
                    f"axes {axis.get_title()!r} shows x {x_low:g}…{x_high:g}, y {y_low:g}…{y_high:g} of an image "
                    f"spanning x {left:g}…{right:g}, y {bottom:g}…{top:g}"
                )
    bars = [(axis, axis.get_tightbbox(renderer)) for axis in axes if is_colourbar(axis)]
    for (first, one), (second, other) in itertools.combinations(bars, 2):
        if one.overlaps(other):
            faults.append(
                f"colour bars {first.get_ylabel() or first.get_xlabel()!r} and "
                f"{second.get_ylabel() or second.get_xlabel()!r} overlap"
            )
    titles = [(axis, text_box(axis.title, renderer)) for axis in axes]
    titles = [(axis, box) for axis, box in titles if box is not None]
    if figure._suptitle is not None and (box := text_box(figure._suptitle, renderer)) is not None:
        titles.append((None, box))
    for (first, one), (second, other) in itertools.combinations(titles, 2):
        if one.overlaps(other):
            faults.append(
                f"titles {getattr(first, 'title', figure._suptitle).get_text()!r} and "
                f"{getattr(second, 'title', figure._suptitle).get_text()!r} overlap"
            )
    for owner, box in titles:
        for axis in axes:
            if axis is owner or axis.name == "3d":
                continue
            if box.overlaps(axis.get_window_extent(renderer)):
                name = owner.get_title() if owner is not None else figure._suptitle.get_text()
                faults.append(f"title {name!r} runs into axes {axis.get_title() or axis.get_ylabel()!r}")
            labels = [*axis.get_xticklabels(), *axis.get_yticklabels()]
            if any((tick := text_box(label, renderer)) is not None and box.overlaps(tick) for label in labels):
                name = owner.get_title() if owner is not None else figure._suptitle.get_text()
                faults.append(f"title {name!r} runs into the tick labels of axes {axis.get_title()!r}")
    for axis in axes:  # the tick labels of one axis stand apart
        groups = [axis.get_xticklabels(), axis.get_yticklabels()]
        if axis.name == "3d":
            groups.append(axis.get_zticklabels())
        for labels in groups:
            boxes = [(label.get_text(), text_box(label, renderer)) for label in labels]
            boxes = [(text, box) for text, box in boxes if box is not None]
            for (one, first), (two, second) in itertools.combinations(boxes, 2):
                if first.overlaps(second):
                    faults.append(f"tick labels {one!r} and {two!r} of axes {axis.get_title()!r} overprint")
        notes = [(text.get_text(), text_box(text, renderer)) for text in axis.texts]
        notes = [(text, box) for text, box in notes if box is not None]
        for (one, first), (two, second) in itertools.combinations(notes, 2):
            if first.overlaps(second):
                faults.append(f"labels {one!r} and {two!r} of axes {axis.get_title()!r} overprint")
    return faults


def crt_method(**kwargs):
    return build_method("crt", backbone=build_backbone("dml_convnet"), num_classes=4, **kwargs).eval()


def attention_method():
    backbone = build_backbone("dml_convnet")
    return build_method("cross_attention", backbone=backbone, num_classes=4, num_blocks=2).eval()


def comparison_frame() -> pd.DataFrame:
    rows = []
    for dataset, (variant, seconds, recall) in itertools.product(
        ("synbirds", "glyphs"),
        (
            ("ms", 100.0, 0.40),
            ("crt", 104.0, 0.405),
            (RERANK, 100.0, 0.41),
            ("triplet", 98.0, 0.40),
            ("dgcrl", 60.0, 0.401),
            ("lifted", 61.0, 0.402),
        ),
    ):
        for seed in (0, 1):
            rows.append(
                {
                    "dataset": dataset,
                    "variant": variant,
                    "seed": seed,
                    "train_seconds": seconds + seed,
                    "R@1": recall + 0.001 * seed,
                }
            )
    return pd.DataFrame(rows)


def history(epochs: int = 5) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "epoch": np.arange(1, epochs + 1),
            "loss": np.linspace(2.0, 1.0, epochs),
            "R@1": [0.1 + 0.05 * e if e % 2 else np.nan for e in range(epochs)],
        }
    )


def tuning_values() -> dict:
    rows = ["ms", "crt", "diml", "cross_attention", "dgcrl", "softmax", "triplet", "lifted", "normsoftmax"]
    rng = np.random.default_rng(0)
    return {("emoji", row): list(rng.uniform(0.3, 0.75, size=6)) for row in rows}


def forest() -> plt.Figure:
    from test_compare_explore import seed_rows

    frame = pd.DataFrame(
        seed_rows({("synbirds", "ms"): {0: 0.5, 1: 0.52, 2: 0.51}, ("synbirds", "crt"): {0: 0.6, 1: 0.6, 2: 0.7}})
    )
    return forest_figure(claims_table(frame, claims=CLAIMS[:3]))


def spectrum() -> plt.Figure:
    rng = np.random.default_rng(0)
    return plots.spectrum({"ms": rng.normal(size=(60, 16)), "crt": rng.normal(size=(60, 16))}, drop_first=1)


WITHOUT_DATA = {  # figure functions that need no dataset
    "crt_prototype_correlation": lambda: crt.prototype_correlation_figure(crt_method()),
    "crt_prototype_correlation_K8": lambda: crt.prototype_correlation_figure(crt_method(K1=8, K2=8)),
    "crt_transform": lambda: crt.transform_figure(crt_method(), image_size=64),
    "training_curves": lambda: plots.training_curves(history(5)),
    "recall_curve": lambda: plots.recall_curve({"R@1": 0.2, "R@2": 0.3, "R@4": 0.4, "R@8": 0.5}),
    "spectrum": spectrum,
    "recall_vs_time": lambda: tables.time_figure(comparison_frame()),
    "tuning_best_so_far": lambda: plot_best_so_far(tuning_values()),
    "dgcrl_toy_decorrelation": lambda: dgcrl.toy_figure(steps=5),
    "dgcrl_alpha_sweep": lambda: dgcrl.alpha_figure(
        pd.DataFrame(
            {
                "dataset": "emoji",
                "α": [1.0, 16.0, 128.0],
                "R@1": [0.2, 0.3, 0.4],
                "R@2": [0.3, 0.4, 0.5],
                "train accuracy": [50.0, 70.0, 90.0],
            }
        )
    ),
    "diml_worked_example": lambda: diml.worked_example()[0],
    "diml_cost": lambda: diml.cost_figure(
        pd.DataFrame({"K": [5, 10, 20] * 2, "G": [2] * 3 + [4] * 3, "ms per query": range(6)})
    ),
    "cross_attention_hierarchy": lambda: cross_attention.hierarchy_diagram(levels=3, embedding_dim=128),
    "cross_attention_grid": lambda: cross_attention.grid_heatmap(
        pd.DataFrame(
            {"n=0": [40.0, 41.0, 42.0], "n=1": [np.nan, 43.0, 44.0], "n=2": [np.nan, np.nan, 45.0]}, index=[0, 2, 6]
        ),
        title="R@1 (%) of sⁿ on an emoji test subset",
    ),
    "claims_forest": forest,
    "robustness_forest": lambda: robustness.forest_figure(
        pd.read_csv(Path(__file__).resolve().parents[1] / "results" / "robustness" / "claims.csv")
    ),
}


@pytest.mark.parametrize("name", sorted(WITHOUT_DATA))
def test_a_reader_can_read_the_figure(name):
    assert reading_faults(WITHOUT_DATA[name]()) == []


def explained(method, dataset, indices, **options):
    """The method's own explanation of ``dataset[indices[0]]`` and its retrievals ``indices[1:]``, drawn."""
    import torch

    images = torch.stack([dataset[i][0] for i in indices])
    return explanations.explanation_figure([(method.explain(images, **options), indices)], dataset)


def test_on_images(tiny_config):
    """The figures that draw dataset images and a method's explanation of them."""
    from dmlstudy.run.data import load_datasets

    dataset = load_datasets(tiny_config())["query"]
    labels = np.asarray(dataset.labels)
    other = int(np.flatnonzero(labels != labels[0])[0])
    embeddings = np.random.default_rng(0).normal(size=(len(labels), 8))
    drawn = {
        "retrieval_grid": plots.retrieval_grid(dataset, embeddings, labels, num_queries=2, top_k=4),
        "crt_heatmaps": explained(crt_method(), dataset, [0, 1], prototypes=3),
        "cross_attention_explanation": explained(attention_method(), dataset, [0, 1, other]),
        "cross_attention_maps": cross_attention.attention_figure(
            attention_method(), dataset, [(0, 1, other)], blocks=(1, 2)
        ),
    }
    assert {name: reading_faults(figure) for name, figure in drawn.items()} == {name: [] for name in drawn}


def test_the_checks_see_the_faults_they_look_for():
    """Each check fails on the fault it names: a heat map narrowed to three rows, two colour bars on one axis,
    a title under a neighbour's colour bar, overprinted point names."""
    figure, axis = plt.subplots()
    axis.imshow(np.eye(64))
    axis.set_ylim(33, 31)
    assert any("of an image spanning" in fault for fault in reading_faults(figure))
    figure, axis = plt.subplots()
    image = axis.imshow(np.eye(4))
    bar = figure.colorbar(image, ax=axis)
    figure.colorbar(image, cax=figure.add_axes(bar.ax.get_position()))  # a second bar drawn over the first
    assert any("colour bars" in fault for fault in reading_faults(figure))
    figure, axis = plt.subplots(figsize=(4.2, 3.6))  # the CRT correlation figure as it was once published
    plots.heatmap(axis, np.eye(64), title="|cos(c_k, c_j)|, K = 64; off-diagonal mean 0.000", label="|cos|")
    axis.set_ylim(33, 31)
    figure.tight_layout()
    assert any("runs into axes" in fault for fault in reading_faults(figure))
    figure, axis = plt.subplots()
    axis.text(0.5, 0.5, "MS baseline")
    axis.text(0.5, 0.5, "DGCRL")
    assert any("overprint" in fault for fault in reading_faults(figure))


def test_integer_ticks_keep_a_heat_maps_whole_inverted_axis():
    """``imshow`` runs y from n − 0.5 down to −0.5; integer ticks keep that view and direction (they once narrowed
    a 64 × 64 correlation matrix to rows 31–33)."""
    figure, axis = plt.subplots()
    axis.imshow(np.eye(64))
    plots.integer_ticks(axis, "x")
    plots.integer_ticks(axis, "y")
    assert axis.get_ylim() == pytest.approx((63.5, -0.5)) and axis.get_xlim() == pytest.approx((-0.5, 63.5))
    figure, axis = plt.subplots()
    axis.plot([3.2, 3.4], [1, 2])
    axis.invert_xaxis()
    plots.integer_ticks(axis, "x")
    low, high = axis.get_xlim()
    assert low > high and np.floor(low) - np.ceil(high) >= 1  # widened to hold integers, still inverted


def test_the_time_figure_is_redrawn_from_the_published_tables():
    """``redraw`` reads the numbers the notebook drew back from the committed tables of the default study."""
    summary = tables.time_summary_of_tables("results", regime="imagenet").set_index("variant")
    cost = pd.read_csv("results/compare_cost.csv").set_index("variant")
    main = pd.read_csv("results/compare_main_emoji_imagenet.csv").set_index("variant")
    assert list(summary.index) == list(cost.index)
    for variant in summary.index:
        assert cost.loc[variant, "train_seconds"] == (
            f"{summary.loc[variant, 'seconds_mean']:.1f} ± {summary.loc[variant, 'seconds_std']:.1f}"
        )
        assert summary.loc[variant, "recall_mean"] == pytest.approx(main.loc[variant, "R@1_mean"])
        assert summary.loc[variant, "recall_std"] == pytest.approx(main.loc[variant, "R@1_std"])
