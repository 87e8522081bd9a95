"""The config of ``notebooks/01_train``: one run, given field by field (:class:`~dmlstudy.run.train.TrainConfig`) or
named as a study's run. With ``study_plan``, the run is that study's run of ``method`` on ``dataset``
with ``seed``, resolved as its comparison trains it (:func:`~dmlstudy.run.protocol.resolve_run`: the
plan's ``protocol:`` block, the regime, the tuned values), so the notebook shows the very run the comparison
reports (the same folder, trained once) and a retune or a protocol change reaches it without editing the
notebook's entry."""

from __future__ import annotations

from dataclasses import dataclass

from dmlstudy.run.protocol import ProtocolConfig, plan_protocol
from dmlstudy.run.train import TrainConfig


@dataclass
class OneRun(TrainConfig):
    """:class:`TrainConfig`'s fields and ``study_plan``."""

    study_plan: str = ""  # a study plan (plans/default.yaml): the run is its run of `method` on `dataset` with `seed` as it resolves it; empty: none

    def resolved(self) -> TrainConfig:
        """The run's :class:`TrainConfig`: these fields, or with ``study_plan`` the study's run, in this notebook's
        ``study`` and ``runs_root`` (the study's own when a plan runs the notebook), each value's origin recorded."""
        if not self.study_plan:
            return TrainConfig(**{name: getattr(self, name) for name in TrainConfig.field_names()})
        protocol = ProtocolConfig(**plan_protocol(self.study_plan) | {"study": self.study, "runs_root": self.runs_root})
        return protocol.train_config(dataset=self.dataset, method=self.method, seed=self.seed, name=self.method)


__all__ = ["OneRun"]
