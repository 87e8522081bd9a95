"""Checks of a training run's numbers as they appear: a non-finite loss or input batch stops it, a first epoch
whose loss has not moved warns (:class:`TrainingWatch`)."""

from __future__ import annotations

import numpy as np
import torch

from dmlstudy.data.tensor_cache import BatchAugmentedTrain
from dmlstudy.run import guard, identity


class TrainingWatch:
    """Numbers that cannot be right, caught where they appear.

    * A non-finite loss or input batch stops the run at the batch that produced it; the message names the
      non-finite images (training-set index and file), or the whole batch when every image is finite. The
      inputs are checked on the file pipeline only: the tensor pipeline augments cached ``uint8`` pixels,
      which cannot be non-finite.
    * A first epoch whose loss has not moved warns: the mean of its last quarter of steps within
      ``FLAT_TOLERANCE`` (relative) of its first quarter, when there are at least 4 steps. An absurd learning
      rate (``lr=1000``) is also flagged before training by :func:`dmlstudy.run.guard.check_before_loading`.
    """

    FLAT_TOLERANCE = 1e-3

    def __init__(self, run_name: str, lr: float, train, sampler) -> None:
        self.run_name, self.lr, self.train, self.sampler = run_name, lr, train, sampler
        self.first_epoch_losses: list[torch.Tensor] = []  # detached: no device sync per step
        self.first_epoch: int | None = None
        self.check_inputs = not isinstance(train, BatchAugmentedTrain)

    def _batch_indices(self, step: int) -> list[int]:
        for number, batch in enumerate(self.sampler):  # the sampler is a pure function of (seed, epoch)
            if number == step:
                return list(batch)
        return []

    def observe(self, loss: torch.Tensor, images: torch.Tensor, *, epoch: int, step: int) -> None:
        # the inputs are checked too: a loss with mining can stay finite on NaN images while its gradient is not
        finite = torch.isfinite(loss)
        if self.check_inputs:
            finite = finite & torch.isfinite(images).all()
        if not bool(finite):
            indices = self._batch_indices(step)
            bad_rows = (~torch.isfinite(images.reshape(len(images), -1)).all(dim=1)).nonzero().flatten().tolist()
            if bad_rows and indices:
                culprit = f"non-finite values in the input images {guard.describe_items(self.train, [indices[r] for r in bad_rows][:8])}"
            else:
                culprit = f"the inputs are finite; the batch was {guard.describe_items(self.train, indices[:8])}{' …' if len(indices) > 8 else ''}"
            what = (
                f"the loss became {loss.item()}"
                if not torch.isfinite(loss)
                else "a training batch holds non-finite values"
            )
            raise FloatingPointError(f"run {self.run_name}: {what} at epoch {epoch + 1}, step {step + 1}: {culprit}")
        if self.first_epoch is None:
            self.first_epoch = epoch  # the first epoch this process trains (a resumed run: the one it resumes at)
        if epoch == self.first_epoch:
            self.first_epoch_losses.append(loss.detach())

    def end_epoch(self, epoch: int) -> None:
        if epoch != self.first_epoch or len(self.first_epoch_losses) < 4:
            return
        losses = torch.stack(self.first_epoch_losses).float().cpu().tolist()
        quarter = len(losses) // 4
        first, last = float(np.mean(losses[:quarter])), float(np.mean(losses[-quarter:]))
        if abs(last - first) <= self.FLAT_TOLERANCE * max(abs(first), 1e-12):
            identity.warn(
                f"run {self.run_name}: the loss did not move over epoch {epoch + 1} "
                f"({first:.6g} → {last:.6g} over {len(losses)} steps); check lr={self.lr:g} and the data"
            )
