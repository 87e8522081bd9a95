"""How much the emoji families resemble each other, on raw pixels: the sibling effect the dataset card reports.

For every test image of a build (32 × 32 px, grey, centred and L2-normalised pixels; cosine similarity), its
nearest other image: how often it is the same emoji drawn by family g, for each query family f (a design
lineage shows as a pair (f, g) far above the average pair), and R@1 with and without each query's relative
family (noto ↔ noto-v1, emojione ↔ emojione-v1) in the gallery.

    .venv/bin/python benchmarks/emoji_relatives.py [--data-root data] [--dataset emoji]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

from dmlstudy.data import build_dataset
from dmlstudy.data.emoji import test_split_families
from dmlstudy.data.emoji_sources import RELATIVES
from dmlstudy.metrics import relative_mask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", default="data")
    parser.add_argument("--dataset", default="emoji")
    args = parser.parse_args()
    root = Path(args.data_root) / args.dataset
    split = build_dataset(args.dataset, root, "test")
    families = np.asarray(test_split_families(args.dataset, args.data_root))
    labels = np.asarray(split.labels)
    pixels = np.stack(
        [
            np.asarray(Image.open(p).convert("L").resize((32, 32), Image.BILINEAR), np.float32).ravel()
            for p in split.paths
        ]
    )
    pixels -= pixels.mean(axis=1, keepdims=True)
    pixels /= np.maximum(np.linalg.norm(pixels, axis=1, keepdims=True), 1e-6)
    similarity = pixels @ pixels.T
    np.fill_diagonal(similarity, -np.inf)
    nearest = similarity.argmax(axis=1)
    names = sorted(set(families))
    print(f"{args.dataset} test split: {len(labels)} images, {len(set(labels))} classes")
    same_emoji = labels[nearest] == labels
    rates = {
        (f, g): (same_emoji & (families[nearest] == g))[families == f].mean() for f in names for g in names if f != g
    }
    average = np.mean(list(rates.values()))
    print(f"nearest image = the same emoji by family g, average over family pairs: {average:.3f}")
    for (f, g), rate in sorted(rates.items(), key=lambda item: -item[1])[:6]:
        print(f"  {f:>18} query → {g:<18} {rate:.3f} ({rate / average:.1f}× the average pair)")
    for f, g in (("noto-v1", "noto"), ("noto", "noto-v1"), ("emojione", "emojione-v1"), ("emojione-v1", "emojione")):
        print(f"  relatives {f} → {g}: {rates[f, g]:.3f} ({rates[f, g] / average:.1f}×)")
    recall = 100 * same_emoji
    masked = similarity.copy()
    masked[relative_mask(families, relatives=RELATIVES)] = -np.inf
    recall_out = 100 * (labels[masked.argmax(axis=1)] == labels)
    print(
        f"pixel R@1: {recall.mean():.1f} with every family, {recall_out.mean():.1f} with each query's relative family out"
    )
    for f in RELATIVES:
        print(f"  {f} queries: {recall[families == f].mean():.1f} → {recall_out[families == f].mean():.1f}")


if __name__ == "__main__":
    main()
