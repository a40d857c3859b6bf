"""Atomic writes: old or new content, never a mix; results readable like a plain write.  Direct
(page-cache-free) writes and reads: the same bytes as plain ones, and plain ones where the file
system refuses O_DIRECT."""
import errno
import os
import stat
import tempfile

import numpy as np
import pytest

from ppvarlen.utils import io as uio
from ppvarlen.utils.io import (BlockFile, DirectAppender, atomic_dir, atomic_write_json,
                               atomic_write_text, block_aligned)


def test_atomic_file_replaces_whole_and_gets_normal_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        path = tmp_path / "sub" / "a.json"
        atomic_write_json(path, {"x": 1})
        atomic_write_text(path, "new\n")
        assert path.read_text() == "new\n"
        # mkstemp would leave 0600: a server running as another user could not read an export
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
        assert [p.name for p in path.parent.iterdir()] == ["a.json"]  # no temp files left
    finally:
        os.umask(old)


def test_atomic_dir_keeps_the_old_directory_when_writing_fails(tmp_path):
    target = tmp_path / "export"
    with atomic_dir(target) as d:
        atomic_write_text(os.path.join(d, "f.txt"), "v1")
    with pytest.raises(RuntimeError):
        with atomic_dir(target) as d:
            atomic_write_text(os.path.join(d, "f.txt"), "v2")
            raise RuntimeError("export failed half-way")
    assert (target / "f.txt").read_text() == "v1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o777 & ~umask


def _direct_works(directory):
    """Whether this file system opens files with O_DIRECT (tmpfs before Linux 6.6 does not)."""
    try:
        fd = os.open(os.path.join(directory, "probe"), os.O_WRONLY | os.O_CREAT | os.O_DIRECT)
    except (AttributeError, OSError):
        return False
    os.close(fd)
    return True


def _pieces(seed=0):
    rng = np.random.default_rng(seed)
    sizes = [0, 1, 4095, 4096, 4097, 3, 20000, 8191, 1, 12289]
    return [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]


def test_direct_appender_writes_exactly_the_bytes_given(tmp_path):
    """Pieces of any size, across the staging buffer's edge: the file is their concatenation,
    its last block cut back to the size written; O_DIRECT is used where the disk takes it."""
    pieces = _pieces()
    out = DirectAppender(str(tmp_path / "rows.bin"), buffer_bytes=8192)
    assert out.direct == _direct_works(tmp_path)
    for piece in pieces:
        out.write(piece)
    out.write(np.arange(5, dtype="<i4"))  # arrays go in by their buffer
    out.close()
    want = b"".join(pieces) + np.arange(5, dtype="<i4").tobytes()
    assert (tmp_path / "rows.bin").read_bytes() == want
    empty = DirectAppender(str(tmp_path / "empty.bin"))
    empty.close()
    assert (tmp_path / "empty.bin").read_bytes() == b""


def test_direct_appender_falls_back_to_plain_writes(tmp_path, monkeypatch):
    """A file system that refuses O_DIRECT at open (EINVAL), or at the first write (here in the
    middle of a piece, with bytes still staged when the next piece comes): the rest is written
    plainly, and no byte is lost or written twice."""
    real_open, real_pwrite = os.open, os.pwrite

    def no_direct_open(path, flags, *mode):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *mode)

    pieces = _pieces(1)
    with monkeypatch.context() as m:
        m.setattr(os, "open", no_direct_open)
        out = DirectAppender(str(tmp_path / "a.bin"), buffer_bytes=8192)
        assert not out.direct
        for piece in pieces:
            out.write(piece)
        out.close()
    assert (tmp_path / "a.bin").read_bytes() == b"".join(pieces)

    refused = []

    def refusing_pwrite(fd, data, at):
        if not refused:
            refused.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, at)

    # the first write out is refused in the middle of the 20000-byte piece
    out = DirectAppender(str(tmp_path / "b.bin"), buffer_bytes=16384)
    if not out.direct:
        pytest.skip("this file system takes no O_DIRECT: the write fallback is not reached")
    with monkeypatch.context() as m:
        m.setattr(os, "pwrite", refusing_pwrite)
        for piece in pieces:
            out.write(piece)
        out.close()
    assert refused and not out.direct
    assert (tmp_path / "b.bin").read_bytes() == b"".join(pieces)


def test_block_file_parts_are_read_back_whole_and_padding_stays_in_its_room(tmp_path,
                                                                          monkeypatch):
    """Parts at block-aligned offsets, written in any order: each reads back as written (a direct
    write pads its last block, inside its own room); plain I/O where O_DIRECT is refused."""
    pieces = [p for p in _pieces(2) if p]
    at, rooms = 0, []
    for piece in pieces:
        rooms.append(at)
        at += block_aligned(len(piece))
    for direct in (True, False):
        file = tempfile.TemporaryFile(dir=tmp_path)
        with monkeypatch.context() as m:
            if not direct:
                m.setattr(os, "open", lambda *a, **k: (_ for _ in ()).throw(
                    OSError(errno.EINVAL, "Invalid argument")))
            spill = BlockFile(file)
        assert (spill.direct is not None) == (direct and _direct_works(tmp_path))
        for k in reversed(range(len(pieces))):
            spill.write_at(pieces[k], rooms[k])
        for k, piece in enumerate(pieces):
            assert bytes(spill.read_at(len(piece), rooms[k])) == piece
        spill.close()


