"""Atomic writes: a reader sees the old file/dir or the new one, never a mix."""
import contextlib
import hashlib
import json
import os
import shutil
import tempfile


def _umask():
    umask = os.umask(0)
    os.umask(umask)
    return umask


def atomic_write_bytes(path, data):
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp makes 0600; the result should look like a plain open(): a server running as
        # another user must be able to read an export directory
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def atomic_write_text(path, text, encoding="utf-8"):
    atomic_write_bytes(path, text.encode(encoding))


def atomic_write_json(path, obj):
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=False) + "\n")


@contextlib.contextmanager
def atomic_dir(final_path):
    """Yield a temp dir next to ``final_path``; on success swap it into place.

    An existing ``final_path`` is replaced only after the new one is complete,
    so an interrupted write never leaves a half-written directory behind.
    """
    final_path = os.path.abspath(os.fspath(final_path))
    parent = os.path.dirname(final_path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-" + os.path.basename(final_path) + "-", dir=parent)
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; the result should look like a normal mkdir
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if os.path.exists(final_path):
        old = tempfile.mkdtemp(prefix=".old-" + os.path.basename(final_path) + "-", dir=parent)
        os.rmdir(old)
        os.replace(final_path, old)
    os.replace(tmp, final_path)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def sha256_file(path):
    with open(path, "rb") as f:  # file_digest reads into one reused buffer
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_all_at(fd, data, at):
    """All of ``data`` written into file ``fd`` at offset ``at`` (``os.pwrite`` may write less)."""
    view = memoryview(data)
    while view:
        done = os.pwrite(fd, view, at)
        view, at = view[done:], at + done


@contextlib.contextmanager
def atomic_text_writer(path, encoding="utf-8"):
    """Yield a text file to write piece by piece; it replaces ``path`` only when the block ends.

    For outputs too big to hold in memory (``atomic_write_text`` takes the whole text);
    an exception leaves ``path`` as it was and removes the partial file.
    """
    with _atomic_writer(path, "w", encoding=encoding, newline="") as f:
        yield f


@contextlib.contextmanager
def atomic_binary_writer(path):
    """``atomic_text_writer`` for bytes (a seekable binary file)."""
    with _atomic_writer(path, "wb") as f:
        yield f


@contextlib.contextmanager
def _atomic_writer(path, mode, **open_keys):
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=d)
    try:
        with os.fdopen(fd, mode, **open_keys) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # as atomic_write_bytes: readable like a plain open()
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise
