"""Progress bars that leave nothing behind once they are done (``leave=False``), on a terminal and in a notebook.

On a terminal, tqdm's ``leave=False`` erases the bar's line. In a notebook, ``tqdm.auto`` draws a widget and, when
the bar closes, only hides it: the cell's saved output still holds a widget view whose model is gone once the
kernel is, so a notebook saved and opened again shows "Error displaying widget: model not found" for every bar
that was ever shown. :func:`transient_bar` draws the same widget while the work runs and, when it ends, replaces
its output by an empty one; a bar that ends early (an error, an interrupt) stays, red, to show where it stopped.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from tqdm.auto import tqdm as auto_tqdm


def _in_notebook_kernel() -> bool:
    """Whether ``tqdm.auto`` draws widgets here (an IPython kernel with ipywidgets): its bar is then the notebook
    bar, which ``tqdm.auto`` imported."""
    notebook = sys.modules.get("tqdm.notebook")
    return notebook is not None and issubclass(auto_tqdm, notebook.tqdm_notebook)


def transient_bar(*args: Any, **kwargs: Any):
    """``tqdm.auto.tqdm(*args, leave=False, **kwargs)`` whose notebook widget leaves no output once it completes."""
    kwargs["leave"] = False
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
