"""The shared study protocol: parallel grids train in separate processes, keep finished runs, report failures."""
import json

import pytest

from dmlstudy.experiments.protocol import GridRunError, is_complete, run_grid


def test_parallel_grid_trains_each_run_once_in_its_own_process(tiny_config):
    configs = [(f"seed{seed}", tiny_config(seed=seed, run_name=f"ms-seed{seed}", resume=True)) for seed in (0, 1)]
    results = run_grid(configs, workers=2)
    assert [variant for variant, _ in results] == ["seed0", "seed1"]
    for (_, config), (_, result) in zip(configs, results):
        assert is_complete(config)
        environment = json.loads((config.run_dir / "environment.json").read_text())
        assert environment["torch_threads"] == 1  # trained by a child process with cores // workers threads
        assert result.metrics == json.loads((config.run_dir / "metrics.json").read_text())
    stamps = [(config.run_dir / "metrics.json").stat().st_mtime_ns for _, config in configs]
    run_grid(configs, workers=2)  # finished runs are loaded, not retrained
    assert stamps == [(config.run_dir / "metrics.json").stat().st_mtime_ns for _, config in configs]


def test_parallel_grid_keeps_finished_runs_and_names_the_failed_one(tiny_config):
    good = tiny_config(run_name="good", resume=True)
    bad = tiny_config(run_name="bad", resume=True, method="no_such_method")
    with pytest.raises(GridRunError, match=r"(?s)1 of 2 runs failed.*runs/test/bad-[0-9a-f]{8} failed.*unknown method .no_such_method."):
        run_grid([("good", good), ("bad", bad)], workers=2)
    assert is_complete(good) and not is_complete(bad)


def test_workers_must_be_positive(tiny_config):
    with pytest.raises(ValueError, match="workers must be ≥ 1"):
        run_grid([("a", tiny_config())], workers=0)
