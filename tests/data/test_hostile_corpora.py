"""Hostile inputs cost bounded memory and time (issue #32, item 4): a line over
Data.max_line_bytes, a .gz file without line ends, a gzip bomb of lines, and ppvarlen-infer's
over-long texts and lines.

Each crafted file is built here.  The reading runs in a subprocess, so the peak resident memory
measured is that process's: a build child runs a normal corpus (its peak is the baseline:
imports and a real build), then the hostile one, then the normal one again from scratch (a
refused build leaves nothing behind that breaks the next), and reports its peak after each.
The bound asserted is PEAK_OVER_BASELINE_MB over the baseline; the hostile files hold 50 MB
to 256 MB, so reading one whole (as before the bounds) exceeds it.
"""
import gzip
import json
import os
import subprocess
import sys
import zlib

import pytest
from export_helpers import TEXTS, cls_export  # noqa: F401
from test_store import write_reviews

from ppvarlen.config import ConfigError, load_config
from ppvarlen.data import chunks as record_chunks
from ppvarlen.data import sources
from ppvarlen.data.errors import DataError
from ppvarlen.data.readers import ReadLimits
from ppvarlen.data.sources import read_file

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INFER = os.path.join(REPO, "deploy", "python", "infer.py")
PEAK_OVER_BASELINE_MB = 100
BIG_LINE_BYTES = 50 << 20
BOMB_BYTES = 256 << 20
LINE = json.dumps({"text": "好" * 300, "label": "pos"}, ensure_ascii=False).encode() + b"\n"
FIRST_LINES = [json.dumps({"text": TEXTS[0], "label": "pos"}, ensure_ascii=False).encode(),
               json.dumps({"text": "长" * 20001, "label": "neg"}, ensure_ascii=False).encode()]

# normal corpus, hostile corpus, normal corpus again (rebuilt); the peak after each phase
BUILD_CHILD = r"""
import json, resource, sys
from ppvarlen.config import load_config
from ppvarlen.data import chunks as record_chunks
from ppvarlen.data import sources
from ppvarlen.data.sources import load_corpus
from ppvarlen.data.errors import DataError
from ppvarlen.store_build import build_datasets


def peak_mb():
    with open("/proc/self/status") as f:
        own = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # the joined fork pool
    return max(own, workers) / 1024


mode, normal, hostile, cache = sys.argv[1:5]
overrides = sys.argv[5:]
for path, rebuild in ((normal, False), (hostile, False), (normal, True)):
    cfg = load_config(data={"Data": {"corpus": "jsonl", "task": "classification",
                                     "train_file": path, "cache_dir": cache, "num_proc": 2,
                                     "rebuild_cache": rebuild}}, overrides=overrides).Data
    try:
        if mode == "memory":
            out = {"examples": sum(map(len, load_corpus(cfg).splits.values()))}
        else:
            out = {"examples": len(build_datasets(cfg).train)}
    except DataError as e:
        out = {"error": str(e)}
    out["peak_mb"] = peak_mb()
    print(json.dumps(out), flush=True)
"""


def run_measured(args, tmp_path, name):
    """Run ``args`` -> (exit code, stdout, stderr, the process's peak RSS in MB).  The peak is
    this one child's (``wait4``), not the largest of all this test process's children."""
    out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
    with open(out, "wb") as o, open(err, "wb") as e:
        p = subprocess.Popen(args, stdout=o, stderr=e, cwd=REPO)
        _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return (p.returncode, out.read_text(encoding="utf-8"), err.read_text(encoding="utf-8"),
            usage.ru_maxrss / 1024)


def build_phases(tmp_path, mode, hostile, *overrides):
    """The three phases of BUILD_CHILD on ``hostile`` -> [(result dict) per phase]."""
    normal = write_reviews(tmp_path / "normal.jsonl", 300)
    rc, out, err, _ = run_measured([sys.executable, "-c", BUILD_CHILD, mode, normal, str(hostile),
                                    str(tmp_path / f"cache-{mode}"), *overrides],
                                   tmp_path, f"build-{mode}")
    assert rc == 0 and "Traceback" not in out + err, (out + err)[-3000:]
    phases = [json.loads(line) for line in out.splitlines()]
    assert len(phases) == 3, out
    first, refused, again = phases
    assert "examples" in first and again["examples"] == first["examples"], phases
    assert refused["peak_mb"] - first["peak_mb"] < PEAK_OVER_BASELINE_MB, phases
    return refused


