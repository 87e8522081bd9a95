"""The study's figure style (dmlstudy.plots): each figure function drawn on tiny synthetic inputs, then checked
for what a reader relies on — one colour and marker per method in every figure, legends clear of every data
area, integer epoch ticks, plain Recall@K ticks, a colourbar beside each heat map, and no curve through a
sweep of fewer than three values."""

from __future__ import annotations

from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from dmlstudy import explanations, plots  # noqa: E402
from dmlstudy.experiments import tables  # noqa: E402
from dmlstudy.experiments.papers import cross_attention, crt, dgcrl, diml  # noqa: E402
from dmlstudy.methods import build_method, list_methods  # noqa: E402
from dmlstudy.models import build_backbone  # noqa: E402
from dmlstudy.rows import RERANK, method_label, row_info  # noqa: E402
from dmlstudy.study.tuning import plot_best_so_far  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def colourbar_axes(figure: plt.Figure) -> list[plt.Axes]:
    return [axis for axis in figure.axes if hasattr(axis, "_colorbar")]


def data_axes(figure: plt.Figure) -> list[plt.Axes]:
    return [axis for axis in figure.axes if not hasattr(axis, "_colorbar")]


def legends(figure: plt.Figure) -> list:
    return [*figure.legends, *(axis.get_legend() for axis in figure.axes if axis.get_legend() is not None)]


def assert_legends_clear(figure: plt.Figure) -> None:
    """Every legend's box, once drawn, overlaps none of the figure's data axes."""
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    assert legends(figure), "expected a legend"
    for legend in legends(figure):
        box = legend.get_window_extent(renderer)
        for axis in data_axes(figure):
            assert not box.overlaps(axis.get_window_extent(renderer)), (
                f"legend {[t.get_text() for t in legend.get_texts()]} overlaps axes {axis.get_title()!r}"
            )


def assert_integer_ticks(axis: plt.Axes) -> None:
    low, high = axis.get_xlim()
    shown = [tick for tick in axis.get_xticks() if low <= tick <= high]
    assert shown and all(float(tick).is_integer() for tick in shown), shown


def series_colours(figure: plt.Figure) -> dict[str, tuple[str, str]]:
    """Legend label → (colour, marker) of the lines and error-bar points drawn with it."""
    found = {}
    for axis in data_axes(figure):
        for line in axis.get_lines():
            label = line.get_label()
            if not label.startswith("_"):
                found[label] = (to_hex(line.get_color()), line.get_marker())
        for container in axis.containers:
            label = container.get_label()
            if label and not label.startswith("_") and getattr(container, "lines", None):
                line = container.lines[0]
                found[label] = (to_hex(line.get_color()), line.get_marker())
    return found


def history(epochs: int = 5) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "epoch": np.arange(1, epochs + 1),
            "loss": np.linspace(2.0, 1.0, epochs),
            "R@1": [0.1 + 0.05 * e if e % 2 else np.nan for e in range(epochs)],
        }
    )


def comparison_frame() -> pd.DataFrame:
    rows = []
    for variant, group, seconds, recall in (
        ("ms", "classic", 100.0, 0.40),
        ("crt", "paper", 104.0, 0.41),
        (RERANK, "paper", 100.0, 0.42),
        ("triplet", "classic", 98.0, 0.35),
    ):
        for seed in (0, 1):
            rows.append(
                {
                    "dataset": "synbirds",
                    "variant": variant,
                    "group": group,
                    "seed": seed,
                    "train_seconds": seconds + seed,
                    "R@1": recall + 0.01 * seed,
                }
            )
    return pd.DataFrame(rows)


def test_method_styles_are_distinct_and_follow_the_comparison_order():
    order = plots.method_order()
    assert order[0] == "ms" and RERANK in order and "softmax" in order
    assert set(list_methods()) <= set(order)
    styles = [plots.method_style(name) for name in order]
    assert len({(s.colour, s.marker) for s in styles}) == len(order)
    assert all(s.colour in plots.PALETTE for s in styles)
    paper = {plots.method_style(n).marker for n in order if row_info(n).group == "paper"}
    classic = {plots.method_style(n).marker for n in order if row_info(n).group == "classic"}
    assert not paper & classic  # the marker tells the group
    assert plots.method_style("no-such-row") == plots.method_style("no-such-row")
    assert plots.method_style("no-such-row").marker == plots.OTHER_MARKER


def test_a_method_has_one_colour_in_every_figure():
    rng = np.random.default_rng(0)
    embeddings = {name: (rng.normal(size=(40, 8)), np.arange(40) % 4) for name in ("ms", "crt", RERANK)}
    spectrum = series_colours(tables.spectrum_figure(embeddings, dataset="synbirds"))
    timing = series_colours(tables.time_figure(comparison_frame()))
    results = [
        (name, SimpleNamespace(config=SimpleNamespace(dataset="synbirds", seed=0), history=history()))
        for name in ("ms", "dgcrl", "softmax")
    ]
    curves = series_colours(dgcrl.loss_curves(results))
    ms = method_label("ms")
    by_spectrum = {label.split(" (ρ")[0]: style for label, style in spectrum.items()}
    expected = plots.method_style("ms")
    assert by_spectrum[ms] == timing[ms] == curves[ms] == (expected.colour, expected.marker)
    assert by_spectrum[method_label("crt")] == timing[method_label("crt")]
    assert by_spectrum[ms][0] != by_spectrum[method_label("crt")][0]


