"""The facts a newcomer follows, checked against the plans and the code they describe: which tuning plan the
default study reads, what `make study` runs and how many runs that is, that every path and link the README and
docs/*.md give exists, that the README's layout lists every plan, and that no text cites a document a reader
does not have."""

import re
import warnings
from pathlib import Path

import pytest
import yaml

from dmlstudy.experiments import compare
from dmlstudy.paths import PUBLISHED_STUDIES
from dmlstudy.run.protocol import ProtocolConfig, plan_protocol
from dmlstudy.study.plan import PROTOCOL_PARAMETER, load_plan

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
COMPARE_NOTEBOOK = "90_compare.ipynb"
# a path as the docs write it, rooted at the project (`results/claims.md`) or one folder down (`../results/`);
# a `{csv,md}` group stands for each of its names
PATH = re.compile(r"(?:(?<=\.\./)|(?<![\w/.\-]))((?:results|docs|plans|figures)/[\w.\-/]*(?:\{[\w.,]+\}[\w.\-/]*)?)")
UNPUBLISHED = "not published"  # a line that says so may name the folder a published study's plan writes when run
UNAVAILABLE_SOURCES = re.compile(r"notes §|seed 00\d|study notes|project notes")


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def makefile_default_plan() -> str:
    """The plan `make study` runs without PLAN=… (the Makefile's ``PLAN ?=``)."""
    match = re.search(r"^PLAN \?= (\S+)$", read(ROOT / "Makefile"), re.MULTILINE)
    assert match, "the Makefile sets a default PLAN"
    return match.group(1)


def comparison_parameters(plan: str) -> dict:
    """The parameters of the plan's comparison entry (notebook 90_compare)."""
    [entry] = [entry for entry in load_plan(ROOT / plan) if entry.notebook.name == COMPARE_NOTEBOOK]
    return dict(entry.parameters)


def tuned_folder(plan: str) -> str:
    """The tuned-values folder the plan's comparison reads in its protocol's regime."""
    fields = {
        k: v for k, v in comparison_parameters(plan)[PROTOCOL_PARAMETER].items() if k not in ("study", "runs_root")
    }
    return ProtocolConfig(**fields).tuned_folder()


def tuning_plans() -> dict[str, dict]:
    """``plans/tune*.yaml`` (as the docs name them) → the plan's mapping as written, over the values of the study
    plan's protocol it reads (``protocol: plans/default.yaml``)."""
    plans = {f"plans/{path.name}": yaml.safe_load(read(path)) for path in sorted((ROOT / "plans").glob("tune*.yaml"))}
    return {
        name: {**(plan_protocol(plan["protocol"]) if "protocol" in plan else {}), **plan}
        for name, plan in plans.items()
    }


def default_tuning_plan() -> str:
    """The tuning plan whose ``out_dir`` is the folder the default study's protocol reads."""
    folder = tuned_folder(makefile_default_plan())
    writers = [name for name, plan in tuning_plans().items() if plan["out_dir"] == folder]
    assert len(writers) == 1, f"one tuning plan writes {folder}, found {writers}"
    return writers[0]


def plan_run_count(plan: str) -> int:
    """The distinct runs the plan trains: every run folder of its comparison's grids (main rows, classic rows,
    the ablation claims' runs) in each of its regimes; the plan's other entries train runs of the same
    configurations under the same names, and their folders are the same."""
    config = compare.CompareStudy.from_namespace(comparison_parameters(plan))
    folders = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # untuned rows: said by the notebook, not by a count
        for regime_config in config.regime_configs():
            grids = compare.main_grid(regime_config), compare.classic_grid(regime_config)
            grids += (compare.ablations_grid(regime_config),)
            folders |= {str(run.run_dir) for grid in grids for _, run in grid}
    return len(folders)


def blocks(text: str) -> list[str]:
    """A page's statements: each table row, each list item and each paragraph, its lines joined."""
    parts, current = [], []
    for line in text.splitlines():
        starts = line.startswith(("|", "- ", "* ")) or not line.strip()
        if starts and current:
            parts.append(" ".join(current))
            current = []
        if line.startswith("|"):
            parts.append(line)
        elif line.strip():
            current.append(line.strip())
    return [*parts, " ".join(current)] if current else parts