def write_gzip(path, piece, total, level=1):
    """``piece`` repeated to about ``total`` bytes, gzip'd piece by piece (the test never holds
    them all)."""
    z = zlib.compressobj(level, zlib.DEFLATED, 31)  # wbits 31: the gzip container
    with open(path, "wb") as f:
        for _ in range(total // len(piece)):
            f.write(z.compress(piece))
        f.write(z.flush())
    return path


@pytest.fixture(scope="module")
def big_line_file(tmp_path_factory):
    """A JSONL file: a normal line, a text over Deploy.max_text_chars, a 50 MB line, a normal
    line."""
    path = tmp_path_factory.mktemp("hostile") / "big-line.jsonl"
    with open(path, "wb") as f:
        f.write(b"".join(line + b"\n" for line in FIRST_LINES))
        f.write(b'{"text": "')
        for _ in range(BIG_LINE_BYTES >> 20):
            f.write(b"a" * (1 << 20))
        f.write(b'", "label": "pos"}\n')
        f.write(json.dumps({"text": TEXTS[1], "label": "neg"}, ensure_ascii=False).encode() + b"\n")
    return path


# ------------------------------------------------------------------------ Data.max_line_bytes

@pytest.mark.parametrize("mode", ["memory", "stream"])
def test_a_50mb_line_stops_the_build_at_its_line(big_line_file, tmp_path, mode):
    refused = build_phases(tmp_path, mode, big_line_file)
    assert f"{big_line_file}:3: the line is longer than Data.max_line_bytes (4,194,304 bytes)" \
        in refused["error"]
    assert "-o Data.max_line_bytes=" in refused["error"]


@pytest.mark.parametrize("mode", ["memory", "stream"])
def test_a_gzip_file_without_line_ends_stops_at_the_line_bound(tmp_path, mode):
    bomb = write_gzip(tmp_path / "zeros.jsonl.gz", bytes(1 << 20), BOMB_BYTES)
    refused = build_phases(tmp_path, mode, bomb)
    assert f"{bomb}:1: the line is longer than Data.max_line_bytes" in refused["error"]


def _line_file(tmp_path, lengths):
    path = tmp_path / "lines.jsonl"
    with open(path, "wb") as f:
        for n in lengths:
            body = b'{"text": "", "label": "pos"}'
            f.write(body[:10] + b"x" * (n - len(body)) + body[10:] + b"\n")
    return str(path)


def _stream_scan(path, **data):
    cfg = load_config(data={"Data": {"corpus": "jsonl", "task": "classification",
                                     "train_file": path, **data}}).Data
    return sources.scan(sources.plan(cfg), None, num_proc=1)


def test_both_paths_draw_the_line_at_the_same_byte(tmp_path, monkeypatch):
    """A line of exactly max_line_bytes passes, one byte more fails at its line, on both paths
    and under Data.skip_invalid too; a line over the bound inside one stream chunk is found by
    the worker, one across chunks by the parent: the same message either way."""
    monkeypatch.setattr(record_chunks, "CHUNK_BYTES", 256)
    limit = 100
    ok = _line_file(tmp_path, [40, limit, 60])
    assert len(read_file(ok, "jsonl", limits=ReadLimits(limit)).examples) == 3
    assert _stream_scan(ok, max_line_bytes=limit).corpus.splits["train"] > 0
    for lengths in ([40, limit + 1, 60], [40, 700, 60]):  # in one chunk; across chunks
        bad = _line_file(tmp_path, lengths)
        with pytest.raises(DataError) as memory:
            read_file(bad, "jsonl", skip_invalid=True, limits=ReadLimits(limit))
        with pytest.raises(DataError) as streamed:
            _stream_scan(bad, max_line_bytes=limit, skip_invalid=True)
        assert str(memory.value) == str(streamed.value)
        assert str(memory.value).startswith(f"{bad}:2: the line is longer than "
                                            f"Data.max_line_bytes (100 bytes)")


def test_a_parquet_text_cell_over_the_bound_is_refused(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = str(tmp_path / "t.parquet")
    pq.write_table(pa.table({"text": ["好", "坏", "x" * 2000], "label": ["pos", "neg", "pos"]}),
                   path)
    with pytest.raises(DataError, match=r"t\.parquet:3: field 'text' is longer than "
                                        r"Data\.max_line_bytes \(1,000 bytes\)"):
        read_file(path, "parquet", limits=ReadLimits(1000))
    assert len(read_file(path, "parquet", limits=ReadLimits(2000)).examples) == 3


def test_the_bounds_are_checked_as_config_values():
    with pytest.raises(ConfigError, match="Data.max_line_bytes must be a positive"):
        ReadLimits.of({"max_line_bytes": 0})
    with pytest.raises(ConfigError, match="Data.max_decompressed_ratio must be >= 1"):
        ReadLimits.of({"max_decompressed_ratio": 0.5})
    data = load_config(overrides=["Data.max_decompressed_ratio=null"]).Data
    assert ReadLimits.of(data) == ReadLimits(4 << 20, None)


# --------------------------------------------------------------- Data.max_decompressed_ratio

@pytest.mark.parametrize("mode", ["memory", "stream"])
def test_a_gzip_bomb_of_lines_stops_early(tmp_path, mode):
    bomb = write_gzip(tmp_path / "lines.jsonl.gz", LINE * 1024, BOMB_BYTES, level=6)
    refused = build_phases(tmp_path, mode, bomb)
    assert refused["error"].startswith(f"{bomb}: the first ")
    assert "more than Data.max_decompressed_ratio (100) times as many" in refused["error"]
    assert "-o Data.max_decompressed_ratio=" in refused["error"]


def test_a_compressible_corpus_has_a_way_out(tmp_path):
    """Under 8 MiB decompressed the ratio is not checked; beyond, the key raises it."""
    small = write_gzip(tmp_path / "small.jsonl.gz", LINE * 1024, 4 << 20, level=6)
    big = write_gzip(tmp_path / "big.jsonl.gz", LINE * 1024, 24 << 20, level=6)
    assert os.path.getsize(big) * 100 < (24 << 20)  # a ratio over the default

    def chunk_bytes(path, ratio):
        chunks = list(record_chunks._chunks_of("train", str(path), ReadLimits(4 << 20, ratio)))
        errors = [c.error for c in chunks if c.error]
        if errors:
            raise DataError(errors[0])
        return sum(c.size for c in chunks)

    assert chunk_bytes(small, 100) == len(gzip.decompress(small.read_bytes()))
    with pytest.raises(DataError, match="Data.max_decompressed_ratio"):
        chunk_bytes(big, 100)
    whole = (24 << 20) // len(LINE * 1024) * len(LINE * 1024)
    assert chunk_bytes(big, 1000) == chunk_bytes(big, None) == whole


def test_a_broken_gzip_file_is_a_data_error(tmp_path):
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(gzip.compress(LINE * 1000)[:-20])
    with pytest.raises(DataError, match=r"cut\.jsonl\.gz: cannot decompress"):
        read_file(str(path), "jsonl")


@pytest.mark.parametrize("depth,where", [(1020, "second-line"), (200_000, "first-line")])
def test_a_value_nested_thousands_deep_is_a_bad_line(tmp_path, depth, where):
    """orjson reads 1,020 levels and refuses more; Python's json (and repr, in a message) stop at
    the recursion limit: either way the line is a bad line naming file:line, never a
    RecursionError, and it is skipped under skip_invalid."""
    good = json.dumps({"text": "好", "label": "pos"}, ensure_ascii=False)
    deep = '{"text": ' + "[" * depth + "]" * depth + ', "label": "pos"}'
    lines = [deep, good, good] if where == "first-line" else [good, deep, good]
    path = tmp_path / "deep.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    bad_line = lines.index(deep) + 1
    with pytest.raises(DataError, match=rf"deep\.jsonl:{bad_line}: a value is nested too deeply"):
        read_file(str(path), "jsonl")
    fd = read_file(str(path), "jsonl", skip_invalid=True)
    assert len(fd.examples) == 2 and dict(fd.skipped) == {"bad_json": 1}


# --------------------------------------------------------------------- linear line chunking

class _CountedBytes(bytes):
    """A block as the chunker reads it, counting the bytes it copies or searches."""

    work = [0]

    def _count(self, n):
        _CountedBytes.work[0] += n

    def __add__(self, other):
        self._count(len(self) + len(other))
        return _CountedBytes(bytes(self) + bytes(other))

    def __radd__(self, other):
        self._count(len(self) + len(other))
        return _CountedBytes(bytes(other) + bytes(self))

    def __getitem__(self, key):
        out = bytes.__getitem__(self, key)
        self._count(len(out) if isinstance(key, slice) else 1)
        return out

    def rfind(self, *args):
        self._count(len(self))
        return bytes.rfind(self, *args)

    def find(self, *args):
        self._count(len(self))
        return bytes.find(self, *args)


class _BlockFile:
    """A binary file whose reads return ``_CountedBytes``."""

    def __init__(self, data):
        self.data, self.pos = data, 0

    def read(self, n):
        block = self.data[self.pos:self.pos + n]
        self.pos += len(block)
        return _CountedBytes(block)


def test_chunking_work_is_linear_in_the_line_length(monkeypatch):
    """The chunker's copying and searching per byte of a long line does not grow with its length
    (it did: each block re-copied and re-searched the line so far)."""
    monkeypatch.setattr(record_chunks, "CHUNK_BYTES", 4096)
    per_byte = []
    for size in (1 << 20, 3 << 20):
        data = b"short\n" + b"x" * size + b"\nlast\n"
        _CountedBytes.work[0] = 0
        chunks = list(record_chunks._line_chunks("train", "f.jsonl", _BlockFile(data), 1 << 30,
                                                carry_data=True))
        assert b"".join(c.data for c in chunks) == data
        assert [c.first_line for c in chunks][:2] == [1, 2]
        per_byte.append(_CountedBytes.work[0] / len(data))
    assert max(per_byte) < 4, per_byte  # a constant: each byte searched once, copied twice
    assert per_byte[1] < 1.5 * per_byte[0], per_byte


# ------------------------------------------------------------------------------ ppvarlen-infer

def test_infer_refuses_over_long_texts_and_lines_and_goes_on(cls_export, big_line_file,  # noqa: F811
                                                             tmp_path):
    out = tmp_path / "out.jsonl"
    rc, _, err, peak = run_measured(
        [sys.executable, INFER, "--no-progress", "--model-dir", cls_export[0], "--backend", "onnx",
         "--input", str(big_line_file), "--output", str(out)], tmp_path, "infer")
    assert rc == 1 and "Traceback" not in err, err[-3000:]  # 1: some lines failed
    records = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert [r["line"] for r in records] == [1, 2, 3, 4]
    assert "label" in records[0] and "label" in records[3]
    assert records[1]["error"] == (
        f"{big_line_file}:2: text has 20,001 characters; at most 20,000 (Deploy.max_text_chars, "
        f"as the server). Split the text, or raise the limit, e.g. "
        f"-o Deploy.max_text_chars=20001")
    assert records[2]["error"].startswith(f"{big_line_file}:3: line is longer than 1,288,576 "
                                          f"bytes, more than a text of Deploy.max_text_chars "
                                          f"(20,000) characters takes; not read")
    assert json.loads(err.strip().splitlines()[-1])["failed"] == 2

    # the same lines without the 50 MB one, the limit raised: all predicted; the baseline
    small = tmp_path / "small.jsonl"
    small.write_bytes(b"".join(line + b"\n" for line in FIRST_LINES))
    rc, _, err, baseline = run_measured(
        [sys.executable, INFER, "--no-progress", "--model-dir", cls_export[0], "--backend", "onnx",
         "--input", str(small), "--output", str(out), "-o", "Deploy.max_text_chars=20001"],
        tmp_path, "infer-small")
    assert rc == 0, err[-3000:]
    assert all("label" in json.loads(x) for x in out.read_text(encoding="utf-8").splitlines())
    assert peak - baseline < PEAK_OVER_BASELINE_MB, (peak, baseline)


def test_infer_takes_no_other_deploy_override(tmp_path):
    r = subprocess.run([sys.executable, INFER, "--model-dir", str(tmp_path), "--input", "x.txt",
                        "-o", "Deploy.threads=2"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "takes only -o Deploy.max_text_chars=N" in r.stderr
    assert "Traceback" not in r.stderr
