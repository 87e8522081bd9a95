"""The settings shared by a training run, the protocol of a study and a tuning plan, declared once.

:class:`RunSettings` holds what every run of a comparison must share (backbone, sizes, batch, budget, learning
rate, validation folds, precision, where runs and data live); :class:`StudySettings` adds what a study and a
tuning plan share (datasets, regime, workers). The configs derive from them:

- :class:`~dmlstudy.run.train.TrainConfig` (one run) ← :class:`RunSettings`;
- :class:`~dmlstudy.run.protocol.ProtocolConfig` (a study notebook's ``protocol``) ← :class:`StudySettings`;
- :class:`~dmlstudy.study.tuning.TuneConfig` (a tuning plan) ← :class:`StudySettings`.

Each field's type and description are written here only. A config that starts from another default says so
by restating the field with its default alone, and its description is still this one
(:meth:`~dmlstudy.config.TypedConfig.field_help`): the defaults are CI-sized here and in the protocol, and full-sized
in a tuning plan. Decision: fields whose meaning differs between the configs stay their own (a run's ``seed`` and
``study`` folder, a protocol's ``seeds``, a tuning plan's ``name``, a run's ``validation_fold``, which a study always
sets to 0), so that no field here needs a caveat for one of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dmlstudy.config import TypedConfig
from dmlstudy.run.regimes import regime

AUTOCAST_MODES = ("auto", "bf16", "off")


@dataclass
class RunSettings(TypedConfig):
    """The settings every run of one comparison shares: set once in a study plan's ``protocol:`` block, read by
    its runs and by the trials that tune them."""

    runs_root: str = ""  # default: <project>/runs
    data_root: str = ""  # default: <project>/data; a dataset lives in <data_root>/<dataset>
    backbone: str = "dml_convnet"  # any timm model name (dmlstudy list backbones), the same for every method of a table
    image_size: int = 64  # training crop and test centre-crop size in pixels
    embedding_dim: int = 128  # d, the inference embedding size of every method
    classes_per_batch: int = 16  # P of a P × M class-balanced batch
    samples_per_class: int = 4  # M of a P × M class-balanced batch
    epochs: int = 2  # training epochs; with patience, the cap
    steps_per_epoch: int = 6  # 0: a full pass over the training classes per epoch (len(train) // (P·M) batches)
    train_classes: int = 16  # 0: all training classes; n: only the first n (CI-sized runs)
    test_classes: int = 16  # 0: all test classes; n: only the first n
    lr: float = 4e-3  # learning rate of the backbone and embedding (a row's tuned value replaces it; a tuning search starts from it)
    eval_every: int = 1  # evaluate every n epochs (and after the last): validation classes, else the test classes
    validation_folds: int = 0  # 0: none, test classes evaluated every eval_every epochs; n ≥ 2: the training classes in n class-disjoint folds
    patience: int = 0  # with validation folds: stop after this many evaluations without a better validation R@1 (0: train all epochs)
    autocast: str = "auto"  # precision: auto (bfloat16 on CUDA, float32 on CPU), bf16 or off

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_choice("autocast", AUTOCAST_MODES)


@dataclass
class StudySettings(RunSettings):
    """:class:`RunSettings` and what a study's protocol shares with the plan that tunes its rows (a tuning plan
    reads these from its study plan's ``protocol:`` block: :data:`~dmlstudy.study.tuning.PROTOCOL_FIELDS`)."""

    datasets: list = field(default_factory=lambda: ["synbirds"])  # registered dataset names (dmlstudy list datasets)
    regime: str = "scratch"  # scratch (random init) or pretrained (weights/, frozen BN, lower backbone lr, warm-up): dmlstudy/run/regimes.py
    workers: int = 1  # runs (trials) trained at once, each in its own process with cores // workers threads

    def __post_init__(self) -> None:
        super().__post_init__()
        regime(self.regime, backbone=self.backbone)  # an unknown regime or a backbone its weights do not fit


__all__ = ["AUTOCAST_MODES", "RunSettings", "StudySettings"]