def section(text: str, heading: str) -> str:
    """The text under ``## heading`` up to the next ``## `` heading."""
    after = text.split(f"\n## {heading}\n", 1)
    assert len(after) == 2, f"the page has a section {heading!r}"
    return after[1].split("\n## ", 1)[0]


def test_the_default_study_reads_the_tuning_plan_the_docs_name():
    plan = default_tuning_plan()
    assert plan == "plans/tune_imagenet.yaml"  # the derivation finds the imagenet regime's plan
    for page in (ROOT / "docs" / "tuning.md", ROOT / "docs" / "adding_a_method.md", README):
        assert f"`{plan}`" in read(page), f"{page.name} names {plan}, the tuning plan `make study` reads"
    recipe = section(read(ROOT / "docs" / "adding_a_method.md"), "7. Tuning")
    assert f"make tune PLAN={plan}" in recipe, "the recipe tunes the new row with the plan the default study reads"


def test_the_tuning_pages_table_is_the_tuning_plans():
    """docs/tuning.md's table: each plan's regime, datasets, rows, trials and folder as the plan says them, and
    `make study` (no PLAN) named as the reader of the default study's plan alone."""
    rows = [line for line in read(ROOT / "docs" / "tuning.md").splitlines() if line.startswith("| `plans/tune")]
    plans, default = tuning_plans(), default_tuning_plan()
    shown = {}
    for row in rows:
        plan, regime, datasets, source, trials, writes, readers = [cell.strip() for cell in row.strip("|").split("|")]
        shown[plan.strip("`")] = (regime, datasets, source.strip("`"), int(trials), writes.strip("`"), readers)
    made = set(re.search(r"^tune: PLAN = (.+)$", read(ROOT / "Makefile"), re.MULTILINE).group(1).split())
    assert set(shown) == made, "the table lists the plans `make tune` runs"
    for name, (regime, datasets, source, trials, writes, readers) in shown.items():
        plan = plans[name]
        assert regime == plan.get("regime", "scratch"), name
        assert datasets == ", ".join(plan["datasets"]), name
        assert (source, trials, writes) == (plan["rows"], plan["trials"], plan["out_dir"]), name
        assert ("`make study` " in f"{readers} ") == (name == default), f"{name}: which study reads it"


def test_make_study_runs_the_plan_and_the_run_count_the_readme_states():
    plan = makefile_default_plan()
    commands = section(read(README), "Two commands")
    [bullet] = [block for block in blocks(commands) if block.startswith("- `make study`")]
    assert f"runs `{plan}`" in bullet, f"the README says `make study` runs {plan}"
    stated = re.search(r"\((\d+) runs\)", bullet)
    assert stated, "the README states how many runs `make study` trains"
    assert int(stated.group(1)) == plan_run_count(plan)


def test_every_statement_about_plain_make_study_counts_the_default_plans_runs():
    """A statement that names `make study` without PLAN=… and a number of runs gives the default plan's count
    (the 208 runs of the embedded study are `make study PLAN=plans/embedded.yaml`)."""
    count = plan_run_count(makefile_default_plan())
    wrong = []
    for page in PAGES:
        for block in blocks(read(page)):
            if "`make study`" not in block or "PLAN=" in block:
                continue
            wrong += [f"{page.name}: {block[:120]}" for n in re.findall(r"(\d[\d,]*) runs\b", block) if int(n) != count]
    assert not wrong, f"plain `make study` trains {count} runs, but:\n" + "\n".join(wrong)


def expand(path: str) -> list[str]:
    group = re.search(r"\{([\w.,]+)\}", path)
    return (
        [path[: group.start()] + name + path[group.end() :] for name in group.group(1).split(",")] if group else [path]
    )


def unpublished_output(path: str) -> bool:
    """A folder a published study writes when its plan runs (``results/headline10/``)."""
    parts = Path(path).parts
    return len(parts) >= 2 and parts[0] in ("results", "figures") and parts[1] in PUBLISHED_STUDIES


