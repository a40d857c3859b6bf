"""File writes: atomic ones (a reader sees the old file/dir or the new one, never a mix), and
writes and reads past the page cache with ``O_DIRECT`` (``DirectAppender``, ``BlockFile``).

Every temporary file or directory ppvarlen makes is named by ``owned_prefix``: it carries its
owner's pid and host, so the next run that finds it (``reap_dead_owners``) removes it when its
owner is dead, and leaves a live writer's (another process, or another host on a shared disk)
alone.  A write that finds the disk full raises ``DiskFullError`` naming the path and the bytes
it needed."""
import contextlib
import errno
import fcntl
import hashlib
import json
import mmap
import os
import re
import shutil
import socket
import stat
import tempfile

DIRECT_BLOCK = 4096  # O_DIRECT's alignment of offsets, lengths and memory (a page: safe on any disk)


# the host of a temp name: another host's temp file on a shared disk is never judged by our pids
HOST_TAG = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]
_OWNED = re.compile(r"\.pid(\d+)\.([0-9a-f]{8})\.[^/]*$")


def owned_prefix(name):
    """The prefix of a temp file or directory made for ``name`` by this process (give it to
    ``tempfile.mkstemp`` / ``mkdtemp``): ``<name>.pid<pid>.<host tag>.`` + the random part."""
    return f"{name}.pid{os.getpid()}.{HOST_TAG}."


def owner_of(entry):
    """The (pid, host tag) an ``owned_prefix`` name carries, or None."""
    m = _OWNED.search(entry)
    return (int(m.group(1)), m.group(2)) if m else None


def pid_alive(pid):
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def reap_dead_owners(directory, starts=(".tmp-", ".old-")):
    """Remove the temp files and directories in ``directory`` (names beginning with one of
    ``starts``) whose owner, named by ``owned_prefix``, was a process of this host that is
    gone -> the paths removed.  A name without an owner, or another host's, is left alone."""
    removed = []
    try:
        entries = os.listdir(directory)
    except OSError:
        return removed
    for entry in entries:
        if not entry.startswith(tuple(starts)):
            continue
        owner = owner_of(entry)
        if owner is None or owner[1] != HOST_TAG or pid_alive(owner[0]):
            continue
        path = os.path.join(directory, entry)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        if not os.path.lexists(path):
            removed.append(path)
    return removed


class DiskFullError(OSError):
    """A write found no space left (ENOSPC, or EDQUOT: a quota); the message names the path,
    the bytes it needed (when known) and what is free there.  The writer has removed its
    partial files before this is raised."""

    def __init__(self, path, needed=None, what="writing"):
        free = None
        with contextlib.suppress(OSError):
            probe = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
            free = shutil.disk_usage(probe).free
        amounts = ([f"{needed:,} bytes needed"] if needed is not None else []) \
            + ([f"{free:,} bytes free"] if free is not None else [])
        told = f" ({', '.join(amounts)})" if amounts else ""
        super().__init__(errno.ENOSPC, f"{path}: no space left on the device while {what}{told}; "
                                       f"free some space there, or point the output elsewhere")
        self.path, self.needed, self.free = path, needed, free

    def __str__(self):
        return self.strerror


def is_disk_full(error):
    return isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)


@contextlib.contextmanager
def disk_full_named(path, needed=None, what="writing"):
    """Turn a disk-full ``OSError`` raised in the block into a ``DiskFullError`` for ``path``."""
    try:
        yield
    except DiskFullError:
        raise
    except OSError as e:
        if not is_disk_full(e):
            raise
        raise DiskFullError(path, needed, what) from None


def _umask():
    umask = os.umask(0)
    os.umask(umask)
    return umask


def atomic_write_bytes(path, data):
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=owned_prefix(".tmp-" + os.path.basename(path)), dir=d)
    try:
        with disk_full_named(path, len(data)), os.fdopen(fd, "wb") as f:
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
    tmp = tempfile.mkdtemp(prefix=owned_prefix(".tmp-" + os.path.basename(final_path)), dir=parent)
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; the result should look like a normal mkdir
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    try:
        if os.path.exists(final_path):
            old = tempfile.mkdtemp(prefix=owned_prefix(".old-" + os.path.basename(final_path)),
                                   dir=parent)
            os.rmdir(old)
            os.replace(final_path, old)
        os.replace(tmp, final_path)
    except BaseException:  # the swap failed (a full disk for the .old- name): old kept, new gone
        if old and os.path.exists(old) and not os.path.exists(final_path):
            os.replace(old, final_path)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old:
        shutil.rmtree(old, ignore_errors=True)


def user_cache_dir(*parts):
    """``$XDG_CACHE_HOME/ppvarlen/<parts>`` (``~/.cache`` without it): where the commands keep
    what they can rebuild (encoded-corpus stores, the host's auto choices)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ppvarlen", *parts)


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))


def not_regular(mode):
    """What a file of ``mode`` is when it is not a regular file ("a FIFO (named pipe)", ...)
    -> None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def open_regular(path):
    """``path`` opened for binary reading when it is a regular file; OSError (EINVAL, saying
    what it is) otherwise: reading a FIFO waits for a writer that may never come (a server's
    load hung on one), and hashing a pipe would consume what its reader needs.  Opened without
    blocking and checked on the descriptor: what is read is what was checked."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        kind = not_regular(os.fstat(fd).st_mode)
        if kind is not None:
            raise OSError(errno.EINVAL, f"{kind}, not a regular file", os.fspath(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path, max_bytes, what):
    """The bytes of the regular file ``path`` (``open_regular``); OSError (EFBIG, naming its
    size and the bound) when it holds more than ``max_bytes``: a file read whole into memory
    is bounded by what ``what`` (a manifest, a vocabulary) can need, so a crafted one cannot
    take the process's memory."""
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(max_bytes + 1) if size <= max_bytes else b""
        if size > max_bytes or len(data) > max_bytes:  # grown while read: the same refusal
            raise OSError(errno.EFBIG, f"{max(size, len(data)):,} bytes, more than the "
                                       f"{max_bytes:,} {what} can need", os.fspath(path))
    return data


def sha256_file(path):
    with open_regular(path) as f:  # file_digest reads into one reused buffer
        return hashlib.file_digest(f, "sha256").hexdigest()


