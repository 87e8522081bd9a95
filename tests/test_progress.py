"""Progress where a person waits: the embedding pass of an evaluation shows a bar over its batches when asked
(a large gallery takes minutes), and stays silent otherwise."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import TensorDataset

from dmlstudy.methods import build_method
from dmlstudy.models import build_backbone
from dmlstudy.train import embed


def test_embedding_shows_a_bar_over_its_batches_only_when_asked(capsys):
    torch.manual_seed(0)
    method = build_method("ms", backbone=build_backbone("dml_convnet"), embedding_dim=16, num_classes=3)
    images = TensorDataset(torch.randn(10, 3, 32, 32), torch.zeros(10, dtype=torch.long))
    quiet = embed(method, images, batch_size=4)
    assert capsys.readouterr().err == ""
    shown = embed(method, images, batch_size=4, progress=True)
    bar = capsys.readouterr().err
    assert "embedding 10 images" in bar and "/3 " in bar  # a bar over ⌈10 / 4⌉ batches (how far it got before
    # tqdm cleared it depends on the machine's speed, so only its total is checked)
    np.testing.assert_allclose(shown, quiet, atol=1e-6)
