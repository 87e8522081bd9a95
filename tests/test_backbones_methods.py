"""Backbones expose feature maps; every registered method has the method shape, gradients and a registry error."""

import pytest
import torch

from dmlstudy.methods import build_method, list_methods
from dmlstudy.models import build_backbone


@pytest.mark.parametrize(
    "name,options,channels",
    [
        ("dml_convnet", {}, 128),
        ("test_resnet", {"output_stride": 16}, 96),
        ("test_vit", {"image_size": 64}, 64),
    ],
)
def test_backbone_feature_map_is_a_4x4_grid_at_64px(name, options, channels):
    backbone = build_backbone(name, **options)
    feature_map = backbone(torch.randn(2, 3, 64, 64))
    assert feature_map.shape == (2, channels, 4, 4)
    assert backbone.num_features == channels


def test_unknown_backbone_suggests_names():
    with pytest.raises(KeyError, match="resnet50"):
        build_backbone("resnet_50")


def test_freeze_bn_keeps_statistics_and_affine_fixed():
    backbone = build_backbone("dml_convnet", freeze_bn=True).train()
    norm = backbone.model.features[1]
    before = norm.running_mean.clone()
    backbone(torch.randn(4, 3, 32, 32) + 3.0)
    assert not norm.training and torch.equal(norm.running_mean, before)
    assert not norm.weight.requires_grad


def test_local_checkpoint_loads_and_ignores_a_classifier(tmp_path):
    source = build_backbone("dml_convnet")
    state = {**source.model.state_dict(), "fc.weight": torch.zeros(10, 128), "fc.bias": torch.zeros(10)}
    path = tmp_path / "weights.pth"
    torch.save(state, path)
    loaded = build_backbone("dml_convnet", checkpoint_path=path)
    for key, value in source.model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[key], value)
    torch.save({"features.0.weight": torch.zeros(1)}, path)
    with pytest.raises(ValueError, match="missing"):
        build_backbone("dml_convnet", checkpoint_path=path)


@pytest.mark.parametrize("name", list_methods())
def test_method_shape_and_gradients(name):
    torch.manual_seed(0)
    method = build_method(name, backbone=build_backbone("dml_convnet"), embedding_dim=32, num_classes=6)
    images, labels = torch.randn(12, 3, 64, 64), torch.arange(6).repeat_interleave(2)
    method.eval()
    embeddings = method(images)
    assert embeddings.shape == (12, 32)
    torch.testing.assert_close(embeddings.norm(dim=1), torch.ones(12))
    method.train()
    loss, parts = method.loss(images, labels)
    assert loss.ndim == 0 and torch.isfinite(loss) and parts
    loss.backward()
    assert method.backbone.model.features[0].weight.grad.abs().sum() > 0
    groups = method.parameter_groups(lr=1e-3, head_lr=1e-2, weight_decay=0.0)
    covered = sum(p.numel() for g in groups for p in g["params"])
    assert covered == sum(p.numel() for p in method.parameters() if p.requires_grad)


def test_unknown_method_lists_valid_names():
    with pytest.raises(KeyError, match="valid names: .*ms"):
        build_method("msx", backbone=build_backbone("dml_convnet"), num_classes=2)
