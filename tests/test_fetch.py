"""Concurrent range reads (voxjet.io.fetch) against the latency-injecting filesystem: requests
overlap, the memory bound holds, completion may be out of order, failures are retried then
reported with URL and byte range, and a stalled read ends in an error rather than a hang."""

from __future__ import annotations

import os

import pytest
from latency_fs import LatencyFileSystem

from voxjet.io.fetch import FetchConfig, Fetcher, FetchError


@pytest.fixture
def blob(tmp_path):
    data = os.urandom(3 << 20)
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    return str(path), data


def test_whole_file_arrives_intact_with_reads_in_parallel(blob):
    path, data = blob
    fs = LatencyFileSystem(delay_s=0.02)
    cfg = FetchConfig(threads=8, block_bytes=64 << 10, max_bytes_in_flight=1 << 20)
    with Fetcher(fs, cfg) as f:
        assert f.read_file(path) == data
        assert f.peak_bytes_in_flight <= cfg.max_bytes_in_flight
    assert fs.requests == 48 and fs.peak_in_flight == 8  # eight requests overlapped


def test_a_file_is_cut_for_its_share_of_the_threads(blob):
    """Alone, a 3 MiB file is cut so that all 8 threads have a range of it; read side by side
    with another, into half as many, larger ranges (each extra one is a round trip more)."""
    path, data = blob
    for side_by_side, requests in ((1, 8), (2, 4), (8, 3)):  # the last: 1 MiB blocks
        fs = LatencyFileSystem(delay_s=0.0)
        with Fetcher(fs, FetchConfig(threads=8, block_bytes=1 << 20)) as f:
            assert f.read_file(path, side_by_side=side_by_side) == data
        assert fs.requests == requests


def test_files_fetched_side_by_side_share_the_memory_bound(blob):
    from concurrent.futures import ThreadPoolExecutor

    path, data = blob
    fs = LatencyFileSystem(delay_s=0.01)
    cfg = FetchConfig(threads=8, block_bytes=64 << 10, max_bytes_in_flight=256 << 10)
    with Fetcher(fs, cfg) as f, ThreadPoolExecutor(3) as files:
        assert list(files.map(f.read_file, [path] * 3)) == [data] * 3
        # a call always has one request out: the other calls may each pass the bound by a block
        assert f.peak_bytes_in_flight <= cfg.max_bytes_in_flight + 2 * cfg.block_bytes
        assert f._in_flight == 0


def test_one_thread_is_one_request_at_a_time_and_order_can_be_kept(blob):
    path, data = blob
    fs = LatencyFileSystem(delay_s=0.0)
    ranges = [(i * 1000, i * 1000 + 1000) for i in range(50)][::-1]
    with Fetcher(fs, FetchConfig(threads=1)) as f:
        assert [i for i, _ in f.ranges(path, ranges)] == list(range(50))
    assert fs.peak_in_flight == 1
    with Fetcher(LatencyFileSystem(delay_s=0.005), FetchConfig(threads=6, ordered=True)) as f:
        got = list(f.ranges(path, ranges))
    assert [i for i, _ in got] == list(range(50))
    assert all(d == data[a:b] for (_, d), (a, b) in zip(got, ranges, strict=True))


@pytest.mark.parametrize("mode", ["raise", "truncate"])
def test_failed_reads_are_retried(blob, mode):
    path, data = blob
    fs = LatencyFileSystem(delay_s=0.0, fail_every=3, fail_mode=mode)
    with Fetcher(fs, FetchConfig(threads=4, block_bytes=256 << 10, retries=2)) as f:
        assert f.read_file(path) == data
    assert fs.requests > 12  # some reads were repeated


@pytest.mark.parametrize("mode", ["raise", "truncate"])
def test_a_read_that_keeps_failing_names_url_and_bytes(blob, mode):
    path, _ = blob
    fs = LatencyFileSystem(delay_s=0.0, fail_every=1, fail_mode=mode)
    with Fetcher(fs, FetchConfig(threads=2, block_bytes=1 << 20, retries=1)) as f:
        with pytest.raises(FetchError, match=rf"{path}: bytes \d+-\d+ unreadable after 2 tries"):
            f.read_file(path)


def test_a_stalled_read_times_out_instead_of_hanging(blob):
    path, _ = blob
    fs = LatencyFileSystem(delay_s=0.0, stall_s=5.0)
    with Fetcher(fs, FetchConfig(threads=1, block_bytes=1 << 20, timeout_s=0.3)) as f:
        with pytest.raises(FetchError, match=r"bytes 0-1048576 did not arrive within"):
            f.read_file(path)


@pytest.fixture
def s3_endpoint():
    """An S3-compatible server (moto) on loopback; the test is skipped when it cannot start."""
    server_mod = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    pytest.importorskip("s3fs", reason="s3fs is not installed")
    try:
        server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
        server.start()
    except Exception as e:  # no free port, a sandbox without sockets
        pytest.skip(f"cannot start the S3 server: {e}")
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def test_jet_shards_stream_from_s3(s3_endpoint, shards):
    """Shards uploaded to an S3 bucket stream from s3:// with the local stream's batches."""
    import s3fs

    from voxjet.jets.stream import JetStream

    opts = {"key": "test", "secret": "test", "client_kwargs": {"endpoint_url": s3_endpoint}}
    fs = s3fs.S3FileSystem(**opts)
    fs.mkdir("voxjet-test")
    fs.put(str(shards), "voxjet-test/shards", recursive=True)
    local = [b["source"].tolist() for b in JetStream(shards, "train", 32, seed=2,
                                                     block_jets=None).at(0, 0)]  # fmt: skip
    remote = JetStream("s3://voxjet-test/shards", "train", 32, seed=2, storage_options=opts)
    assert [b["source"].tolist() for b in remote.at(0, 0)] == local


def test_a_fetched_file_reads_like_the_file_wherever_its_blocks_end(blob):
    """The file object over the fetched blocks (what h5py opens) reads, seeks and tells like
    the file itself, across block boundaries and past the end."""
    import io

    path, data = blob
    with Fetcher(LatencyFileSystem(delay_s=0.0), FetchConfig(threads=3, block_bytes=1 << 20)) as f:
        got = f.open_file(path)
    ref = io.BytesIO(data)
    for pos, n in (
        (0, 10),
        ((1 << 20) - 3, 7),
        (5, 3 << 20),
        (len(data) - 2, 10),
        (len(data) + 5, 4),
    ):
        for fobj in (got, ref):
            fobj.seek(pos)
        assert got.read(n) == ref.read(n) and got.tell() == ref.tell()
    buf = bytearray(2 << 20)
    got.seek(-(1 << 20), io.SEEK_END)
    assert got.readinto(buf) == 1 << 20 and bytes(buf[: 1 << 20]) == data[-(1 << 20) :]