class DirectAppender:
    """A new file written front to back, with ``O_DIRECT`` where the file system takes it: the
    bytes go to the disk without a copy in the page cache, which costs more CPU than the write
    (most in a VM, where each fresh page is a fault in the host too) and which a file read later
    through a memory map does not need.  Else plain writes.  ``close`` makes it durable.
    Hand-written: the standard library has no aligned direct-I/O writer."""

    def __init__(self, path, buffer_bytes=8 << 20, digest=None):
        self.path = path
        self.digest = digest  # e.g. an xxhash object: updated with every byte given, in order
        self.size = self.written = self.fill = 0  # bytes given; on disk; staged
        direct = getattr(os, "O_DIRECT", 0)
        try:
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | direct, 0o666)
        except OSError as e:  # a file system without O_DIRECT (e.g. tmpfs before Linux 6.6)
            if not direct or e.errno != errno.EINVAL:
                raise
            direct = 0
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        self.direct = bool(direct)
        # aligned staging memory (an anonymous mapping starts on a page): whole blocks go out;
        # shared, so a worker forked later maps it too and the writes here copy no page
        self.buffer = mmap.mmap(-1, buffer_bytes) if self.direct else None

    def write(self, data):
        view = memoryview(data).cast("B")
        self.size += len(view)
        if self.digest is not None:
            self.digest.update(view)
        while view:
            if not self.direct:  # plain: what is staged first, then the rest as it comes
                if self.fill:
                    self._drain(self.fill)
                self._put(view)
                return
            n = min(len(view), len(self.buffer) - self.fill)
            self.buffer[self.fill:self.fill + n] = view[:n]
            self.fill, view = self.fill + n, view[n:]
            if self.fill == len(self.buffer):
                self._drain(self.fill)

    def _put(self, view):
        write_all_at(self.fd, view, self.written)
        self.written += len(view)

    def _drain(self, length):
        """Write the staged bytes' first ``length`` (whole blocks) where the file ends; when the
        file system refuses a direct write, the same bytes plainly, and plain writes after."""
        with memoryview(self.buffer)[:length] as staged:
            try:
                write_all_at(self.fd, staged, self.written)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                fcntl.fcntl(self.fd, fcntl.F_SETFL,
                            fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~os.O_DIRECT)
                self.direct = False
                write_all_at(self.fd, staged, self.written)  # at the same offset: nothing twice
        self.written += length
        self.fill = 0

    def close(self, durable=True):
        """Write what is left (the last block padded, then cut to the size given), fsync
        unless ``durable`` is False, and close."""
        try:
            if self.fill:
                padded = block_aligned(self.fill) if self.direct else self.fill
                self.buffer[self.fill:padded] = bytes(padded - self.fill)
                self._drain(padded)
            if self.written != self.size:
                os.ftruncate(self.fd, self.size)
            if durable:
                os.fsync(self.fd)
        finally:
            self.discard()

    def discard(self):
        """Close without writing what is left (the file is about to be removed)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.buffer is not None:
            buffer, self.buffer = self.buffer, None
            try:
                buffer.close()
            except BufferError:
                # a view of it is still alive (the frames of a failed write, held by the
                # exception being handled): the mapping goes when the last view does
                pass


class BlockFile:
    """A temp file whose parts start on block boundaries (``block_aligned``), each written once
    and read back whole, through an ``O_DIRECT`` descriptor where the file system takes one
    (``DirectAppender`` says why: here a part goes through the page cache twice), else plainly.
    Made before a fork, used by the parent and its workers: each process stages its bytes in
    aligned memory of its own.  A direct write pads its part's last block, so a part's room
    must be ``block_aligned`` of its size."""

    def __init__(self, file):
        self.file = file  # also the plain descriptor: the fallback
        try:
            self.direct = os.open(f"/proc/self/fd/{file.fileno()}", os.O_RDWR | os.O_DIRECT)
        except (AttributeError, OSError):  # not Linux, or a file system without O_DIRECT
            self.direct = None
        self._staging, self._owner = None, None

    def _buffer(self, size):
        """This process's aligned buffer of at least ``size`` bytes (a forked worker makes its
        own, so no two processes stage in one)."""
        if self._owner != os.getpid() or len(self._staging) < size:
            self._staging = mmap.mmap(-1, max(size, 1 << 20))
            self._owner = os.getpid()
        return self._staging

    def write_at(self, data, at):
        """All of ``data`` written at ``at`` (a block boundary for a direct write)."""
        view = memoryview(data).cast("B")
        if self.direct is not None and at % DIRECT_BLOCK == 0:
            size = block_aligned(len(view))
            buffer = self._buffer(size)
            buffer[:len(view)] = view
            try:
                write_all_at(self.direct, memoryview(buffer)[:size], at)
                return
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                self.direct = None
        write_all_at(self.file.fileno(), view, at)

    def read_at(self, size, at):
        """The ``size`` bytes at ``at``: a view of this process's buffer, valid until its next
        read, or bytes."""
        if self.direct is not None and at % DIRECT_BLOCK == 0:
            buffer = self._buffer(block_aligned(size))
            view = memoryview(buffer)[:block_aligned(size)]
            try:
                done = os.preadv(self.direct, [view], at)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                self.direct = None
            else:
                if done < size:
                    raise OSError(errno.EIO, f"short read of a temp file: {done} of {size} "
                                             f"bytes at {at}")
                return view[:size]
        return os.pread(self.file.fileno(), size, at)

    def close(self):
        if self.direct is not None:
            os.close(self.direct)
            self.direct = None
        self.file.close()


def block_aligned(n):
    """``n`` rounded up to whole ``DIRECT_BLOCK``s."""
    return -(-n // DIRECT_BLOCK) * DIRECT_BLOCK


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


def atomic_save_png(fig, path, dpi=100):
    """A matplotlib figure as a PNG at ``path`` through ``atomic_binary_writer``: a reader (or
    a killed run) never sees half an image."""
    with atomic_binary_writer(path) as f:
        fig.savefig(f, format="png", dpi=dpi)


@contextlib.contextmanager
def _atomic_writer(path, mode, **open_keys):
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=owned_prefix(".tmp-" + os.path.basename(path)), dir=d)
    try:
        with disk_full_named(path), os.fdopen(fd, mode, **open_keys) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # as atomic_write_bytes: readable like a plain open()
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise
