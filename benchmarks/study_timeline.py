"""How busy a study kept its workers: from each run folder's ``config.yaml`` (written when the run starts) and
``metrics.json`` (written when it ends), the minutes during which 0, 1, 2, … runs trained at once, the runs'
summed time, and the floor that summed time sets on ``--workers`` workers however the runs are scheduled.

    .venv/bin/python benchmarks/study_timeline.py runs/default --workers 2

A run still training counts until the newest record seen. Time the workers spend on tasks that are not runs
(DIML re-ranking) shows as fewer runs at once. Results: benchmarks/README.md, "Notebooks side by side".
"""

from __future__ import annotations

import argparse
from pathlib import Path


def run_intervals(folder: Path) -> list[tuple[float, float | None, str]]:
    """``(start, end or None, name)`` of every run folder under ``folder`` (those with a ``config.yaml``)."""
    intervals = []
    for config in folder.glob("*/config.yaml"):
        metrics = config.parent / "metrics.json"
        end = metrics.stat().st_mtime if metrics.is_file() else None
        intervals.append((config.stat().st_mtime, end, config.parent.name))
    return sorted(intervals)


def occupancy(intervals: list[tuple[float, float | None, str]]) -> tuple[float, dict[int, float]]:
    """The span from the first start to the last record, and the seconds with k runs at once, per k."""
    now = max(end or start for start, end, _ in intervals)
    events = sorted(  # at equal times a start before an end
        [(start, -1) for start, _, _ in intervals] + [(end or now, 1) for _, end, _ in intervals]
    )
    seconds: dict[int, float] = {}
    running, last = 0, intervals[0][0]
    for time, ending in events:
        seconds[running] = seconds.get(running, 0.0) + time - last
        running, last = running - ending, time
    return now - intervals[0][0], seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a study's runs folder, e.g. runs/default")
    parser.add_argument("--workers", type=int, default=2, help="workers the study trained on (for the floor)")
    args = parser.parse_args()
    intervals = run_intervals(args.folder)
    if not intervals:
        raise SystemExit(f"no run folders (with a config.yaml) under {args.folder}")
    span, seconds = occupancy(intervals)
    finished = [(start, end) for start, end, _ in intervals if end is not None]
    total = sum(end - start for start, end in finished)
    print(f"{len(intervals)} runs started, {len(finished)} finished; span {span / 60:.1f} min")
    for count in sorted(seconds):
        print(f"  {count} run(s) at once: {seconds[count] / 60:.1f} min")
    print(
        f"finished runs: {total / 60:.1f} min in all, so at least {total / 60 / args.workers:.1f} min on "
        f"{args.workers} workers"
    )


if __name__ == "__main__":
    main()
