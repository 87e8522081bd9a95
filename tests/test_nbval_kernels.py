"""Notebook kernels started by nbval get the study runner's kernel settings (the project's root conftest.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import zmq
from nbval import kernel

from dmlstudy.study.executor import kernel_config


def test_nbval_kernel_managers_use_the_runners_settings():
    manager = kernel.KernelManager(kernel_name="python3")
    expected = "auto" if zmq.has("curve") else "disabled"
    assert manager.transport_encryption == expected
    assert kernel_config().get("KernelManager", {}).get("transport_encryption", "disabled") == expected


def test_nbval_kernels_get_the_environment_their_expected_outputs_were_made_in():
    from dmlstudy.experiments.notebooks import KERNEL_ENVIRONMENT
    from dmlstudy.paths import RUNS_VARIABLE, project_root

    running = kernel.RunningKernel("python3")
    try:
        running.execute_cell_input(
            f"import os; print({{k: os.environ.get(k) for k in {[*sorted(KERNEL_ENVIRONMENT), RUNS_VARIABLE]!r}}})"
        )
        printed = []
        while True:
            message = running.get_message("iopub", timeout=60)
            if message["msg_type"] == "stream":
                printed.append(message["content"]["text"])
            if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle" and printed:
                break
    finally:
        running.stop()
    environment = ast.literal_eval("".join(printed))
    runs = environment.pop(RUNS_VARIABLE)
    assert environment == KERNEL_ENVIRONMENT
    assert runs and not Path(runs).is_relative_to(project_root())  # a folder of this test run, not the project's runs/
