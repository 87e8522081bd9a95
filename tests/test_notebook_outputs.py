"""nbval's expected outputs (``tests/notebook_outputs/``, compared by ``make test``): one per notebook, executed from
the cells its source builds now, text kept and images dropped, the few cells whose outputs are not compared each
showing a measured time, and every pattern of the sanitize file in use."""

from __future__ import annotations

import re

import nbformat

from dmlstudy.experiments import notebooks as notebook_sources

FOLDER = notebook_sources.expected_folder()
NOT_COMPARED = "nbval-ignore-output"  # nbval's cell tag: executed, outputs not compared
MEASURED_TIME = re.compile(r"seconds|s/epoch|ms per query")


def expected(stem: str) -> nbformat.NotebookNode:
    return nbformat.read(FOLDER / f"{stem}.ipynb", as_version=4)


def output_text(cell) -> str:
    parts = []
    for output in cell.get("outputs", []):
        parts.append(output.get("text", ""))
        parts += [value for key, value in output.get("data", {}).items() if key.startswith("text/")]
    return "\n".join(parts)


def test_every_notebook_has_expected_outputs_from_its_current_cells():
    assert notebook_sources.expected_out_of_date() == []
    assert sorted(path.stem for path in FOLDER.glob("*.ipynb")) == notebook_sources.stems()


def test_an_edited_or_missing_notebook_is_named_with_the_command_that_refreshes_it(tmp_path, monkeypatch):
    monkeypatch.setattr(notebook_sources, "expected_folder", lambda: tmp_path)
    for stem in notebook_sources.stems():
        (tmp_path / f"{stem}.ipynb").write_text((FOLDER / f"{stem}.ipynb").read_text())
    assert notebook_sources.expected_out_of_date() == []
    edited = expected("01_train")
    edited.cells[-1].source += "\nprint('edited')"
    nbformat.write(edited, tmp_path / "01_train.ipynb")
    (tmp_path / "95_explore.ipynb").unlink()
    assert notebook_sources.expected_out_of_date() == [
        "tests/notebook_outputs/01_train.ipynb: executed from other cells than notebooks/01_train.py "
        "(run `make notebook-outputs`)",
        "tests/notebook_outputs/95_explore.ipynb: missing (run `make notebook-outputs`)",
    ]


def test_an_expected_copy_keeps_the_text_of_each_output_and_drops_its_image():
    executed = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("figure", execution_count=3)
    cell.outputs = [
        nbformat.v4.new_output(
            "display_data", {"image/png": "iVBOR", "text/plain": "<Figure size 640x480 with 1 Axes>"}
        ),
        nbformat.v4.new_output("execute_result", {"text/plain": "42"}, execution_count=3),
        nbformat.v4.new_output("stream", name="stdout", text="R@1 13.6\n"),
    ]
    executed.cells = [nbformat.v4.new_markdown_cell("# title"), cell]
    copy = nbformat.reads(notebook_sources.expected_copy(executed), as_version=4)
    kept = copy.cells[1]
    assert kept.execution_count == 3 and kept.id == cell.id and kept.source == "figure"
    assert [output.get("data", {}) for output in kept.outputs] == [
        {"text/plain": "<Figure size 640x480 with 1 Axes>"},
        {"text/plain": "42"},
        {},
    ]
    assert kept.outputs[2].text == "R@1 13.6\n" and kept.outputs[1].execution_count == 3


def test_the_outputs_compared_hold_the_runs_numbers_and_no_image():
    for stem in notebook_sources.stems():
        for cell in expected(stem).cells:
            for output in cell.get("outputs", []):
                assert not any(key.startswith("image/") for key in output.get("data", {})), stem
    assert "'R@1': 0.1391" in "".join(output_text(cell) for cell in expected("01_train").cells)


def test_each_cell_not_compared_shows_a_measured_time():
    not_compared = {
        (stem, index): output_text(cell)
        for stem in notebook_sources.stems()
        for index, cell in enumerate(expected(stem).cells)
        if NOT_COMPARED in cell.metadata.get("tags", [])
    }
    assert len(not_compared) == 4, sorted(not_compared)  # DIML's re-ranking cost, and three tables with time columns
    for (stem, index), text in not_compared.items():
        assert MEASURED_TIME.search(text), f"{stem} cell {index} is not compared but shows no measured time"


def test_every_pattern_of_the_sanitize_file_replaces_something():
    patterns = re.findall(r"^regex: (.*)$\n^replace: (.*)$", (FOLDER / "sanitize.cfg").read_text(), flags=re.MULTILINE)
    assert len(patterns) >= 4
    text = "\n".join(output_text(cell) for stem in notebook_sources.stems() for cell in expected(stem).cells)
    for regex, _ in patterns:
        assert re.search(regex, text), f"sanitize.cfg: {regex!r} matches no expected output"
