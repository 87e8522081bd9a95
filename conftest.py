"""Settings for every pytest run under the project root: the unit tests and ``pytest --nbval-lax notebooks``.

nbval starts each notebook's kernel with its own ``KernelManager`` (``nbval.kernel.start_new_kernel``), which
reads no configuration, so its kernels listened on plain TCP and ipykernel logged "Kernel is running over TCP
without encryption". Here nbval's kernel manager gets the study runner's settings (:func:`dmlstudy.study.executor.kernel_config`:
CurveZMQ keys, ``transport_encryption='auto'``), so notebook kernels are set up the same way under nbval as under
``dmlstudy study run``, and the warning is not logged. Its kernels also get
:func:`dmlstudy.experiments.notebooks.kernel_environment`, as the expected outputs they are compared with did: no
progress bars, and runs in an empty folder of this test run, whatever runs the project holds.
"""

from __future__ import annotations

import shutil
import tempfile
from functools import partial
from pathlib import Path


def pytest_configure(config) -> None:
    try:
        from nbval import kernel
    except ImportError:  # nbval absent: nothing starts notebook kernels
        return
    from dmlstudy.experiments.notebooks import kernel_environment
    from dmlstudy.study.executor import kernel_config

    runs = Path(tempfile.mkdtemp(prefix="dmlstudy-nbval-")) / "runs"  # one per test run: notebooks share it, in order
    config.add_cleanup(partial(shutil.rmtree, runs.parent, ignore_errors=True))

    class NotebookKernelManager(kernel.KernelManager):
        def start_kernel(self, **options):
            options["env"] = kernel_environment(runs)
            return super().start_kernel(**options)

    if not isinstance(kernel.KernelManager, partial):
        kernel.KernelManager = partial(NotebookKernelManager, config=kernel_config())
