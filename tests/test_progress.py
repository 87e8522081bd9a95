"""Progress where a person waits: the embedding pass of an evaluation shows a bar over its batches when asked
(a large gallery takes minutes), and stays silent otherwise; a study plan shows its runs, ended of known, with
the time left, and one short line per notebook."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from dmlstudy.methods import build_method
from dmlstudy.models import build_backbone
from dmlstudy.run.evaluation import embed


def test_embedding_shows_a_bar_over_its_batches_only_when_asked(capsys):
    torch.manual_seed(0)
    method = build_method("ms", backbone=build_backbone("dml_convnet"), embedding_dim=16, num_classes=3)
    images = TensorDataset(torch.randn(10, 3, 32, 32), torch.zeros(10, dtype=torch.long))
    quiet = embed(method, images, batch_size=4)
    assert capsys.readouterr().err == ""
    shown = embed(method, images, batch_size=4, progress=True)
    bar = capsys.readouterr().err
    assert "embedding 10 images" in bar and "/3 " in bar  # a bar over ⌈10 / 4⌉ batches (how far it got before
    # tqdm cleared it depends on the machine's speed, so only its total is checked)
    np.testing.assert_allclose(shown, quiet, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------
# the study runner's progress over a plan's runs (dmlstudy.study.progress.RunProgress, PlanProgress) and its entry lines


def test_run_progress_counts_finished_runs_at_once_and_grows_as_grids_arrive():
    from dmlstudy.study.progress import RunProgress

    progress = RunProgress(finished_before=["old-1", "old-2"])
    assert (progress.ended, progress.total, progress.eta(0.0)) == (2, 2, None)
    for name in ("a", "b", "c"):
        progress.submitted(name, 6, at=0.0)
    progress.submitted("old-1", 6, at=0.0)  # already finished: stays done, not waiting again
    assert (progress.ended, progress.total, progress.pending) == (2, 5, {"a", "b", "c"})
    assert progress.eta(10.0) is None  # no rate before the first submitted run finishes
    progress.fail("c", at=5.0)
    progress.submitted("d", 4, at=20.0)  # a later grid: the total grows
    progress.finish("in-kernel", at=25.0)  # finished unannounced (trained in a kernel): done, not in the rate
    assert (progress.ended, progress.total, sorted(progress.failed)) == (4, 7, ["c"])
    assert progress.eta(25.0) is None


def test_run_progress_eta_is_the_epochs_left_at_the_rate_the_plan_trained_them():
    """Runs a (6 epochs) and b (6) from t=0; a ends at 60 s: 6 epochs in 60 busy seconds, 10 s an epoch, so b
    needs 60 s; with c (3) from t=100, b and c need 90 s, counted down from the last finish. Time with nothing
    waiting or training does not slow the rate down."""
    from dmlstudy.study.progress import RunProgress

    progress = RunProgress()
    progress.submitted("a", 6, at=0.0)
    progress.submitted("b", 6, at=0.0)
    progress.finish("a", at=60.0)
    assert progress.eta(60.0) == pytest.approx(60.0)
    progress.submitted("c", 3, at=100.0)
    assert progress.eta(100.0) == pytest.approx(50.0)
    assert progress.eta(1000.0) == 0.0  # overdue: never negative
    progress.finish("b", at=120.0)
    progress.finish("c", at=130.0)  # 15 epochs in 130 busy seconds; nothing left
    assert (progress.ended, progress.total, progress.eta(130.0)) == (3, 3, None)
    progress.submitted("d", 15, at=500.0)  # 370 idle seconds later
    assert progress.eta(500.0) == pytest.approx(130.0)  # 15 epochs at 130 s per 15 epochs: the idle time is not in it
    progress.fail("d", at=510.0)
    progress.submitted("d", 15, at=520.0)  # submitted again by another notebook: waiting again
    assert progress.pending == {"d"} and not progress.failed


def test_the_runner_reads_whole_lines_of_the_run_ledger(tmp_path):
    from dmlstudy.study.progress import read_run_events

    ledger = tmp_path / "runs.jsonl"
    assert read_run_events(ledger, 0) == ([], 0)  # no notebook has submitted anything yet
    ledger.write_text('{"event": "submitted", "run": "a-1", "epochs": 6}\n{"event": "fail')
    events, offset = read_run_events(ledger, 0)
    assert events == [{"event": "submitted", "run": "a-1", "epochs": 6}]
    with ledger.open("a") as handle:
        handle.write('ed", "run": "a-1"}\n')
    assert read_run_events(ledger, offset) == ([{"event": "failed", "run": "a-1"}], ledger.stat().st_size)


def _finished_run(folder):
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("epochs: 6\n")
    (folder / "metrics.json").write_text('{"R@1": 0.5, "best_epoch": 3, "epochs": 6}')
    (folder / "checkpoint.pt").write_bytes(b"")


def test_plan_progress_learns_runs_from_the_ledger_and_the_run_folders(tmp_path):
    """A run finished before the plan is done at once; one a kernel submitted is known before any worker starts
    it and done once its records are complete; an overwritten run counts again when it finishes again."""
    import os

    from dmlstudy.study.engine import note_run_event
    from dmlstudy.study.progress import PlanProgress

    study = tmp_path / "s"
    _finished_run(study / "old-1")
    (study / "half-2").mkdir()
    (study / "half-2" / "checkpoint.pt").write_bytes(b"")  # interrupted earlier: not finished
    ledger = tmp_path / "runs.jsonl"
    with PlanProgress(3, study, events=ledger, enabled=False) as shown:
        assert (shown.runs.ended, shown.runs.total) == (1, 1)
        os.environ["DMLSTUDY_RUN_EVENTS"] = str(ledger)
        try:
            note_run_event("submitted", "new-3", epochs=6)
            note_run_event("submitted", "half-2", epochs=6)
        finally:
            del os.environ["DMLSTUDY_RUN_EVENTS"]
        shown.poll(now=1.0)
        assert (shown.runs.ended, shown.runs.total, shown.runs.pending) == (1, 3, {"new-3", "half-2"})
        _finished_run(study / "new-3")
        shown.poll(now=2.0)
        assert (shown.runs.ended, shown.runs.total, shown.runs.pending) == (2, 3, {"half-2"})
    with PlanProgress(3, study, overwrite=True, enabled=False) as again:
        assert again.runs.total == 0  # overwrite trains every run again
        (study / "old-1" / "metrics.json").unlink()  # being trained again
        again.poll(now=1.0)
        assert again.runs.ended == 0
        (study / "old-1" / "metrics.json").write_text("{}")
        os.utime(study / "old-1" / "metrics.json", ns=(1, 1))
        again.poll(now=2.0)
        assert again.runs.finished == {"old-1"}


def test_entry_lines_are_one_short_line_each():
    from pathlib import Path

    from dmlstudy.paths import project_root
    from dmlstudy.study.executor import EntryOutcome, outcome_status
    from dmlstudy.study.plan import PlanEntry, entry_line, entry_summary
    from dmlstudy.study.progress import duration_text

    crt = PlanEntry("default", "crt", project_root() / "notebooks" / "10_crt.ipynb")
    protocol = {"datasets": ["synbirds", "glyphs"], "seeds": [0, 1, 2, 3, 4], "epochs": 6, "lr": 0.004}
    assert entry_summary(protocol) == "5 seeds × 2 datasets"
    assert entry_summary({**protocol, "regime": "pretrained", "compared_regimes": ["scratch"], "methods": ["ms"]}) == (
        "5 seeds × 2 datasets × 1 method, 2 regimes"
    )
    nested = {"protocol": {**protocol, "regime": "pretrained"}, "compared_regimes": ["scratch"], "methods": ["ms"]}
    assert entry_summary(nested) == "5 seeds × 2 datasets × 1 method, 2 regimes"  # a study notebook's protocol
    assert entry_summary({"method": "ms", "dataset": "synbirds", "seed": 0, "epochs": 6}) == "ms, synbirds, seed 0"
    assert entry_summary({"knn_classes": 0}) == ""
    assert entry_line(2, 8, crt, "started", parameters=protocol) == (
        "[2/8] crt  notebooks/10_crt.ipynb  5 seeds × 2 datasets  started"
    )
    elsewhere = PlanEntry("s", "a", Path("/elsewhere/x.ipynb"))
    assert entry_line(1, 1, elsewhere, "skipped (up to date)", parameters={}) == (
        "[1/1] a  /elsewhere/x.ipynb  skipped (up to date)"
    )
    assert [duration_text(s) for s in (0.4, 59.0, 61.0, 2580.0, 3600.0, 3929.0)] == [
        "0 s",
        "59 s",
        "1 min",
        "43 min",
        "1 h 00 min",
        "1 h 05 min",
    ]
    assert entry_line(2, 8, crt, outcome_status(EntryOutcome(crt, "complete", 2580.0))) == "[2/8] crt  done in 43 min"
    failed = EntryOutcome(crt, "failed", 75.0, "cell 4: ValueError: no runs")
    assert outcome_status(failed) == "failed after 1 min: cell 4: ValueError: no runs"
    assert outcome_status(EntryOutcome(crt, "skipped")) == "skipped (up to date)"


def test_a_stopped_plan_says_in_one_line_what_it_kept_and_how_to_resume(tmp_path):
    from dmlstudy.paths import project_root, runs_root
    from dmlstudy.study.progress import resume_command, stop_line

    default = project_root() / "plans" / "default.yaml"
    assert resume_command(default, runs_root()) == "make study"
    assert resume_command(project_root() / "plans" / "smoke.yaml", runs_root()) == "make study PLAN=plans/smoke.yaml"
    assert resume_command(default, tmp_path) == f"dmlstudy study run plans/default.yaml --runs-root {tmp_path}"
    line = stop_line("SIGINT", runs=80, notebooks=1, command="make study")
    assert line == (
        "stopped by SIGINT: kept 80 finished runs and 1 finished notebook (runs in flight resume from their last "
        "epoch checkpoint); run `make study` again to resume"
    )
    assert "\n" not in line


def test_plan_progress_keeps_ticking_during_a_long_entry(tmp_path):
    """The bar is refreshed by its own thread while one notebook's cell runs for minutes."""
    import threading

    from dmlstudy.study.progress import PlanProgress

    with PlanProgress(2, tmp_path, heartbeat=0.01) as shown:
        shown.start()
        ticked = threading.Event()
        for _ in range(1000):
            if "1 running" in str(shown.bar.postfix):
                ticked.set()
                break
            ticked.wait(0.01)
        assert ticked.is_set(), shown.bar.postfix
        shown.done()
        shown.poll(now=1.0)
        assert "running" not in str(shown.bar.postfix)


