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
from matplotlib.container import ErrorbarContainer  # noqa: E402
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


# Colour-vision-deficiency simulation (Machado, Oliveira and Fernandes, 2009, severity 1), on linear RGB
CVD_MATRICES = {
    "deuteranopia": [[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413], [-0.011820, 0.042940, 0.968881]],
    "protanopia": [[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216], [-0.003882, -0.048116, 1.051998]],
    "tritanopia": [[1.255528, -0.076749, -0.178779], [-0.078411, 0.930809, 0.147602], [0.004733, 0.691367, 0.303900]],
}
DEFAULT_STUDY_ROWS = [
    "ms",
    "crt",
    "diml_rerank",
    "diml",
    "cross_attention",
    "dgcrl",
    "softmax",
    "triplet",
    "lifted",
    "normsoftmax",
]
MIN_DELTA_E = {"drawn together": 10.0, "any two rows": 5.0}  # CIEDE2000; about 2 is just noticeable side by side


def seen_lab(colours: list[str], vision: str = "normal") -> np.ndarray:
    """CIELAB of ``colours`` as a reader with ``vision`` (normal, or a :data:`CVD_MATRICES` key) sees them."""
    from matplotlib.colors import to_rgb
    from skimage.color import rgb2lab

    rgb = np.array([to_rgb(colour) for colour in colours])
    if vision != "normal":
        linear = (
            np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4) @ np.array(CVD_MATRICES[vision]).T
        )
        linear = np.clip(linear, 0, 1)
        rgb = np.where(linear <= 0.0031308, 12.92 * linear, 1.055 * linear ** (1 / 2.4) - 0.055)
    return rgb2lab(rgb[None])[0]


def closest_pair(colours: list[str], vision: str = "normal") -> tuple[float, str, str]:
    """The smallest CIEDE2000 distance between two of ``colours`` as seen with ``vision``, and the pair."""
    from skimage.color import deltaE_ciede2000

    lab = seen_lab(colours, vision)
    return min(
        (float(deltaE_ciede2000(lab[i], lab[j])), colours[i], colours[j])
        for i in range(len(colours))
        for j in range(i + 1, len(colours))
    )


def test_closest_pair_sees_what_colour_blind_readers_confuse():
    """The check below can fail: red and green, far apart in normal vision, nearly merge for a deuteranope."""
    red_green = ["#d62728", "#2ca02c"]
    assert closest_pair(red_green)[0] > 40
    assert closest_pair(red_green, "deuteranopia")[0] < MIN_DELTA_E["drawn together"]


def test_every_row_has_its_own_colour_and_its_group_marker():
    order = plots.method_order()
    assert order[0] == "ms" and RERANK in order and "softmax" in order
    assert set(list_methods()) <= set(order)
    styles = {name: plots.method_style(name) for name in order}
    assert all(style.marker != plots.OTHER_MARKER for style in styles.values()), "a row without a colour of its own"
    colours = [style.colour.lower() for style in styles.values()]
    assert len(set(colours)) == len(order), "two rows share a colour"
    paper = {styles[n].marker for n in order if row_info(n).group == "paper"}
    classic = {styles[n].marker for n in order if row_info(n).group == "classic"}
    assert len(paper) == len(classic) == 1 and not paper & classic  # the marker tells the group
    assert plots.method_style("no-such-row") == plots.method_style("no-such-row")
    assert plots.method_style("no-such-row").marker == plots.OTHER_MARKER


def test_row_colours_stay_apart_for_every_reader():
    """Any two rows are told apart in normal vision; the rows the default study draws together, and each of them
    against the white page, also for deuteranope, protanope and tritanope readers."""
    from dmlstudy.paths import project_root
    from dmlstudy.study.plan import load_plan

    compare = next(e for e in load_plan(project_root() / "plans" / "default.yaml") if e.notebook.stem == "90_compare")
    drawn = [*compare.parameters["methods"], *compare.parameters["classic_methods"]]
    assert sorted(drawn) == sorted(DEFAULT_STUDY_ROWS)
    every = [plots.method_style(name).colour for name in plots.method_order()]
    assert closest_pair(every)[0] >= MIN_DELTA_E["any two rows"], closest_pair(every)
    together = ["#ffffff", *(plots.method_style(name).colour for name in DEFAULT_STUDY_ROWS)]
    for vision in ("normal", *CVD_MATRICES):
        assert closest_pair(together, vision)[0] >= MIN_DELTA_E["drawn together"], (
            vision,
            closest_pair(together, vision),
        )


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


def skewed_times() -> pd.DataFrame:
    """Two rows whose training seconds are skewed as on a shared machine: mean − std < 0 for ``ms``."""
    rows = []
    for variant, seconds in (("ms", (12.0, 15.0, 20.0, 25.0, 320.0)), ("crt", (300.0, 380.0, 420.0, 450.0, 560.0))):
        for seed, value in enumerate(seconds):
            rows.append({"dataset": "emoji", "variant": variant, "seed": seed, "train_seconds": value, "R@1": 0.5})
    return pd.DataFrame(rows)


def error_bars(figure: plt.Figure) -> list:
    """Every error-bar container of the figure's data axes."""
    return [c for axis in data_axes(figure) for c in axis.containers if isinstance(c, ErrorbarContainer)]


def assert_no_time_below_zero(figure: plt.Figure) -> None:
    """No horizontal error bar (training seconds) reaches below 0 s, and the axis does not show negative time."""
    for container in error_bars(figure):
        _, _, bars = container.lines
        for collection in bars:
            for segment in collection.get_segments():
                assert np.min(segment[:, 0]) >= 0, (
                    f"{container.get_label()}: a time bar reaches {np.min(segment[:, 0])} s"
                )
    for axis in data_axes(figure):
        assert axis.get_xlim()[0] >= 0


def test_training_time_is_never_drawn_below_zero():
    frame = skewed_times()
    mean, std = frame[frame["variant"] == "ms"]["train_seconds"].agg(["mean", "std"])
    assert mean - std < 0  # the data a mean ± std bar would draw below 0 s
    figure = tables.time_figure(frame)
    assert error_bars(figure)
    assert_no_time_below_zero(figure)
    summary = tables.time_summary(frame).set_index("variant")
    _, _, (seconds_bar, *_) = error_bars(figure)[0].lines  # matplotlib draws the x error bars first
    [segment] = seconds_bar.get_segments()
    assert sorted(segment[:, 0]) == [summary.loc["ms", "seconds_min"], summary.loc["ms", "seconds_max"]]


def test_the_check_for_negative_time_fails_on_a_mean_minus_std_bar():
    figure, axis = plt.subplots()
    axis.errorbar([112.1], [50.0], xerr=[114.2], fmt="o")
    with pytest.raises(AssertionError, match="reaches"):
        assert_no_time_below_zero(figure)


def test_time_figure_redrawn_from_tables_keeps_the_range(tmp_path):
    frame = skewed_times().assign(group="main", parameters=1e6)
    cost = tables.cost_table(frame)
    assert list(cost[tables.SECONDS_RANGE]) == ["12.0–320.0", "300.0–560.0"]
    cost.to_csv(tmp_path / "compare_cost.csv", index=False)
    pd.DataFrame(
        {"dataset": "emoji", "variant": ["ms", "crt"], "R@1_mean": [50.0, 51.0], "R@1_std": [1.0, 1.0]}
    ).to_csv(tmp_path / f"compare_main_emoji{tables.table_suffix('imagenet')}.csv", index=False)
    summary = tables.time_summary_of_tables(tmp_path, regime="imagenet").set_index("variant")
    assert (summary.loc["ms", "seconds_min"], summary.loc["ms", "seconds_max"]) == (12.0, 320.0)
    assert_no_time_below_zero(tables.draw_time_figure(summary.reset_index()))


def test_markers_keep_their_shape():
    """Error bars carry no caps (caps on both axes framed each circle in a square), and each point keeps its
    group's marker."""
    figure = tables.time_figure(comparison_frame())
    for container in error_bars(figure):
        point, caps, _ = container.lines
        assert not caps, f"{container.get_label()} has error-bar caps"
        variant = next(v for v in comparison_frame()["variant"].unique() if method_label(v) == container.get_label())
        assert point.get_marker() == plots.method_style(variant).marker
    sweep = diml.sweep_figure(sweep_frame(), sweep="G")
    assert error_bars(sweep) and all(not container.lines[1] for container in error_bars(sweep))


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


def test_crt_correlation_figure_shows_the_off_diagonal():
    """A trained bank at |cos| 0 and an untrained one near √(2/(πC)) must look different: the diagonal is masked,
    both maps share a colour scale fitted to the off-diagonal (not 0–1), and a histogram shows both."""
    torch.manual_seed(0)
    untrained = build_method("crt", backbone=build_backbone("dml_convnet"), num_classes=4).eval()
    trained = build_method("crt", backbone=build_backbone("dml_convnet"), num_classes=4).eval()
    bank = trained.bank(1).prototypes
    count, channels = bank.shape
    assert count <= channels
    with torch.no_grad():  # what L_DIV reaches when K ≤ C: mutually orthogonal prototypes
        bank.copy_(torch.linalg.qr(torch.randn(channels, count))[0].T)
    figure = crt.prototype_correlation_figure(trained, untrained=untrained)
    maps = [axis for axis in data_axes(figure) if axis.images]
    assert len(maps) == 2 and len(colourbar_axes(figure)) == 2
    off = crt.off_diagonal(crt.prototype_correlation(untrained).numpy())
    for axis in maps:
        image = axis.images[0]
        assert np.ma.getmaskarray(image.get_array()).diagonal().all()  # the diagonal (1 by definition) is masked
        assert image.norm.vmax == pytest.approx(off.max(), rel=1e-5)  # the scale is the off-diagonal's, not 0–1
    assert "mean 0.000" in maps[0].get_title() and f"mean {off.mean():.3f}" in maps[1].get_title()
    [histogram] = [axis for axis in data_axes(figure) if not axis.images]
    assert len(histogram.patches) > 0 and histogram.get_yscale() == "log"
    legend_text = [text.get_text() for legend in legends(figure) for text in legend.get_texts()]
    assert any(t.startswith("trained") for t in legend_text) and any(t.startswith("untrained") for t in legend_text)
    assert crt.random_prototype_cosine(320) == pytest.approx(0.0446, abs=1e-4)
    assert crt.random_prototype_cosine(channels) == pytest.approx(off.mean(), rel=0.15)


def test_projection_panels_are_framed_and_say_the_colours_are_classes():
    from dmlstudy.experiments import kit

    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 8)
    panels = {name: (rng.normal(size=(len(labels), 6)), labels) for name in ("ms", "crt", "dgcrl")}
    figure = kit.projection_figure(panels, kind="tsne", classes=4, iterations=250)
    drawn = [axis for axis in figure.axes if axis.collections]
    assert len(drawn) == 3
    for axis in drawn:
        assert axis.axison and all(spine.get_visible() for spine in axis.spines.values())
        assert not axis.get_xticks().size and not axis.get_yticks().size
        points = axis.collections[0]
        colours = {to_hex(c) for c in points.to_rgba(points.get_array())}
        assert len(colours) == 4 and colours <= set(plots.PALETTE)  # one colour-blind-safe colour per class
    assert "coloured by class" in figure.get_suptitle()


def test_attention_figure_draws_the_blocks_the_model_has_and_says_which():
    assert cross_attention.drawn_blocks([2, 4, 6], 5)[0] == [2, 4, 5]
    assert "6 asked for" in cross_attention.drawn_blocks([2, 4, 6], 5)[1]
    assert cross_attention.drawn_blocks([2, 4, 6], 6) == ([2, 4, 6], "The model has 6 blocks; drawn: 2, 4 and 6.")
    assert cross_attention.drawn_blocks([1], 3)[0] == [1, 3]
    with pytest.raises(ValueError):
        cross_attention.drawn_blocks([1], 0)


def test_complexity_counts_the_backbone_the_runs_train():
    """Without conv_head the feature map CRT codes has the last stage's 320 channels, and the 1 × 1 conv_head the
    runs never run is not counted."""
    from dmlstudy.models.trunk_cache import StemCachedBackbone

    whole = crt.complexity_row("lite0", image_size=64, backbone=StemCachedBackbone(conv_head=True))
    trained = crt.complexity_row("lite0", image_size=64, backbone=StemCachedBackbone(conv_head=False))
    assert (whole["C"], trained["C"]) == (1280, 320)
    head = StemCachedBackbone(conv_head=True).model
    idle = sum(p.numel() for module in (head.conv_head, head.bn2) for p in module.parameters()) / 1e6
    assert trained["backbone params (M)"] == pytest.approx(whole["backbone params (M)"] - idle)
    assert trained["+CRT params, train (M)"] < whole["+CRT params, train (M)"] / 3  # K·C·D: C 4× smaller


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