@pytest.mark.parametrize(
    "draw",
    [
        lambda: plot_best_so_far({("emoji", row): [0.3, 0.5, 0.6] for row in ("ms", "crt", "lifted")}),
        lambda: plots.spectrum({name: np.random.default_rng(1).normal(size=(30, 6)) for name in ("ms", "crt", "x")}),
        lambda: dgcrl.alpha_figure(alpha_frame([1, 16, 64])),
        lambda: dgcrl.toy_figure(steps=5),
        lambda: diml.cost_figure(
            pd.DataFrame({"K": [5, 10, 20] * 2, "G": [2] * 3 + [4] * 3, "ms per query": range(6)})
        ),
        lambda: diml.sweep_figure(sweep_frame(), sweep="G"),
    ],
    ids=["tuning", "spectrum", "alpha", "toy", "cost", "sweep"],
)
def test_legends_lie_outside_the_data(draw):
    assert_legends_clear(draw())


def test_the_time_figure_names_each_method_once_beside_its_panel():
    """No legend: each point is named in a column right of its panel (outside the data), joined by a leader line."""
    figure = tables.time_figure(comparison_frame())
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    axis = figure.axes[0]
    names = [text.get_text() for text in axis.texts]
    assert sorted(names) == sorted(method_label(v) for v in comparison_frame()["variant"].unique())
    right = axis.get_window_extent(renderer).x1
    assert all(Text.get_window_extent(text, renderer).x0 > right for text in axis.texts)


def test_epoch_axes_have_integer_ticks():
    figure = plots.training_curves(history(5))
    for axis in data_axes(figure):
        assert_integer_ticks(axis)
    results = [("ms", SimpleNamespace(config=SimpleNamespace(dataset="d", seed=0), history=history(3)))]
    assert_integer_ticks(dgcrl.loss_curves(results).axes[0])


def test_recall_axis_shows_plain_numbers():
    figure = plots.recall_curve({"R@1": 0.2, "R@2": 0.3, "R@4": 0.4, "R@8": 0.5})
    figure.canvas.draw()
    axis = figure.axes[0]
    assert [t.get_text() for t in axis.get_xticklabels()] == ["1", "2", "4", "8"]
    assert not any(t.get_text() for t in axis.get_xticklabels(minor=True))


def alpha_frame(alphas) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "dataset": "synbirds",
            "α": [float(alpha) for alpha in alphas],
            "R@1": np.linspace(0.2, 0.4, len(alphas)),
            "R@2": np.linspace(0.3, 0.5, len(alphas)),
            "train accuracy": np.linspace(50.0, 90.0, len(alphas)),
        }
    )


def sweep_frame() -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "sweep": "G",
                "dataset": "synbirds",
                "base_loss": "ms",
                "training": "plain",
                "G": g,
                "seed": s,
                "P@1": 0.3 + 0.01 * g,
            }
            for g in (2, 4)
            for s in (0, 1)
        ]
    )


def test_a_sweep_of_fewer_than_three_values_is_not_a_curve():
    short = dgcrl.alpha_figure(alpha_frame([16, 64]))
    assert {line.get_linestyle() for line in short.axes[0].get_lines()} == {"None"}
    assert "only 2" in short.axes[0].get_title()
    long = dgcrl.alpha_figure(alpha_frame([1, 16, 64]))
    assert {line.get_linestyle() for line in long.axes[0].get_lines()} == {"-"}
    two_grids = diml.sweep_figure(sweep_frame(), sweep="G")
    assert all(c.lines[0].get_linestyle() == "None" for c in two_grids.axes[0].containers)


def test_heat_maps_have_a_colourbar_and_a_title():
    figure, _ = diml.worked_example()
    heat_maps = [axis for axis in data_axes(figure) if axis.images]
    assert len(heat_maps) == 4
    for axis in heat_maps:
        assert axis.images[0].colorbar is not None, axis.get_title()
        assert axis.get_title()
    grid = pd.DataFrame({"n=1": [40.0, 41.0], "n=2": [np.nan, 43.0]}, index=[1, 2])
    figure = cross_attention.grid_heatmap(grid)
    assert colourbar_axes(figure) and figure.axes[0].get_title()


def test_crt_figures_have_colourbars(tiny_config):
    from dmlstudy.run.data import load_datasets

    method = build_method("crt", backbone=build_backbone("dml_convnet"), num_classes=4).eval()
    assert colourbar_axes(crt.prototype_correlation_figure(method))
    dataset = load_datasets(tiny_config())["query"]
    figure = explanation_figure(method, dataset, [0, 1], prototypes=3)
    assert len(colourbar_axes(figure)) == 1 and figure.get_suptitle()


def test_same_and_other_class_are_not_red_and_green():
    assert {plots.CORRECT, plots.WRONG} <= set(plots.PALETTE)
    assert plots.CORRECT != plots.WRONG


