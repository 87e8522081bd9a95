"""What the notebooks and the docs say about the study is the study that runs: each notebook of the default plan
names the dataset, the backbone and the image size its entry runs with and links its published copy; a paper
notebook opens with its paper (title, venue, a link), what it shows and what it costs, and ends with exercises
that have hints; no text describes the default study as the generated sets or a randomly initialised network."""

from __future__ import annotations

import re
from pathlib import Path

import jupytext
import pytest

from dmlstudy.catalog import catalog
from dmlstudy.methods import method_info
from dmlstudy.study.plan import PROTOCOL_PARAMETER, load_plan

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PLAN = ROOT / "plans" / "default.yaml"
PAPERS = {  # notebook → (its method, the paper's title)
    "10_crt": ("crt", "Coded Residual Transform for Generalizable Deep Metric Learning"),
    "20_diml": ("diml", "Towards Interpretable Deep Metric Learning with Structural Matching"),
    "30_cross_attention": (
        "cross_attention",
        "Cross-Image-Attention for Conditional Embeddings in Deep Metric Learning",
    ),
    "40_dgcrl": (
        "dgcrl",
        "Towards Optimal Fine Grained Retrieval via Decorrelated Centralized Loss with Normalize-Scale Layer",
    ),
}
STALE = (  # how the notebooks once described the default study, when it was the generated sets
    r"(?<!embedded study, )(?<!embedded study )SynBirds stands beside CUB and Glyphs beside Cars",
    r"on (our|both) embedded datasets",
    r"random-init 4-conv network on 64-px synthetic images",
    r"on the bird",
    r"Our 64-px `dml_convnet` map",
)
DEFAULT_STUDY_WORDS = re.compile(r"SynBirds|Glyphs|synthetic|generated|random[- ]init", re.IGNORECASE)


def markdown(stem: str) -> list[str]:
    notebook = jupytext.read(ROOT / "notebooks" / f"{stem}.py")
    return [cell.source for cell in notebook.cells if cell.cell_type == "markdown"]


def default_entries() -> dict[str, dict]:
    """Notebook stem → the parameters its entry of the default plan runs with (its protocol where it has one)."""
    return {entry.notebook.stem: entry.parameters for entry in load_plan(DEFAULT_PLAN)}


def backbone_name(backbone: str) -> str:
    """How the text names a registered backbone: its summary up to the first parenthesis."""
    return catalog().backbones[backbone].split(" (")[0]


@pytest.mark.parametrize("stem", sorted(default_entries()))
def test_each_notebook_of_the_default_study_links_its_published_copy_first(stem):
    first = markdown(stem)[0]
    assert f"(../published/{stem}.ipynb)" in first, f"{stem}: the first cell links published/{stem}.ipynb"


@pytest.mark.parametrize(
    "stem", sorted(stem for stem, parameters in default_entries().items() if PROTOCOL_PARAMETER in parameters)
)
def test_a_study_notebook_names_the_data_network_and_size_its_default_entry_runs_with(stem):
    protocol = default_entries()[stem][PROTOCOL_PARAMETER]
    text = "\n".join(markdown(stem))
    for dataset in protocol["datasets"]:
        assert re.search(rf"\b{dataset}\b", text, re.IGNORECASE), f"{stem} never names the dataset {dataset!r}"
    assert backbone_name(protocol["backbone"]) in text, f"{stem} never names {backbone_name(protocol['backbone'])}"
    assert f"{protocol['image_size']} px" in text, f"{stem} never gives the image size {protocol['image_size']} px"
    if protocol.get("regime") == "imagenet":
        assert "ImageNet" in text, f"{stem}: the backbone starts from ImageNet weights; the text never says so"


@pytest.mark.parametrize("stem", sorted(PAPERS))
def test_a_paper_notebook_opens_with_its_paper_what_it_shows_and_what_it_costs(stem):
    method, title = PAPERS[stem]
    first = markdown(stem)[0]
    assert f"*{title}*" in " ".join(first.split()), f"{stem}: the paper's title"
    venue = method_info(method).paper.split(", ", 1)[1].split(" (")[0]  # "NeurIPS 2022", from the registry
    assert venue in first, f"{stem}: the paper's venue {venue!r}"
    assert re.search(r"\]\(https://(arxiv\.org|openaccess\.thecvf\.com|doi\.org|openreview\.net)/", first), stem
    assert "**What it shows.**" in first and "**What it costs**" in first
    costs = first[first.index("**What it costs**") :].split("\n#")[0]
    assert "CI size" in costs and "teaching preset" in costs and "published study" in costs
    assert not re.search(r"TEACH_|TODO|XXX", first), f"{stem}: a placeholder is left in the text"


@pytest.mark.parametrize("stem", sorted(PAPERS))
def test_a_paper_notebook_ends_with_exercises_that_have_hints(stem):
    cells = markdown(stem)
    [exercises] = [cell for cell in cells if cell.startswith("## Exercises")]
    items = re.findall(r"^\d+\. (.+?)(?=^\d+\. |\Z)", exercises, re.MULTILINE | re.DOTALL)
    assert len(items) >= 2, f"{stem}: at least two exercises"
    assert all("*Hint:*" in item for item in items), f"{stem}: every exercise has a hint"
    assert "teaching preset" in exercises and f"make teach ONLY={stem.split('_', 1)[1]}" in exercises


@pytest.mark.parametrize("stem", sorted(path.stem for path in (ROOT / "notebooks").glob("*.py")))
def test_no_notebook_describes_the_default_study_as_the_generated_sets(stem):
    for cell in markdown(stem):
        for pattern in STALE:
            assert not re.search(pattern, cell), f"{stem}: stale text {pattern!r}"
        for sentence in re.split(r"(?<=[.;:])\s", cell.replace("\n# ", " ").replace("\n", " ")):
            if "default study" in sentence and "embedded" not in sentence:
                assert not DEFAULT_STUDY_WORDS.search(sentence), f"{stem}: {sentence!r}"


def test_the_notebooks_page_describes_the_notebooks_as_they_are():
    page = (ROOT / "docs" / "notebooks.md").read_text()
    assert "tour of the embedded datasets" not in page and "top-K box" not in page
    assert "published/README.md" in page and "plans/teach.yaml" in page
    readme = (ROOT / "README.md").read_text()
    assert "published/README.md" in readme and "make teach" in readme