# ---------------------------------------------------------------------------------------------------------
# the frozen stem's cache (dmlstudy.models.trunk_cache.stem_activation_split): minutes on a CPU, so a bar


class _ToySource:
    """Three classes of three images: what a TensorImageSplit reads of its source besides the pixels."""

    labels = np.repeat(np.arange(3), 3)
    paths = [f"{index}.png" for index in range(9)]
    class_names = ["a", "b", "c"]
    name, flip_invariant = "toy", False


def test_the_stem_cache_counts_images_times_views_and_leaves_the_activations_alone(tmp_path, monkeypatch, capsys):
    from tqdm.std import tqdm

    from dmlstudy.data.tensor_cache import TensorImageSplit
    from dmlstudy.models import trunk_cache

    class Recorded(tqdm):
        bars: list = []

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.steps = []
            Recorded.bars.append(self)

        def update(self, n=1):
            self.steps.append(n)
            return super().update(n)

    monkeypatch.setattr(trunk_cache, "tqdm", Recorded)
    torch.manual_seed(0)
    stem = trunk_cache.StemCachedBackbone(pretrained=False).eval()
    images = torch.randint(0, 256, (9, 3, 40, 40), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    split = TensorImageSplit(_ToySource(), images)
    options = dict(dataset_digest="toy", image_size=32, training_views=2, chunk=4)

    quiet = trunk_cache.stem_activation_split(split, stem, folder=tmp_path / "quiet", progress=False, **options)
    assert capsys.readouterr().err == ""
    unasked = trunk_cache.stem_activation_split(split, stem, folder=tmp_path / "unasked", **options)
    assert capsys.readouterr().err == "", "shown only on a terminal unless asked"

    shown = trunk_cache.stem_activation_split(split, stem, folder=tmp_path / "shown", progress=True, **options)
    bar = Recorded.bars[-1]
    assert (bar.total, bar.n) == (9 * 3, 9 * 3)  # 9 images × (2 training views + the test view)
    assert [step for step in bar.steps if step] == [4, 4, 1] * 3, "advanced chunk by chunk as the stem computes"
    assert "stem activations of toy (2 training views + the test view)" in capsys.readouterr().err
    assert torch.equal(shown.images, quiet.images) and torch.equal(unasked.images, quiet.images)

    trunk_cache.stem_activation_split(split, stem, folder=tmp_path / "shown", progress=True, **options)
    read = Recorded.bars[-1]
    assert (read.total, read.n, [step for step in read.steps if step]) == (27, 27, [9, 9, 9]), "a view read whole"


def test_the_emoji_download_says_what_it_waits_for_before_npm_answers(tmp_path, monkeypatch, capsys):
    import sys

    from dmlstudy.data import emoji_sources

    monkeypatch.setattr(emoji_sources, "npm_command", lambda: [sys.executable, "-c", "import sys; sys.exit(1)"])
    with pytest.raises(emoji_sources.EmojiFetchError):
        emoji_sources.fetch_sources(tmp_path / "cache", emoji_sources.EMOJI_SOURCES[:2])
    assert "emoji: downloading 2 of 2 npm packages (npm pack)" in capsys.readouterr().err


def test_make_studys_caching_step_asks_for_the_stem_bar_in_a_log_too(monkeypatch):
    """``make study`` caches the stem before any notebook (minutes): its bar is asked for, not left to whether
    stderr is a terminal, so a log of a batch run shows it as well; the plan's config is not changed."""
    from dmlstudy.run.train import TrainConfig
    from dmlstudy.study import plan_inputs

    asked = []
    monkeypatch.setattr(plan_inputs, "load_datasets", lambda config: asked.append(config.progress))
    config = TrainConfig(progress=False)
    lines = plan_inputs.prepare_stem_caches({"toy (imagenet, 64 px)": config}, echo=lambda *args, **kwargs: None)
    assert asked == [True] and config.progress is False
    assert lines[0].startswith("toy (imagenet, 64 px): the frozen stem's activations") and "cached in" in lines[0]


def test_tqdms_own_switch_turns_off_every_bar_of_the_package_also_one_that_sets_disable(monkeypatch):
    from dmlstudy.progress_bars import DISABLE_VARIABLE, disabled, transient_bar

    monkeypatch.delenv(DISABLE_VARIABLE, raising=False)
    assert disabled(False) is False and disabled(None) is None
    assert transient_bar(range(3), disable=False).disable is False
    monkeypatch.setenv(DISABLE_VARIABLE, "1")
    assert disabled(False) is True and disabled(None) is True
    assert transient_bar(range(3), disable=False).disable is True
