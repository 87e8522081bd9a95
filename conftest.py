"""Settings for every pytest run under the project root: the unit tests and ``pytest --nbval-lax notebooks``.

nbval starts each notebook's kernel with its own ``KernelManager`` (``nbval.kernel.start_new_kernel``), which
reads no configuration, so its kernels listened on plain TCP and ipykernel logged "Kernel is running over TCP
without encryption". Here nbval's kernel manager gets the study runner's settings (:func:`dmlstudy.study.executor.kernel_config`:
CurveZMQ keys, ``transport_encryption='auto'``), so notebook kernels are set up the same way under nbval as under
``dmlstudy study run``, and the warning is not logged.
"""

from __future__ import annotations

from functools import partial


def pytest_configure(config) -> None:
    try:
        from nbval import kernel
    except ImportError:  # nbval absent: nothing starts notebook kernels
        return
    from dmlstudy.study.executor import kernel_config

    if not isinstance(kernel.KernelManager, partial):
        kernel.KernelManager = partial(kernel.KernelManager, config=kernel_config())