def test_attention_maps_have_colourbars_and_class_colours(tiny_config):
    from dmlstudy.run.data import load_datasets

    method = build_method("cross_attention", backbone=build_backbone("dml_convnet"), num_classes=4, num_blocks=2).eval()
    dataset = load_datasets(tiny_config())["query"]
    labels = np.asarray(dataset.labels)
    other = int(np.flatnonzero(labels != labels[0])[0])
    explanation = explanation_figure(method, dataset, [0, 1, other])
    assert len(colourbar_axes(explanation)) == 1
    title_colours = {to_hex(axis.title.get_color()) for axis in data_axes(explanation)}
    assert title_colours <= {plots.CORRECT, plots.WRONG} and plots.WRONG in title_colours
    figure = cross_attention.attention_figure(method, dataset, [(0, 1, other)], blocks=(1, 2))
    assert len(colourbar_axes(figure)) == 2


def explanation_figure(method, dataset, indices, **options) -> plt.Figure:
    """The method's own explanation of ``dataset[indices[0]]`` and its retrievals ``indices[1:]``, drawn."""
    images = torch.stack([dataset[i][0] for i in indices])
    return explanations.explanation_figure([(method.explain(images, **options), indices)], dataset)


def part_discovery(method, dataset, **options):
    """The local parts of ``method``'s backbone feature maps on ``dataset``, as notebook 30 draws them."""
    from dmlstudy.methods.cross_attention import feature_maps

    return explanations.local_parts_figure(feature_maps(method, dataset), dataset, **options)


def credit_lines(figure: plt.Figure, dataset) -> list[str]:
    """The text :func:`dmlstudy.plots.credit` adds for ``dataset`` under a figure of ``figure``'s size."""
    blank = plots.credit(plt.figure(figsize=figure.get_size_inches()), dataset)
    return [text.get_text() for text in blank.texts]


def test_cross_attention_image_figures_carry_the_credit_and_keep_bars_and_titles_apart(tiny_config, monkeypatch):
    """The attention maps and the local parts draw the dataset's images, so both carry its credit; the maps' two
    colour bars (attention, a − b) overlap neither each other nor a panel, and no two panel titles overlap."""
    from dmlstudy.data import base
    from dmlstudy.run.train import load_datasets

    dataset = load_datasets(tiny_config())["query"]
    monkeypatch.setitem(base.IMAGE_CREDITS, "cub200", "Images: test artists, CC BY 4.0, https://example.org/images")
    assert base.image_credit(dataset)
    method = build_method("cross_attention", backbone=build_backbone("dml_convnet"), num_classes=4, num_blocks=2).eval()
    labels = np.asarray(dataset.labels)
    others = np.flatnonzero(labels != labels[0])
    triples = [(0, 1, int(others[0])), (2, 3, int(others[1]))]
    figure = cross_attention.attention_figure(method, dataset, triples, blocks=(1, 2))
    narrow = cross_attention.attention_figure(method, dataset, triples[:1], blocks=(2,))  # one block column
    parts, _ = part_discovery(method, dataset, queries=1, neighbours=2)
    for drawn in (figure, narrow, parts):
        expected = credit_lines(drawn, dataset)
        assert expected and set(expected) <= {text.get_text() for text in drawn.texts}

    for drawn in (figure, narrow):
        drawn.canvas.draw()
        renderer = drawn.canvas.get_renderer()
        bars = [axis.get_tightbbox(renderer) for axis in colourbar_axes(drawn)]  # bar, ticks and label
        assert len(bars) == 2 and not bars[0].overlaps(bars[1])
        panels = [axis.get_window_extent(renderer) for axis in data_axes(drawn)]
        assert not any(bar.overlaps(panel) for bar in bars for panel in panels)
    renderer = figure.canvas.get_renderer()
    titles = [axis.title.get_window_extent(renderer) for axis in data_axes(figure) if axis.get_title()]
    assert len(titles) == 2 * 3 * 2  # blocks 1 and 2 (blocks beyond N are left out) × 3 rows × 2 triples
    assert not any(a.overlaps(b) for index, a in enumerate(titles) for b in titles[index + 1 :])


def test_the_parts_table_and_its_sentence_give_chance_in_percent_as_they_give_the_share(tiny_config):
    from dmlstudy.experiments.papers.cross_attention import parts_reading
    from dmlstudy.run.data import load_datasets

    dataset = load_datasets(tiny_config())["query"]
    method = build_method("cross_attention", backbone=build_backbone("dml_convnet"), num_classes=4, num_blocks=2).eval()
    _, table = part_discovery(method, dataset, queries=2, neighbours=3)
    assert "chance (%)" in table.columns and "chance" not in table.columns
    labels = np.asarray(dataset.labels)
    for query, chance in zip(table["query image"], table["chance (%)"]):
        expected = 100 * (np.sum(labels == labels[query]) - 1) / (len(labels) - 1)
        assert float(chance) == pytest.approx(expected, abs=0.05)
    chance = float(np.mean(table["chance (%)"].astype(float)))
    assert f"(chance {chance:.1f}%)" in parts_reading(table)
