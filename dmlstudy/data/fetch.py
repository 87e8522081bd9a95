"""``dmlstudy data fetch <name>``: download a real benchmark where its publisher gives a stable URL and a checksum,
else say where to get it, which layout the reader expects and which folder to put it in.

Downloaded: ``cub200``, CUB-200-2011 ("The Caltech-UCSD Birds-200-2011 Dataset", Wah et al., 2011) from its
publisher's repository, CaltechDATA, with the MD5 published for that archive. The other benchmarks have no such
URL: Stanford Cars' download links have been unreachable since 2023, and Stanford Online Products and In-Shop are
distributed from project pages and cloud-drive folders without checksums, so :func:`instructions` names the page.

What a download guarantees:

* **Resumable.** Bytes go to ``<archive>.part``; an interrupted or truncated transfer keeps what arrived and the
  next call asks for the rest (HTTP ``Range``). A server that ignores ``Range`` sends everything again.
* **Verified.** The complete file's MD5 must be the published one; otherwise the file is deleted and the error
  says so (a resume can only append to a corrupt prefix, so nothing of it is kept).
* **Nothing half-written.** The archive is unpacked into a hidden temporary folder beside the target, read by the
  dataset's own reader (both splits, every listed image present), and only then renamed into place, one
  ``os.rename`` on one file system. A failure at any step removes the temporary folder; the dataset folder
  appears complete or not at all. The archive is deleted after a successful unpack.

A folder already in place is read, never downloaded again or replaced; one that the reader refuses is left for
the user to move (the error names it).

The download URL can be replaced (``--url``, or ``DMLSTUDY_<NAME>_URL``, e.g. ``DMLSTUDY_CUB200_URL``) to use a
mirror; the checksum cannot.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dmlstudy.data.base import DatasetLayoutError, build_dataset
from dmlstudy.data.cars import CARS_LAYOUT
from dmlstudy.data.cub import CUB_DIR, CUB_LAYOUT
from dmlstudy.data.inshop import INSHOP_LAYOUT
from dmlstudy.data.sop import SOP_DIR, SOP_LAYOUT
from dmlstudy.progress_bars import disabled

CHUNK_BYTES = 1 << 20
TIMEOUT_S = 60.0  # per socket operation, not for the whole transfer


class FetchError(RuntimeError):
    """A download failed, or its file or archive is wrong; the message says what was kept or removed."""


class NotDownloadable(FetchError):
    """The benchmark has no stable URL with a published checksum; the message is :func:`instructions`."""


@dataclass(frozen=True)
class Archive:
    """A published archive: where it is, its MD5, and the folder inside it that the reader reads."""

    url: str
    md5: str
    member: str  # top-level folder of the archive that becomes <data_root>/<name>/<member>


@dataclass(frozen=True)
class Benchmark:
    """A real benchmark: what it is, where its publisher offers it, and where the reader wants it."""

    name: str
    title: str  # the dataset and the paper that introduced it
    where: str  # the publisher's page, by name, and the files to take from it
    folder: str  # under <data_root>: what the reader is given (the dataset's root)
    layout: str  # the reader's expected tree
    archive: Archive | None = None  # None: no stable URL with a published checksum
    splits: tuple[str, ...] = ("train", "test")  # what the reader reads: every split must read

    def url_variable(self) -> str:
        return f"DMLSTUDY_{self.name.upper()}_URL"


BENCHMARKS: dict[str, Benchmark] = {
    "cub200": Benchmark(
        "cub200",
        'CUB-200-2011, "The Caltech-UCSD Birds-200-2011 Dataset" (Wah et al., 2011)',
        "CaltechDATA, the Caltech data repository, record 65de6-vp158: the file CUB_200_2011.tgz",
        "cub200",
        CUB_LAYOUT,
        Archive(
            url="https://data.caltech.edu/records/65de6-vp158/files/CUB_200_2011.tgz",
            md5="97eceeb196236b17998738112f37df78",
            member=CUB_DIR,
        ),
    ),
    "cars196": Benchmark(
        "cars196",
        'Stanford Cars, "3D Object Representations for Fine-Grained Categorization" (Krause et al., 2013)',
        "the Stanford AI Lab's Cars Dataset page (its download links have been unreachable since 2023; ask the "
        "authors or use a copy you trust): cars_annos.mat and car_ims.tgz, unpacked into car_ims/",
        "cars196",
        CARS_LAYOUT,
    ),
    "sop": Benchmark(
        "sop",
        'Stanford Online Products, "Deep Metric Learning via Lifted Structured Feature Embedding" (Oh Song et '
        "al., CVPR 2016)",
        "the paper's project page at Stanford's Computational Vision and Geometry Lab: Stanford_Online_Products.zip",
        f"sop/{SOP_DIR}",
        SOP_LAYOUT,
    ),
    "inshop": Benchmark(
        "inshop",
        'In-shop Clothes Retrieval of DeepFashion, "DeepFashion: Powering Robust Clothes Recognition and Retrieval '
        'with Rich Annotations" (Liu et al., CVPR 2016)',
        "the DeepFashion page of the Multimedia Laboratory, The Chinese University of Hong Kong, In-shop Clothes "
        "Retrieval Benchmark: Eval/list_eval_partition.txt and Img/img.zip (unpacked into Img/img/)",
        "inshop",
        INSHOP_LAYOUT,
        splits=("train", "query", "gallery"),
    ),
}


def benchmark(name: str) -> Benchmark:
    if name not in BENCHMARKS:
        raise ValueError(f"dmlstudy data fetch: unknown benchmark {name!r}; valid: {', '.join(BENCHMARKS)}")
    return BENCHMARKS[name]


def instructions(name: str, data_root: str | Path) -> str:
    """Where to get ``name``, where to put it and the layout its reader expects (several lines)."""
    bench = benchmark(name)
    why = (
        "downloaded by `dmlstudy data fetch`"
        if bench.archive
        else "not downloaded by dmlstudy: its publisher gives no stable URL with a checksum"
    )
    return (
        f"{name}: {bench.title}, is {why}.\n"
        f"Where to get it: {bench.where}.\n"
        f"Put it in: {Path(data_root).expanduser().resolve() / bench.folder}/\n"
        f"Expected layout (what the {name} reader reads):\n{bench.layout}\n"
        "Then the same command checks it."
    )


def present(name: str, data_root: str | Path) -> str:
    """A line with the split sizes when ``<data_root>/<name>`` reads as the dataset, else ``""`` (nothing there).
    A folder that is there but does not read raises the reader's :class:`DatasetLayoutError`."""
    root = Path(data_root).expanduser() / name
    if not root.exists():
        return ""
    splits = {split: build_dataset(name, root, split) for split in benchmark(name).splits}
    sizes = ", ".join(f"{split} {len(d):,} images / {d.num_classes:,} classes" for split, d in splits.items())
    return f"{name}: in place at {root} ({sizes})"


