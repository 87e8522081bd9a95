"""The checkpoint a run reports, chosen on validation classes while it trains (:class:`CheckpointSelection`), and
the same choice replayed on a finished run's history (:func:`selection_evaluations`, :func:`best_epoch_censored`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import torch

from dmlstudy.methods import Method


class CheckpointSelection:
    """The checkpoint a run reports, chosen on validation classes (Musgrave et al. 2020, §4.2).

    Every evaluation on the validation classes is offered to :meth:`observe`; the state with the highest
    validation R@1 is kept (a tie keeps the earlier epoch), with its epoch, the training seconds up to the end
    of that epoch, and its validation embeddings. After ``patience`` evaluations without a higher value the
    run stops (``stopped``); ``patience = 0`` never stops early. The state travels in the epoch checkpoint,
    so a resumed run chooses exactly as the uninterrupted one.

    The evaluations of the first ``warmup_epochs`` epochs are recorded in the history but are neither candidates
    nor steps of patience: the backbone is frozen then, so they score the starting backbone under a half-trained
    head, not the method being fine-tuned, and the dip that unfreezing brings must not end the run. Declared on
    2026-11-26 (``docs/protocol.md``) after one pretrained run had stopped at epoch 3 on its warm-up's validation
    R@1 and reported the warm-up state; until then warm-up evaluations counted like any other.
    """

    def __init__(self, patience: int, warmup_epochs: int = 0) -> None:
        self.patience, self.warmup_epochs = patience, warmup_epochs
        self.value, self.epoch, self.seconds, self.since = float("-inf"), 0, 0.0, 0
        self.state: dict[str, torch.Tensor] | None = None
        self.arrays: dict[str, np.ndarray] = {}
        self.stopped = False

    def observe(
        self, value: float, *, epoch: int, method: Method, trained_seconds: float, arrays: dict[str, np.ndarray]
    ) -> None:
        if epoch <= self.warmup_epochs:
            return
        if value > self.value:
            self.value, self.epoch, self.seconds, self.since = value, epoch, trained_seconds, 0
            self.state = {name: tensor.detach().clone() for name, tensor in method.state_dict().items()}
            self.arrays = arrays
        else:
            self.since += 1
        self.stopped = bool(self.patience) and self.since >= self.patience

    def to_checkpoint(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "epoch": self.epoch,
            "seconds": self.seconds,
            "since": self.since,
            "state": self.state,
            "stopped": self.stopped,
        }

    def load(self, saved: Mapping[str, Any], *, epochs_done: int) -> bool:
        """Restore the choice saved after ``epochs_done`` epochs. A choice of a warm-up epoch was made by the
        rule before 2026-11-26: while the run is still warming up the rule keeps no choice yet, so it is
        dropped; after the warm-up it cannot be remade without the states it passed over, so ``False`` says
        the run must start again."""
        if 0 < saved["epoch"] <= self.warmup_epochs:
            return epochs_done <= self.warmup_epochs
        self.value, self.epoch, self.seconds, self.since = (
            saved["value"],
            saved["epoch"],
            saved["seconds"],
            saved["since"],
        )
        self.state, self.stopped = saved["state"], saved["stopped"]
        return True


def evaluation_column(history: pd.DataFrame, metric: str = "R@1") -> tuple[str, str]:
    """``(column, classes)``: the history column holding ``metric`` at each evaluated epoch and which classes it
    was measured on — ``val_<metric>`` on the validation classes for a run with validation folds, else
    ``metric`` on the test classes."""
    return (f"val_{metric}", "validation") if f"val_{metric}" in history else (metric, "test")


def selection_evaluations(history: pd.DataFrame, warmup_epochs: int = 0, metric: str = "R@1") -> pd.Series:
    """``metric`` at each evaluation a run's reported checkpoint is chosen among, indexed by epoch: the column
    of :func:`evaluation_column` after the first ``warmup_epochs`` epochs (:class:`CheckpointSelection`)."""
    column, _ = evaluation_column(history, metric)
    if column not in history or "epoch" not in history:
        return pd.Series(dtype=float)
    return history.loc[history["epoch"] > warmup_epochs].set_index("epoch")[column].dropna()


def best_epoch_censored(history: pd.DataFrame, patience: int, warmup_epochs: int = 0) -> bool:
    """Whether a run's epochs-to-best (``best_epoch``, ``seconds_to_best``) is right-censored by its epoch cap.

    The run ended with fewer than ``max(patience, 1)`` evaluations after its best one, so
    :class:`CheckpointSelection` never stopped it (with ``patience = 0``: its best was its last evaluation),
    and a longer cap could only have moved its best later: its true epochs-to-best is at least the recorded
    one. Replays the selection on the evaluations it chooses among (:func:`selection_evaluations`: validation
    classes after the warm-up, or the test classes of a run without them, which never stops early, so
    ``patience`` counts as 0); the first maximum is the best, as a tie keeps the earlier epoch. A run with no
    evaluation is not censored.
    """
    _, classes = evaluation_column(history)
    values = selection_evaluations(history, warmup_epochs).to_numpy()
    if not len(values):
        return False
    after_best = len(values) - 1 - int(np.argmax(values))
    return after_best < max(patience if classes == "validation" else 0, 1)
