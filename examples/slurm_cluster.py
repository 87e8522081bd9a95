"""Start a Dask cluster of Slurm jobs for dmlstudy and keep it up; print the scheduler address to pass to
``dmlstudy study run PLAN --scheduler ADDRESS`` (or to export as ``DMLSTUDY_SCHEDULER``).

Run it on the login node (or in a small job of its own), in the clone on the shared filesystem::

    python examples/slurm_cluster.py --jobs 4                      # settings: examples/dask/jobqueue-slurm.yaml
    python examples/slurm_cluster.py --jobs 4 --print-job-script   # what sbatch will receive, then exit

The scheduler runs in this process: stop it (Ctrl-C) when the study is done, and the jobs are cancelled.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import dask.config
import yaml

SETTINGS = Path(__file__).with_name("dask") / "jobqueue-slurm.yaml"


def slurm_cluster(settings: Path = SETTINGS, **overrides):
    """A ``dask_jobqueue.SLURMCluster`` configured from ``settings`` (keyword arguments override it)."""
    from dask_jobqueue import SLURMCluster

    slurm = yaml.safe_load(settings.read_text())["jobqueue"]["slurm"]
    dask.config.set({f"jobqueue.slurm.{key}": value for key, value in slurm.items()})  # over jobqueue's defaults, for
    return SLURMCluster(**overrides)  # every job it submits later


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="Slurm jobs to keep running")
    parser.add_argument("--settings", type=Path, default=SETTINGS)
    parser.add_argument("--print-job-script", action="store_true")
    args = parser.parse_args()
    cluster = slurm_cluster(args.settings, scheduler_options={"port": 8786, "dashboard_address": ":8787"})
    if args.print_job_script:
        print(cluster.job_script())
        cluster.close()
        return
    cluster.scale(jobs=args.jobs)
    print(
        f"scheduler: {cluster.scheduler_address}\ndashboard: {cluster.dashboard_link}\n"
        f"dmlstudy study run plans/default.yaml --scheduler {cluster.scheduler_address}"
    )
    try:
        while True:
            time.sleep(60)
    except KeyboardInterrupt:
        cluster.close()


if __name__ == "__main__":
    main()
