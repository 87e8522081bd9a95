"""Notebook kernels started by nbval get the study runner's kernel settings (the project's root conftest.py)."""

from __future__ import annotations

import zmq
from nbval import kernel

from dmlstudy.study.executor import kernel_config


def test_nbval_kernel_managers_use_the_runners_settings():
    manager = kernel.KernelManager(kernel_name="python3")
    expected = "auto" if zmq.has("curve") else "disabled"
    assert manager.transport_encryption == expected
    assert kernel_config().get("KernelManager", {}).get("transport_encryption", "disabled") == expected
