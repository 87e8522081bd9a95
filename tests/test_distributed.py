"""torchrun with 2 CPU processes (gloo) computes the same training as one process with the same global batch."""

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from dmlstudy.cli import config_options
from dmlstudy.run.train import run


def cli_arguments(config) -> list[str]:
    return config_options(config.to_dict())


@pytest.mark.parametrize("method", ["ms", "proxyanchor"])
def test_two_processes_match_one_process(tiny_config, method):
    # SGD: Adam divides by √v, which turns float-rounding differences of near-zero gradients into lr-sized updates
    options = dict(
        method=method,
        freeze_bn=True,
        epochs=2,
        steps_per_epoch=3,
        classes_per_batch=4,
        samples_per_class=2,
        lr_schedule="constant",
        optimizer="sgd",
        lr=0.05,
        head_lr=0.05,
    )
    single = run(tiny_config(run_name=f"single-{method}", **options))
    distributed = tiny_config(run_name=f"ddp-{method}", **options)
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "dmlstudy",
            "train",
            *cli_arguments(distributed),
        ],
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert json.loads((distributed.run_dir / "environment.json").read_text())["world_size"] == 2
    single_history = pd.read_csv(single.run_dir / "history.csv")
    ddp_history = pd.read_csv(distributed.run_dir / "history.csv")
    np.testing.assert_allclose(ddp_history["loss"], single_history["loss"], rtol=1e-5, atol=1e-6)
    single_state = torch.load(single.run_dir / "checkpoint.pt", weights_only=False)["method"]
    ddp_state = torch.load(distributed.run_dir / "checkpoint.pt", weights_only=False)["method"]
    for key, value in single_state.items():
        torch.testing.assert_close(ddp_state[key], value, rtol=1e-5, atol=1e-5, msg=key)
    ddp_metrics = json.loads((distributed.run_dir / "metrics.json").read_text())
    assert ddp_metrics["R@1"] == pytest.approx(single.metrics["R@1"], abs=1e-6)
