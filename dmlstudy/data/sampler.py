"""Class-balanced P × M batch sampler (the "P classes × M samples" batches of Hermans et al. 2017),
deterministic per (labels, seed, epoch) and shardable across distributed ranks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch


def _as_label_array(labels: Sequence[int] | np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().cpu().numpy()
    array = np.asarray(labels)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"ClassBalancedBatchSampler: labels must be a non-empty 1-D sequence, got shape {array.shape}")
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"ClassBalancedBatchSampler: labels must be integers, got dtype {array.dtype}")
    return array


class ClassBalancedBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Batches of ``P = classes_per_batch`` distinct classes × ``M = samples_per_class`` indices.

    Each global batch: P classes drawn uniformly without replacement from the classes present in
    ``labels``; for each, M of its indices drawn uniformly, without replacement when the class has at
    least M images and with replacement otherwise. The global batch is laid out class by class
    (``[c1 × M, c2 × M, …]``); rank ``r`` of ``world_size`` receives the contiguous slice
    ``[r·B/W, (r+1)·B/W)`` with ``B = P·M`` (whole classes per rank when ``W`` divides ``P``), so the
    ranks' shares are disjoint and their concatenation in rank order is the ``world_size = 1`` batch.

    Batches are independent draws (an epoch is ``num_batches`` of them, not a pass over the data);
    ``num_batches`` defaults to ``len(labels) // (P·M)``. The sequence depends only on
    ``(labels, P, M, num_batches, seed, epoch)``: the generator is ``numpy.random.default_rng([seed, epoch])``.
    """

    def __init__(
        self,
        labels: Sequence[int] | np.ndarray | torch.Tensor,
        *,
        classes_per_batch: int,
        samples_per_class: int,
        num_batches: int | None = None,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        label_array = _as_label_array(labels)
        classes, inverse = np.unique(label_array, return_inverse=True)
        where = "ClassBalancedBatchSampler"
        if classes_per_batch < 1 or samples_per_class < 1:
            raise ValueError(
                f"{where}: classes_per_batch and samples_per_class must be >= 1, got {classes_per_batch} and {samples_per_class}"
            )
        if classes_per_batch > len(classes):
            raise ValueError(
                f"{where}: labels contain {len(classes)} classes, fewer than classes_per_batch={classes_per_batch}"
            )
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(
                f"{where}: need world_size >= 1 and 0 <= rank < world_size, got rank={rank}, world_size={world_size}"
            )
        batch_size = classes_per_batch * samples_per_class
        if batch_size % world_size:
            raise ValueError(
                f"{where}: the global batch P·M = {classes_per_batch}·{samples_per_class} = {batch_size} is not divisible by world_size={world_size}"
            )
        if num_batches is None:
            num_batches = len(label_array) // batch_size
            if num_batches < 1:
                raise ValueError(
                    f"{where}: {len(label_array)} labels are fewer than one batch of P·M = {batch_size}; pass num_batches explicitly"
                )
        if num_batches < 1:
            raise ValueError(f"{where}: num_batches must be >= 1, got {num_batches}")
        if seed < 0:
            raise ValueError(f"{where}: seed must be >= 0, got {seed}")
        order = np.argsort(inverse, kind="stable")
        self._members: list[np.ndarray] = np.split(order, np.cumsum(np.bincount(inverse))[:-1])
        self.classes = classes
        self.classes_per_batch = classes_per_batch
        self.samples_per_class = samples_per_class
        self.num_batches = int(num_batches)
        self.seed = int(seed)
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0

    @property
    def global_batch_size(self) -> int:
        return self.classes_per_batch * self.samples_per_class

    @property
    def local_batch_size(self) -> int:
        return self.global_batch_size // self.world_size

    def set_epoch(self, epoch: int) -> None:
        """Select the draw of ``epoch`` (call before iterating, as with ``DistributedSampler``)."""
        if epoch < 0:
            raise ValueError(f"ClassBalancedBatchSampler.set_epoch: epoch must be >= 0, got {epoch}")
        self.epoch = int(epoch)

    def _draw_global_batch(self, rng: np.random.Generator) -> np.ndarray:
        """One global batch, ``P·M`` dataset indices laid out class by class."""
        chosen = rng.choice(len(self._members), size=self.classes_per_batch, replace=False)
        m = self.samples_per_class
        blocks = [rng.choice(self._members[c], size=m, replace=len(self._members[c]) < m) for c in chosen]
        return np.concatenate(blocks)

    def __iter__(self) -> Iterator[list[int]]:
        rng = np.random.default_rng([self.seed, self.epoch])
        start = self.rank * self.local_batch_size
        for _ in range(self.num_batches):
            batch = self._draw_global_batch(rng)
            yield batch[start : start + self.local_batch_size].tolist()

    def __len__(self) -> int:
        return self.num_batches
