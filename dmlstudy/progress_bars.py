"""Progress bars that leave nothing behind once they are done (``leave=False``), on a terminal and in a notebook.

On a terminal, tqdm's ``leave=False`` erases the bar's line. In a notebook, ``tqdm.auto`` draws a widget and, when
the bar closes, only hides it: the cell's saved output still holds a widget view whose model is gone once the
kernel is, so a notebook saved and opened again shows "Error displaying widget: model not found" for every bar
that was ever shown. :func:`transient_bar` draws the same widget while the work runs and, when it ends, replaces
its output by an empty one; a bar that ends early (an error, an interrupt) stays, red, to show where it stopped.

Every bar of the package passes its ``disable`` through :func:`disabled`, so tqdm's own ``TQDM_DISABLE`` turns all of
them off, also those that set ``disable`` themselves (tqdm reads the variable only for bars that do not): the
notebook kernels under nbval run so, their outputs compared with kept ones.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

from tqdm.auto import tqdm as auto_tqdm


def _in_notebook_kernel() -> bool:
    """Whether ``tqdm.auto`` draws widgets here (an IPython kernel with ipywidgets): its bar is then the notebook
    bar, which ``tqdm.auto`` imported."""
    notebook = sys.modules.get("tqdm.notebook")
    return notebook is not None and issubclass(auto_tqdm, notebook.tqdm_notebook)


DISABLE_VARIABLE = "TQDM_DISABLE"  # tqdm's switch for every bar


def disabled(disable: bool | None) -> bool | None:
    """A bar's ``disable``: True when ``$TQDM_DISABLE`` says so (1, true, yes), else ``disable`` as given."""
    return True if os.environ.get(DISABLE_VARIABLE, "").strip().lower() in {"1", "true", "yes"} else disable


def transient_bar(*args: Any, **kwargs: Any):
    """``tqdm.auto.tqdm(*args, leave=False, **kwargs)`` whose notebook widget leaves no output once it completes."""
    kwargs["leave"] = False
    kwargs["disable"] = disabled(kwargs.get("disable", False))
    if not _in_notebook_kernel():
        return auto_tqdm(*args, **kwargs)
    return _transient_notebook_bar_class()(*args, **kwargs)


@functools.cache
def _transient_notebook_bar_class() -> type:
    """Built on first use, in a notebook kernel: ``tqdm.notebook`` imports ipywidgets."""
    from IPython.display import display
    from tqdm.notebook import tqdm as notebook_tqdm

    class TransientNotebookBar(notebook_tqdm):
        """tqdm's notebook bar shown through a display handle, so that closing it can empty its output."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["display"] = False
            kwargs["delay"] = 0
            self._handle = None
            super().__init__(*args, **kwargs)
            if not self.disable:
                self._handle = display(self.container, display_id=True)
                self.displayed = True

        def close(self) -> None:
            if self.disable:
                return
            handle, self._handle = self._handle, None
            completed = not (self.total and self.n < self.total)
            super().close()
            if handle is not None and completed:
                handle.update({"text/plain": ""}, raw=True)

    return TransientNotebookBar