def test_block_aligned():
    assert [block_aligned(n) for n in (0, 1, 4096, 4097)] == [0, 4096, 4096, 8192]
    assert uio.DIRECT_BLOCK == 4096


def _dead_pid():
    import subprocess
    import sys
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_temp_names_carry_their_owner_and_dead_owners_debris_is_reaped(tmp_path):
    mine = tempfile.mkdtemp(prefix=uio.owned_prefix(".tmp-train"), dir=tmp_path)
    assert uio.owner_of(os.path.basename(mine)) == (os.getpid(), uio.HOST_TAG)
    dead = _dead_pid()
    dead_dir = tmp_path / f".tmp-train.pid{dead}.{uio.HOST_TAG}.abc"
    dead_dir.mkdir()
    (dead_dir / "input_ids.bin").write_bytes(b"x" * 100)
    dead_file = tmp_path / f".tmp-metrics.json.pid{dead}.{uio.HOST_TAG}.x1"
    dead_file.write_text("{")
    other_host = tmp_path / f".tmp-train.pid{dead}.00000000.abc"  # a shared disk's other host
    other_host.mkdir()
    no_owner = tmp_path / ".tmp-legacy-abc"
    no_owner.mkdir()
    user_file = tmp_path / f"notes.pid{dead}.{uio.HOST_TAG}.txt"  # not a temp name
    user_file.write_text("keep")
    removed = uio.reap_dead_owners(tmp_path)
    assert sorted(removed) == sorted([str(dead_dir), str(dead_file)])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [os.path.basename(mine), other_host.name, no_owner.name, user_file.name])


def test_a_full_disk_names_the_path_and_leaves_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "metrics.json"
    real_fsync = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(uio.DiskFullError) as e:
        atomic_write_text(path, "x" * 1000)
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert str(path) in str(e.value) and "1,000 bytes needed" in str(e.value)
    assert "bytes free" in str(e.value)
    assert list(tmp_path.iterdir()) == []  # nothing left on the full disk


def test_atomic_dir_keeps_the_old_directory_when_the_swap_fails(tmp_path, monkeypatch):
    target = tmp_path / "best"
    with atomic_dir(target) as d:
        atomic_write_text(os.path.join(d, "step.txt"), "10")
    real_mkdtemp = tempfile.mkdtemp

    def full(*args, prefix="", **kw):
        if prefix.startswith(".old-"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_mkdtemp(*args, prefix=prefix, **kw)

    monkeypatch.setattr(tempfile, "mkdtemp", full)
    with pytest.raises(OSError):
        with atomic_dir(target) as d:
            atomic_write_text(os.path.join(d, "step.txt"), "20")
    assert (target / "step.txt").read_text() == "10"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best"]  # the new one's temp removed


def test_atomic_save_png_keeps_the_old_image_when_drawing_fails(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    path = tmp_path / "plot.png"
    uio.atomic_save_png(fig, path, dpi=50)
    first = path.read_bytes()
    assert first.startswith(b"\x89PNG")

    class Broken:
        def savefig(self, f, **_):
            f.write(b"\x89PNG half")
            raise RuntimeError("renderer died")

    with pytest.raises(RuntimeError):
        uio.atomic_save_png(Broken(), path)
    assert path.read_bytes() == first and os.listdir(tmp_path) == ["plot.png"]
    plt.close(fig)


def test_only_regular_files_are_opened_and_a_fifo_never_blocks(tmp_path):
    """A FIFO without a writer would block a plain open() forever; hashing one would consume
    what its reader needs.  open_regular refuses it at once, naming what it is."""
    fifo, folder, plain = tmp_path / "pipe", tmp_path / "folder", tmp_path / "plain.bin"
    os.mkfifo(fifo)
    folder.mkdir()
    plain.write_bytes(b"abc")
    for path, kind in ((fifo, "a FIFO (named pipe)"), (folder, "a directory")):
        with pytest.raises(OSError) as e:
            uio.sha256_file(path)
        assert e.value.errno == errno.EINVAL and e.value.filename == str(path)
        assert e.value.strerror == f"{kind}, not a regular file"
    assert uio.sha256_file(plain) == \
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"  # sha256("abc")
    with uio.open_regular(plain) as f:  # blocking again, as a plain open() would be
        assert os.get_blocking(f.fileno()) and f.read() == b"abc"
    assert uio.not_regular(stat.S_IFCHR | 0o666) == "a character device"
