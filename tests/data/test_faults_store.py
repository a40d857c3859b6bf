"""Faults of the encoded-corpus store (issue 46): what a damaged, half-written or
concurrently rebuilt store does to the run that reads it.  Each test asserts what the user
sees: the error type and the file its message names, the rows read, the debris left."""
import errno
import gc
import json
import logging
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from ppvarlen.config import load_config
from ppvarlen.data import cache, store
from ppvarlen.data.errors import DataError
from ppvarlen.data.store import StoreDamagedError, StoreField, StoreSplit, StoreWriter
from ppvarlen.store_build import build_datasets
from ppvarlen.utils import io
from ppvarlen.utils.io import HOST_TAG, DiskFullError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REVIEWS = ["质量很好，物流也快", "太差了，不推荐", "一般般吧", "非常满意！！", "包装破损，客服不理人"]
SPLITS = ("train", "dev", "test")


def write_reviews(path, n):
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            text = "".join(REVIEWS[(i * k + 3) % len(REVIEWS)] for k in range(1 + i % 3)) + str(i)
            f.write(json.dumps({"text": text, "label": ["neg", "pos"][i % 2]},
                               ensure_ascii=False) + "\n")
    return str(path)


def keys(train, cache_dir, **more):
    return {**dict(corpus="jsonl", train_file=str(train), cache_dir=str(cache_dir), max_len=48,
                   num_proc=1), **more}


def build(train, cache_dir, **more):
    return build_datasets(load_config(data={"Data": keys(train, cache_dir, **more)}).Data)


def rows(bundle):
    """Every split's items as lists (what a run reads)."""
    return {s: [{k: np.asarray(v).tolist() for k, v in getattr(bundle, s)[i].items()}
                for i in range(len(getattr(bundle, s)))] for s in SPLITS}


def split_dir(bundle, split="train"):
    return getattr(bundle, split).store.path


def debris(root):
    """Temp and old directories/files left anywhere under the cache."""
    return [os.path.join(d, n) for d, dirs, files in os.walk(root) for n in dirs + files
            if n.startswith((".tmp-", ".old-"))]


def generations(root):
    """The generation directories of the cache (their verification stamps left out)."""
    return sorted(n for n in os.listdir(os.path.join(root, cache.GENERATIONS))
                  if not n.endswith(".verified.json"))


def dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def corpus(tmp_path):
    return write_reviews(tmp_path / "train.jsonl", 600)


# ----------------------------------------------------------------- damaged files are caught

def test_a_cut_short_bin_is_rebuilt_never_read_as_empty_rows(corpus, tmp_path, caplog):
    first = build(corpus, tmp_path / "c")
    want = rows(first)
    bin_path = os.path.join(split_dir(first), "input_ids.bin")
    os.truncate(bin_path, os.path.getsize(bin_path) // 3)
    del first
    with caplog.at_level(logging.WARNING, logger="ppvarlen"):
        again = build(corpus, tmp_path / "c")
    assert again.stats["store"]["cache"].startswith(f"built ({bin_path} was damaged")
    assert "cut short" in again.stats["store"]["cache"]
    assert any(bin_path in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert rows(again) == want  # every row whole: none read back empty


@pytest.mark.parametrize("name", ["label.npy", "input_ids.offsets.npy", "lengths.npy"])
def test_a_cut_short_array_is_refused_naming_it_or_rebuilt_in_the_cache(name, corpus, tmp_path):
    first = build(corpus, tmp_path / "c")
    want = rows(first)
    path = os.path.join(split_dir(first), name)
    os.truncate(path, os.path.getsize(path) - 8)
    with pytest.raises(StoreDamagedError) as e:  # read outside the cache: nothing to rebuild from
        StoreSplit(split_dir(first))
    assert isinstance(e.value, DataError) and e.value.file == path
    assert str(e.value).startswith(f"{path}: ") and "cut short" in str(e.value)
    del first
    again = build(corpus, tmp_path / "c")
    assert f"{path} was damaged" in again.stats["store"]["cache"] and rows(again) == want


def test_a_missing_file_and_offsets_that_disagree_with_the_bin_are_named(corpus, tmp_path):
    first = build(corpus, tmp_path / "c")
    d = split_dir(first, "dev")
    with open(os.path.join(d, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    # offsets rewritten to end one row early, the manifest made to agree with every size
    offsets = np.load(os.path.join(d, "input_ids.offsets.npy"))
    offsets[-1] -= 1
    np.save(os.path.join(d, "input_ids.offsets.npy"), offsets)
    with pytest.raises(StoreDamagedError, match=r"input_ids\.offsets\.npy: its rows end at byte"):
        StoreSplit(d)
    os.remove(os.path.join(d, "label.npy"))
    with pytest.raises(StoreDamagedError, match=r"label\.npy: the file is missing"):
        StoreSplit(d)
    assert manifest["files"]["label.npy"]["size"] > 0


def flip_low_bit(path, at):
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 1]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # set back: the ctime still moves


def test_one_flipped_low_bit_is_detected_on_the_next_open_and_rebuilt(corpus, tmp_path,
                                                                     monkeypatch):
    first = build(corpus, tmp_path / "c")
    want = rows(first)
    bin_path = os.path.join(split_dir(first), "input_ids.bin")
    del first
    hashed = []
    real = store.file_xxh3
    monkeypatch.setattr(store, "file_xxh3", lambda p: hashed.append(p) or real(p))
    time.sleep(0.05)  # past the timestamp tick of the build's last write
    build(corpus, tmp_path / "c")  # a warm open: hashes what is not vouched for yet
    hashed.clear()
    warm = build(corpus, tmp_path / "c")
    assert warm.stats["store"]["cache"] == "reused" and hashed == []  # vouched for: no hashing
    del warm
    flip_low_bit(bin_path, 40)
    again = build(corpus, tmp_path / "c")
    assert again.stats["store"]["cache"].startswith(f"built ({bin_path} was damaged: its "
                                                    f"content differs")
    assert rows(again) == want
    hashed.clear()
    forced = build(corpus, tmp_path / "c", verify_store=True)  # Data.verify_store: all hashed
    assert forced.stats["store"]["cache"] == "reused"
    assert len(hashed) == sum(len(getattr(forced, s).store.meta["files"]) for s in SPLITS)


# ------------------------------------------------------- a rebuild does not pull the store away

STEP = r"""
import os, signal, sys, time
from ppvarlen.config import load_config
from ppvarlen.data import cache
from ppvarlen.data.store import StoreWriter
from ppvarlen import store_build
train, cache_dir, point, flag_dir = sys.argv[1:5]
calls = []
real_add, real_encode, real_point = StoreWriter.add_packed, store_build._encode, cache._point

def add(self, packed):
    calls.append(1)
    if len(calls) == 2:
        if point == "mid_pass2":
            os.kill(os.getpid(), signal.SIGKILL)
        if point == "pause_mid_pass2":  # the test reads the old generation meanwhile
            open(os.path.join(flag_dir, "paused"), "w").close()
            while not os.path.exists(os.path.join(flag_dir, "go")):
                time.sleep(0.01)
    return real_add(self, packed)

def encode(*a, **k):
    if point == "after_pass1":
        os.kill(os.getpid(), signal.SIGKILL)
    return real_encode(*a, **k)

def switch(*a, **k):
    if point == "before_switch":
        os.kill(os.getpid(), signal.SIGKILL)
    return real_point(*a, **k)

StoreWriter.add_packed, store_build._encode, cache._point = add, encode, switch
store_build.build_datasets(load_config(data={"Data": dict(
    corpus="jsonl", train_file=train, cache_dir=cache_dir, max_len=48, num_proc=1,
    rebuild_cache=point.startswith("pause"))}).Data)
"""


def run_build(train, cache_dir, point, flag_dir, wait=True):
    proc = subprocess.Popen([sys.executable, "-c", STEP, str(train), str(cache_dir), point,
                             str(flag_dir)], env=dict(os.environ, PYTHONPATH=REPO),
                            stderr=subprocess.PIPE)
    if wait:
        proc.wait(timeout=120)
    return proc


def wait_for(path, proc, seconds=120):
    deadline = time.time() + seconds
    while not os.path.exists(path):
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.time() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def test_a_rebuild_under_a_reader_leaves_the_reader_its_generation(corpus, tmp_path):
    root = tmp_path / "c"
    reader = build(corpus, root)
    old = reader.stats["store"]["generation"]
    with open(os.path.join(old, "train", "label.npy"), "rb") as f:
        label_bytes = f.read()
    proc = run_build(corpus, root, "pause_mid_pass2", tmp_path, wait=False)
    try:
        wait_for(tmp_path / "paused", proc)
        during = rows(reader)  # the other process is half-way through the new generation
    finally:
        (tmp_path / "go").touch()
        proc.wait(timeout=120)
    assert proc.returncode == 0, proc.stderr.read().decode()[-2000:]
    after = rows(reader)  # the rebuild is done: the reader still reads its generation
    new = cache.current_generation(str(root), os.path.basename(reader.stats["store"]["dir"]))
    assert new != old and os.path.isdir(old)  # held by the reader: not removed
    assert during == after and sum(len(v) for v in after.values()) == 600
    assert open(os.path.join(old, "train", "label.npy"), "rb").read() == label_bytes
    del reader, during
    gc.collect()
    again = build(corpus, root)  # the reader is gone: the old generation goes
    assert again.stats["store"]["generation"] == new and not os.path.exists(old)
    assert rows(again) == after
    assert generations(root) == [os.path.basename(new)]


@pytest.mark.parametrize("point", ["after_pass1", "mid_pass2", "before_switch"])
def test_a_build_killed_at_any_point_leaves_nothing_the_next_one_keeps(point, corpus, tmp_path):
    reference = build(corpus, tmp_path / "ref")
    proc = run_build(corpus, tmp_path / "c", point, tmp_path)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    bundle = build(corpus, tmp_path / "c")
    assert bundle.stats["store"]["cache"].startswith("built")
    for s in SPLITS:
        a, b = split_dir(reference, s), split_dir(bundle, s)
        assert sorted(os.listdir(a)) == sorted(os.listdir(b))
        for name in os.listdir(a):
            assert open(os.path.join(a, name), "rb").read() == \
                open(os.path.join(b, name), "rb").read(), (s, name)
    assert debris(tmp_path / "c") == []
    assert generations(tmp_path / "c") == [os.path.basename(bundle.stats["store"]["generation"])]


# --------------------------------------------------------------------------- a full disk

def fail_bin_writes_after(monkeypatch, limit):
    """``write_all_at`` raises ENOSPC once a ``.bin`` would pass ``limit`` bytes."""
    real = io.write_all_at

    def write_all_at(fd, data, at):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".bin") and at + len(data) > limit:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data, at)

    monkeypatch.setattr(io, "write_all_at", write_all_at)


def test_a_full_disk_while_encoding_names_the_store_and_leaves_nothing(corpus, tmp_path,
                                                                      monkeypatch):
    monkeypatch.setattr(io.DirectAppender.__init__, "__defaults__", (8192, None))
    fail_bin_writes_after(monkeypatch, 20_000)  # mid-way through the train split's rows
    with pytest.raises(DiskFullError) as e:
        build(corpus, tmp_path / "c")
    message = str(e.value)
    assert f"{tmp_path / 'c'}/" in message and "/train: no space left" in message
    assert "bytes encoded when the disk filled" in message and "bytes free" in message
    assert debris(tmp_path / "c") == []
    monkeypatch.undo()  # space again
    again = build(corpus, tmp_path / "c")
    assert again.stats["store"]["cache"].startswith("built") and debris(tmp_path / "c") == []


def test_a_full_disk_during_the_scan_names_the_cache_directory(corpus, tmp_path, monkeypatch):
    real = os.pwrite

    def pwrite(fd, data, at):  # the scan spills parsed examples to an unlinked temp file
        if os.readlink(f"/proc/self/fd/{fd}").endswith("(deleted)"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data, at)

    monkeypatch.setattr(os, "pwrite", pwrite)
    with pytest.raises(DiskFullError, match=rf"^{tmp_path / 'c'}: no space left on the device "
                                            rf"while spilling the parsed corpus"):
        build(corpus, tmp_path / "c")
    assert debris(tmp_path / "c") == []


@pytest.fixture
def small_tmpfs(tmp_path):
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_real_full_disk_then_space_again(small_tmpfs, tmp_path):
    train = write_reviews(tmp_path / "big.jsonl", 12_000)  # a store of a few MB
    root = small_tmpfs / "c"
    with pytest.raises(DiskFullError, match=rf"^{small_tmpfs}/c.*: no space left on the device"):
        build(train, root)
    assert debris(root) == []
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_tmpfs)], check=True)
    again = build(train, root)
    assert again.stats["store"]["cache"].startswith("built") and debris(root) == []
    assert sum(len(getattr(again, s)) for s in SPLITS) > 0


# ------------------------------------------------------------------------------- debris

def test_a_dead_builders_temp_dirs_are_reaped_and_a_live_ones_kept(corpus, tmp_path):
    root = tmp_path / "c"
    first = build(corpus, root)
    gen = first.stats["store"]["generation"]
    dead, live = dead_pid(), os.getpid()
    made = {}
    for where, name in ((root, ".tmp-abc"), (root / cache.GENERATIONS, ".tmp-key"),
                        (gen, ".tmp-train")):
        for who, pid in (("dead", dead), ("live", live)):
            path = os.path.join(where, f"{name}.pid{pid}.{HOST_TAG}.x1y2")
            os.makedirs(os.path.join(path, "sub"))
            made[path] = who
    build(corpus, root)  # an open of the key reaps the cache root and the generations
    fields = [StoreField("input_ids", "int32", ragged=True, length=True)]
    with StoreWriter(os.path.join(gen, "extra_split"), fields) as w:  # a split's build: its parent
        w.add_columns({"input_ids": [[1, 2]]})
    for path, who in made.items():
        assert os.path.exists(path) == (who == "live"), (path, who)


@pytest.mark.parametrize("entry", ["not a dict", {"size": "12", "xxh3": "00"}, {"size": 12}])
def test_a_manifest_whose_file_entries_are_broken_is_named_not_a_traceback(entry, tmp_path):
    path = tmp_path / "split"
    with StoreWriter(str(path), [StoreField("input_ids", "int32", ragged=True, length=True)]) as w:
        w.add_columns({"input_ids": [np.array([2, 7, 3])]})
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"]["input_ids.bin"] = entry
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(StoreDamagedError) as e:
        StoreSplit(str(path))
    assert str(e.value).startswith(str(path / "manifest.json")) and "'input_ids.bin'" in str(e.value)


def test_a_manifest_naming_a_file_outside_the_store_is_refused_unread(tmp_path):
    path = tmp_path / "split"
    with StoreWriter(str(path), [StoreField("input_ids", "int32", ragged=True, length=True)]) as w:
        w.add_columns({"input_ids": [np.array([2, 7, 3])]})
    outside = tmp_path / "secret.txt"
    outside.write_text("not the store's")
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"]["../secret.txt"] = {"size": outside.stat().st_size,
                                          "xxh3": store.file_xxh3(str(outside))}
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(StoreDamagedError, match="'../secret.txt' is not a file of the store"):
        StoreSplit(str(path))