def test_every_path_and_link_the_docs_give_exists():
    missing = []
    for page in PAGES:
        for number, line in enumerate(read(page).splitlines(), 1):
            for match in PATH.finditer(line):
                for path in expand(match.group(1).rstrip(".")):
                    if (ROOT / path).exists() or (UNPUBLISHED in line and unpublished_output(path)):
                        continue
                    missing.append(f"{page.name}:{number}: {path}")
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                target = target.split("#")[0]
                if target and not target.startswith(("http://", "https://")) and not (page.parent / target).exists():
                    missing.append(f"{page.name}:{number}: link {target}")
    assert not missing, "paths in the docs that do not exist:\n" + "\n".join(missing)


def test_the_readme_layout_lists_every_plan():
    layout = section(read(README), "Layout")
    entry = re.search(r"^plans/(.*?)^\S", layout, re.MULTILINE | re.DOTALL)
    assert entry, "the layout has a plans/ entry"
    text = " ".join(entry.group(1).split())
    studies, tuning = re.search(r"study plans \(([^)]*)\)", text), re.search(r"tuning plans \((.*?)\), tuned/", text)
    assert studies and tuning, f"the plans/ entry lists 'study plans (…)' and 'tuning plans (…)': {text}"
    named = lambda found: set(re.findall(r"\b[a-z_0-9]+\b", found.group(1)))  # noqa: E731
    plans = {path.stem for path in (ROOT / "plans").glob("*.yaml")}
    assert named(studies) == {name for name in plans if not name.startswith("tune")}
    assert {name for name in named(tuning) if name.startswith("tune")} == {n for n in plans if n.startswith("tune")}


def test_the_readme_layout_names_every_package_folder_and_root_module():
    layout = section(read(README), "Layout")
    package = ROOT / "dmlstudy"
    folders = [f"{path.parent.name}/" for path in sorted(package.glob("*/__init__.py"))]
    modules = [path.name for path in sorted(package.glob("*.py")) if path.name != "__init__.py"]
    assert len(folders) >= 9 and len(modules) >= 13
    named = set(re.findall(r"[\w.]+/?", layout))
    missing = [name for name in [*folders, *modules] if name not in named]
    assert not missing, f"the README's layout does not name {missing}"


@pytest.mark.parametrize(
    "folder, pattern",
    [
        ("docs", "**/*.md"),
        ("dmlstudy", "**/*.py"),
        ("dmlstudy", "**/*.yaml"),
        ("notebooks", "*.py"),
        ("plans", "**/*.yaml"),
    ],
)
def test_no_text_cites_a_document_the_reader_does_not_have(folder, pattern):
    """The papers are cited by title and the study's decisions are stated where they act, never by a pointer to
    notes or numbered sources outside the repository."""
    cited = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted((ROOT / folder).glob(pattern))
        for number, line in enumerate(read(path).splitlines(), 1)
        if UNAVAILABLE_SOURCES.search(line)
    ]
    cited += [
        f"README.md:{n}" for n, line in enumerate(read(README).splitlines(), 1) if UNAVAILABLE_SOURCES.search(line)
    ]
    assert not cited, "\n".join(cited)


def test_make_lab_passes_the_lab_args_the_readme_documents():
    """`make lab LAB_ARGS="…"` as the README gives it for containers and remote machines reaches `jupyter lab`."""
    import subprocess

    documented = re.search(r'make lab LAB_ARGS="([^"]+)"', read(README))
    assert documented, "the README shows `make lab` with LAB_ARGS"
    arguments = documented.group(1)
    assert "--ip=0.0.0.0" in arguments and "--no-browser" in arguments
    dry = subprocess.run(
        ["make", "-n", "lab", f"LAB_ARGS={arguments}"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    [command] = [line for line in dry.splitlines() if "jupyter lab" in line]
    assert command.rstrip().endswith(arguments) and "--ServerApp.root_dir=." in command
    assert "LAB_ARGS" in read(ROOT / "Makefile").split("\nlab:")[0].rsplit("\n\n", 1)[-1]  # the target's comment