# ----------------------------------------------------------------------------------------------
# Download
# ----------------------------------------------------------------------------------------------
def md5_file(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _open(url: str, offset: int, timeout: float) -> http.client.HTTPResponse | None:
    """The response for ``url`` from byte ``offset`` on; None when the server says there is nothing past it (416)."""
    request = urllib.request.Request(url, headers={"User-Agent": "dmlstudy"})
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    try:
        return urllib.request.urlopen(request, timeout=timeout)  # noqa: S310 - an http(s) URL the user or the table gave
    except urllib.error.HTTPError as error:
        if error.code == 416 and offset:
            return None
        raise FetchError(f"downloading {url}: HTTP {error.code} {error.reason}") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise FetchError(f"downloading {url}: cannot connect ({reason}); nothing more was written") from None


def download(url: str, target: Path, *, md5: str, progress: bool = True, timeout: float = TIMEOUT_S) -> Path:
    """Download ``url`` to ``target`` through ``<target>.part`` (resumed from its size), check its MD5, and
    rename it to ``target``. A transfer that stops early keeps the ``.part`` file and raises :class:`FetchError`
    saying that the same command resumes; a wrong MD5 deletes it and raises."""
    from tqdm.auto import tqdm

    if target.exists():  # downloaded and verified before, then kept or left by a failed unpack
        if md5_file(target) == md5:
            return target
        target.unlink()
    part = target.with_name(target.name + ".part")
    offset = part.stat().st_size if part.exists() else 0
    response = _open(url, offset, timeout)
    if response is not None:
        with response:
            if offset and response.status != 206:  # the server ignored Range: it sends the whole file
                offset = 0
            length = response.headers.get("Content-Length")
            expected = offset + int(length) if length is not None else None
            received = offset
            with (
                open(part, "ab" if offset else "wb") as handle,
                tqdm(
                    total=expected,
                    initial=offset,
                    unit="B",
                    unit_scale=True,
                    unit_divisor=1024,
                    desc=target.name,
                    disable=disabled(not progress),
                ) as bar,
            ):
                try:
                    while chunk := response.read(CHUNK_BYTES):
                        handle.write(chunk)
                        received += len(chunk)
                        bar.update(len(chunk))
                except (http.client.IncompleteRead, OSError) as error:
                    stopped = f"the transfer broke off ({type(error).__name__})"
                else:
                    stopped = "" if expected is None or received >= expected else "the server closed the connection"
            if stopped:
                of = f"{expected:,}" if expected is not None else "an unknown number of"
                raise FetchError(
                    f"downloading {url}: {stopped} after {received:,} of {of} bytes; they are kept in {part}, and "
                    "the same command resumes from there"
                )
    actual = md5_file(part)
    if actual != md5:
        size = part.stat().st_size
        part.unlink()
        raise FetchError(
            f"downloading {url}: wrong checksum, MD5 {actual} of {size:,} bytes, expected {md5}; the file was "
            "deleted. The same command downloads it anew; if it fails again the URL does not serve the published "
            "archive"
        )
    part.replace(target)
    return target


# ----------------------------------------------------------------------------------------------
# Unpacking
# ----------------------------------------------------------------------------------------------
def _extract(archive: Path, into: Path) -> None:
    """Extract ``archive`` into ``into`` under tarfile's ``data`` filter: members or links that would reach outside
    it, and devices, are refused."""
    try:
        with tarfile.open(archive, "r:*") as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(into, filter="data")
                return
            for member in tar.getmembers():  # Python < 3.10.12: the same rules, by hand
                path = (into / member.name).resolve()
                if not (member.isfile() or member.isdir()) or not path.is_relative_to(into.resolve()):
                    raise FetchError(f"unpacking {archive}: refused member {member.name!r} (link, device or outside)")
            tar.extractall(into)  # noqa: S202 - every member checked above
    except (tarfile.TarError, EOFError, OSError) as error:
        raise FetchError(f"unpacking {archive}: {error}") from None


def unpack(archive: Path, target: Path, *, member: str, check: Callable[[Path], None]) -> Path:
    """Unpack ``archive`` beside ``target``, ``check`` its ``member`` folder (raises when it is not the dataset),
    and rename that folder to ``target``; the temporary folder goes in every case."""
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.unpacking-", dir=target.parent))
    try:
        _extract(archive, scratch)
        unpacked = scratch / member
        if not unpacked.is_dir():
            found = sorted(p.name for p in scratch.iterdir())
            raise FetchError(f"unpacking {archive}: no folder {member}/ at its top level (found {found})")
        try:
            check(unpacked)
        except DatasetLayoutError as error:
            raise FetchError(f"unpacking {archive}: the unpacked folder is not the dataset: {error}") from None
        os.rename(unpacked, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


# ----------------------------------------------------------------------------------------------
# dmlstudy data fetch
# ----------------------------------------------------------------------------------------------
def fetch(
    name: str,
    data_root: str | Path,
    *,
    url: str = "",
    progress: bool = True,
    keep_archive: bool = False,
    timeout: float = TIMEOUT_S,
    echo: Callable[..., object] = print,
) -> Path:
    """Put benchmark ``name`` into ``<data_root>/<name>`` and return that folder.

    Already there and readable: nothing is downloaded. Not downloadable (no :class:`Archive`): raises
    :class:`NotDownloadable` with :func:`instructions`. Else download (``url``, then ``DMLSTUDY_<NAME>_URL``, then the
    published URL), verify, unpack and check it (module docstring)."""
    bench = benchmark(name)
    root = Path(data_root).expanduser()
    folder = root / name
    try:
        found = present(name, root)
    except DatasetLayoutError as error:
        if bench.archive is None or (folder / bench.archive.member).exists():
            raise FetchError(
                f"{folder} is there but does not read as {name}; it is left as it is: move it away (or complete it) "
                f"and run again.\n{error}"
            ) from None
        found = ""  # nothing of the dataset yet (a download in progress leaves only its .part file)
    if found:
        echo(found)
        return folder
    if bench.archive is None:
        raise NotDownloadable(instructions(name, root))
    archive = bench.archive
    source = url or os.environ.get(bench.url_variable(), "") or archive.url
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / archive.member
    file = folder / Path(archive.url).name
    echo(f"{name}: downloading {source} into {folder}")
    try:
        download(source, file, md5=archive.md5, progress=progress, timeout=timeout)
    except BaseException:
        if created and not any(folder.iterdir()):
            folder.rmdir()
        raise
    echo(f"{name}: MD5 {archive.md5} verified; unpacking")
    try:
        unpack(file, target, member=archive.member, check=lambda path: _read_every_split(name, path))
    except FetchError as error:
        raise FetchError(f"{error}\nThe verified archive is kept: {file}") from None
    if not keep_archive:
        file.unlink()
    echo(present(name, root))
    return folder


def _read_every_split(name: str, path: Path) -> None:
    for split in benchmark(name).splits:
        build_dataset(name, path, split)
