"""``dmlstudy data fetch``: a CUB-200-2011 archive in the official layout, served from 127.0.0.1 by ``http.server``,
is downloaded (resumed, refused, cut off), verified, unpacked and read by the ``cub200`` reader; the benchmarks
without a published URL and checksum say where to get them."""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import io
import tarfile
import threading
from pathlib import Path

import pytest

from dmlstudy import cli
from dmlstudy.data import build_dataset
from dmlstudy.data import fetch as fetching
from tests.fixtures_layouts import write_cars, write_cub

SERVER_LIFETIME_S = 60.0  # the server shuts itself down after this even if a test hangs


def _tgz(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture(scope="module")
def cub_archive(tmp_path_factory) -> tuple[bytes, list]:
    """A ``CUB_200_2011.tgz`` as published: ``CUB_200_2011/`` beside ``attributes.txt`` at the top level."""
    source = tmp_path_factory.mktemp("cub_source")
    base, records = write_cub(source, images_per_class=[3, 2, 4, 3], stray=False)
    files = {"attributes.txt": b"1 has_bill_shape::curved\n"}
    files |= {f"CUB_200_2011/{p.relative_to(base).as_posix()}": p.read_bytes() for p in base.rglob("*") if p.is_file()}
    return _tgz(files), records


class Mirror(http.server.ThreadingHTTPServer):
    """Serves ``payload`` at any path; ``Range: bytes=N-`` answered with 206 unless ``ignore_range``; ``cut_at``:
    the response announces the full length but the connection closes after that many bytes of the file."""

    daemon_threads = True

    def __init__(self, payload: bytes) -> None:
        super().__init__(("127.0.0.1", 0), MirrorHandler)
        self.payload = payload
        self.ignore_range = False
        self.cut_at: int | None = None
        self.requests: list[str | None] = []  # the Range header of each request (None: none)
        self.sent = 0  # bytes of the file sent, over all requests

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/CUB_200_2011.tgz"


class MirrorHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        server: Mirror = self.server  # type: ignore[assignment]
        asked = self.headers.get("Range")
        server.requests.append(asked)
        start = int(asked.removeprefix("bytes=").rstrip("-")) if asked and not server.ignore_range else 0
        if start >= len(server.payload) > 0:
            self.send_response(416)
            self.end_headers()
            return
        body = server.payload[start:]
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(server.payload) - 1}/{len(server.payload)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if server.cut_at is not None:
            body = body[: max(0, server.cut_at - start)]
            self.close_connection = True
        self.wfile.write(body)
        server.sent += len(body)

    def log_message(self, format, *args) -> None:  # noqa: A002 - http.server's signature
        pass


@pytest.fixture
def mirror(cub_archive, monkeypatch):
    """The archive served on 127.0.0.1, and ``cub200``'s published MD5 replaced by the test archive's."""
    payload, _ = cub_archive
    server = Mirror(payload)
    published = fetching.BENCHMARKS["cub200"]
    archive = dataclasses.replace(published.archive, md5=hashlib.md5(payload).hexdigest())
    monkeypatch.setitem(fetching.BENCHMARKS, "cub200", dataclasses.replace(published, archive=archive))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    watchdog = threading.Timer(SERVER_LIFETIME_S, server.shutdown)
    watchdog.daemon = True
    watchdog.start()
    yield server
    watchdog.cancel()
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def _fetch(root: Path, server: Mirror, **kwargs) -> Path:
    return fetching.fetch("cub200", root, url=server.url, progress=False, echo=lambda *a, **k: None, **kwargs)


def _tree(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) if root.exists() else []


def test_a_download_is_verified_unpacked_and_read_by_the_cub_reader(mirror, cub_archive, tmp_path):
    _, records = cub_archive
    folder = _fetch(tmp_path, mirror)
    assert folder == tmp_path / "cub200"
    for split in ("train", "test"):
        dataset = build_dataset("cub200", folder, split)
        expected = sorted(r.path.relative_to(r.path.parents[2]).as_posix() for r in records if r.split == split)
        assert sorted(p.relative_to(folder / "CUB_200_2011").as_posix() for p in dataset.paths) == expected
    assert [p.name for p in folder.iterdir()] == ["CUB_200_2011"], "no archive, .part or unpacking folder is left"
    assert mirror.requests == [None] and mirror.sent == len(mirror.payload)
    _fetch(tmp_path, mirror)  # in place: read, not downloaded again
    assert mirror.requests == [None]


def test_the_mirror_url_can_come_from_the_environment(mirror, tmp_path, monkeypatch):
    monkeypatch.setenv("DMLSTUDY_CUB200_URL", mirror.url)
    lines = []
    fetching.fetch("cub200", tmp_path, progress=False, echo=lines.append)
    assert mirror.requests == [None] and lines[0] == f"cub200: downloading {mirror.url} into {tmp_path / 'cub200'}"
    assert lines[-1].startswith(f"cub200: in place at {tmp_path / 'cub200'} (train 5 images / 2 classes, test 7 images")


@pytest.mark.parametrize("ignore_range", [False, True], ids=["range", "server-ignores-range"])
def test_a_partial_download_resumes_and_completes(mirror, tmp_path, ignore_range):
    mirror.ignore_range = ignore_range
    kept = len(mirror.payload) // 3
    (tmp_path / "cub200").mkdir()
    (tmp_path / "cub200" / "CUB_200_2011.tgz.part").write_bytes(mirror.payload[:kept])
    folder = _fetch(tmp_path, mirror)
    assert mirror.requests == [f"bytes={kept}-"]
    assert mirror.sent == (len(mirror.payload) if ignore_range else len(mirror.payload) - kept)
    assert len(build_dataset("cub200", folder, "test")) == 7
    assert _tree(folder)[0] == "CUB_200_2011" and not list(folder.glob("*.part"))


def test_a_cut_off_transfer_keeps_what_arrived_and_the_next_call_resumes_it(mirror, tmp_path):
    cut = len(mirror.payload) // 2
    mirror.cut_at = cut
    with pytest.raises(fetching.FetchError, match=rf"after {cut:,} of {len(mirror.payload):,} bytes.*resumes"):
        _fetch(tmp_path, mirror)
    part = tmp_path / "cub200" / "CUB_200_2011.tgz.part"
    assert _tree(tmp_path) == ["cub200", "cub200/CUB_200_2011.tgz.part"], "no dataset folder, nothing unpacked"
    assert part.read_bytes() == mirror.payload[:cut]
    with pytest.raises(fetching.DatasetLayoutError):  # the reader does not mistake the folder for the dataset
        build_dataset("cub200", tmp_path / "cub200", "train")
    mirror.cut_at = None
    _fetch(tmp_path, mirror)
    assert mirror.requests == [None, f"bytes={cut}-"]
    assert len(build_dataset("cub200", tmp_path / "cub200", "train")) == 5


@pytest.mark.parametrize("served", ["other bytes", "truncated file"])
def test_a_wrong_checksum_deletes_the_download_and_leaves_no_folder(mirror, tmp_path, served):
    if served == "truncated file":  # the mirror's copy is short but announces its own length: only the MD5 can tell
        mirror.payload = mirror.payload[: len(mirror.payload) // 2]
    else:
        mirror.payload = mirror.payload[::-1]
    with pytest.raises(fetching.FetchError, match=r"wrong checksum, MD5 [0-9a-f]{32} .*expected .*deleted"):
        _fetch(tmp_path, mirror)
    assert _tree(tmp_path) == [], "neither the download, nor the dataset folder it created, is left"


def test_an_archive_that_is_not_the_dataset_is_never_renamed_into_place(mirror, cub_archive, tmp_path, monkeypatch):
    payload, _ = cub_archive
    with tarfile.open(fileobj=io.BytesIO(payload)) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    lost = next(name for name in files if name.endswith(".jpg"))
    mirror.payload = _tgz({name: data for name, data in files.items() if name != lost})
    published = fetching.BENCHMARKS["cub200"]
    archive = dataclasses.replace(published.archive, md5=hashlib.md5(mirror.payload).hexdigest())
    monkeypatch.setitem(fetching.BENCHMARKS, "cub200", dataclasses.replace(published, archive=archive))
    with pytest.raises(fetching.FetchError, match=r"(?s)not the dataset.*1 of \d+ listed images are missing.*kept"):
        _fetch(tmp_path, mirror)
    assert _tree(tmp_path) == ["cub200", "cub200/CUB_200_2011.tgz"], "only the verified archive, nothing unpacked"


def test_an_archive_reaching_outside_its_folder_is_refused(mirror, tmp_path, monkeypatch):
    mirror.payload = _tgz({"../outside.txt": b"x", "CUB_200_2011/images.txt": b""})
    published = fetching.BENCHMARKS["cub200"]
    archive = dataclasses.replace(published.archive, md5=hashlib.md5(mirror.payload).hexdigest())
    monkeypatch.setitem(fetching.BENCHMARKS, "cub200", dataclasses.replace(published, archive=archive))
    with pytest.raises(fetching.FetchError, match="unpacking"):
        _fetch(tmp_path / "data", mirror)
    assert _tree(tmp_path) == ["data", "data/cub200", "data/cub200/CUB_200_2011.tgz"]


def test_a_folder_in_place_that_does_not_read_is_left_alone(mirror, tmp_path):
    broken = tmp_path / "cub200" / "CUB_200_2011"
    broken.mkdir(parents=True)
    (broken / "images.txt").write_text("1 a/b.jpg\n")
    with pytest.raises(fetching.FetchError, match=r"(?s)does not read as cub200; it is left as it is.*missing file"):
        _fetch(tmp_path, mirror)
    assert mirror.requests == [] and _tree(tmp_path) == [
        "cub200",
        "cub200/CUB_200_2011",
        "cub200/CUB_200_2011/images.txt",
    ]


def test_an_unknown_name_lists_the_benchmarks():
    with pytest.raises(ValueError, match="unknown benchmark 'cub'; valid: cub200, cars196, sop, inshop"):
        fetching.fetch("cub", "/nonexistent")


def test_the_command_says_where_to_get_cars196_and_where_it_goes(tmp_path, capsys):
    status = cli.main(["data", "fetch", "cars196", "--data-root", str(tmp_path)])
    out = capsys.readouterr().out
    assert status == 1
    assert "Stanford Cars" in out and "Where to get it: the Stanford AI Lab's Cars Dataset page" in out
    assert f"Put it in: {tmp_path.resolve() / 'cars196'}/" in out
    assert fetching.CARS_LAYOUT in out and "no stable URL with a checksum" in out
    assert _tree(tmp_path) == [], "nothing is created"


@pytest.mark.parametrize("name", ["sop", "inshop"])
def test_every_benchmark_without_a_download_names_its_page_folder_and_layout(name, tmp_path):
    with pytest.raises(fetching.NotDownloadable) as raised:
        fetching.fetch(name, tmp_path)
    bench = fetching.BENCHMARKS[name]
    assert bench.archive is None
    text = str(raised.value)
    assert bench.where in text and bench.layout in text and str(tmp_path.resolve() / bench.folder) in text


def test_a_benchmark_put_in_place_by_hand_is_read(tmp_path, capsys):
    _, records = write_cars(tmp_path / "cars196", images_per_class=[2, 3, 2, 3])
    assert cli.main(["data", "fetch", "cars196", "--data-root", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith(f"cars196: in place at {tmp_path / 'cars196'} (train 5 images / 2")


def test_the_command_downloads_cub200_from_a_mirror(mirror, tmp_path, capsys):
    assert cli.main(["data", "fetch", "cub200", "--data-root", str(tmp_path), "--url", mirror.url]) == 0
    out = capsys.readouterr().out
    assert "verified; unpacking" in out and f"cub200: in place at {tmp_path / 'cub200'}" in out
    assert (tmp_path / "cub200" / "CUB_200_2011" / "images.txt").is_file()


def test_the_command_line_help_names_every_benchmark(capsys):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["data", "fetch", "--help"])
    shown = capsys.readouterr().out
    assert all(name in shown for name in fetching.BENCHMARKS)
