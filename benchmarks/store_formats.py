"""Store format by measurement: the same encoded token ids written and read as

* ``numpy``: raw little-endian ``.bin`` + ``int64`` offsets ``.npy`` (ppvarlen's store,
  ``data/store.py``), read with ``np.memmap``;
* ``paddlenlp``: PaddleNLP's ``indexed_dataset`` (``impl="mmap"``, Megatron's ``.bin/.idx``),
  written with its builder (one ``add_item`` per row: its API), read with ``make_dataset``;
* ``arrow``: an Arrow IPC file with one ``large_list<int32>`` column, memory-mapped;
* ``parquet``: the same table as Parquet (``read_table(memory_map=True)``: decoded on open).

    PYTHONPATH=$PWD nice -n 5 python benchmarks/store_formats.py --store STORE_ENTRY_DIR \
        [--workdir /tmp/store_formats] [--out output/bench/store_formats] [--reads 10000]

``--store``: a store cache entry (``train/``, ``dev/``, ``test/`` inside; e.g. the one
``benchmarks/corpus_scale.py`` builds from its 1M corpus): their ``input_ids`` rows are
concatenated into one corpus.  Per format: write seconds (from the ids in memory), open
seconds (until a row can be read), seconds for ``--reads`` random rows (seed 0, each read as a
numpy array and summed, so its pages are touched) and bytes on disk.  The files are read right
after being written, so from the page cache; one run each on a shared machine (the load
average is recorded).  A note, not a test.
"""
import argparse
import json
import os
import shutil
import sys
import time

import numpy as np

from machine import machine

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_ids(entry):
    """(flat int32 ids, int64 offsets) of the entry's splits, concatenated in memory."""
    flats, lengths = [], []
    for split in ("train", "dev", "test"):
        d = os.path.join(entry, split)
        flats.append(np.fromfile(os.path.join(d, "input_ids.bin"), dtype="<i4"))
        lengths.append(np.diff(np.load(os.path.join(d, "input_ids.offsets.npy"))))
    lengths = np.concatenate(lengths)
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return np.concatenate(flats), offsets


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, round(time.perf_counter() - t0, 3)


def numpy_format(flat, offsets, d):
    def write():
        np.asarray(flat, "<i4").tofile(os.path.join(d, "ids.bin"))  # no copy: already <i4
        np.save(os.path.join(d, "ids.offsets.npy"), offsets, allow_pickle=False)

    def open_():
        offs = np.load(os.path.join(d, "ids.offsets.npy"))
        return np.memmap(os.path.join(d, "ids.bin"), dtype="<i4", mode="r"), offs

    def row(opened, i):
        data, offs = opened
        return data[offs[i]:offs[i + 1]]

    return write, open_, row


def paddlenlp_format(flat, offsets, d):
    from paddlenlp.data.indexed_dataset import make_builder, make_dataset

    prefix = os.path.join(d, "ids")

    def write():
        builder = make_builder(prefix + ".bin", "mmap", np.int32)
        for i in range(len(offsets) - 1):
            builder.add_item(flat[offsets[i]:offsets[i + 1]])
            builder.end_document()
        builder.finalize(prefix + ".idx")

    def open_():
        return make_dataset(prefix, "mmap", skip_warmup=True)

    return write, open_, lambda ds, i: ds[i]


def _table(flat, offsets):
    import pyarrow as pa

    return pa.table({"input_ids": pa.LargeListArray.from_arrays(pa.array(offsets),
                                                                pa.array(flat))})


def arrow_format(flat, offsets, d):
    import pyarrow as pa

    path = os.path.join(d, "ids.arrow")

    def write():
        table = _table(flat, offsets)
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table, max_chunksize=1 << 16)

    def open_():
        return pa.ipc.open_file(pa.memory_map(path)).read_all().column("input_ids")

    return write, open_, lambda col, i: col[i].values.to_numpy()


def parquet_format(flat, offsets, d):
    import pyarrow.parquet as pq

    path = os.path.join(d, "ids.parquet")

    def write():
        pq.write_table(_table(flat, offsets), path)

    def open_():
        return pq.read_table(path, memory_map=True).column("input_ids")

    return write, open_, lambda col, i: col[i].values.to_numpy()


FORMATS = {"numpy": numpy_format, "paddlenlp": paddlenlp_format, "arrow": arrow_format,
           "parquet": parquet_format}


def measure(name, flat, offsets, workdir, reads):
    d = os.path.join(workdir, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    write, open_, row = FORMATS[name](flat, offsets, d)
    _, write_s = _timed(write)
    opened, open_s = _timed(open_)
    idx = np.random.default_rng(0).integers(0, len(offsets) - 1, reads)
    total, read_s = _timed(lambda: sum(int(np.asarray(row(opened, int(i))).sum()) for i in idx))
    expected = sum(int(flat[offsets[i]:offsets[i + 1]].sum()) for i in idx)
    if total != expected:
        raise SystemExit(f"{name}: random rows read back wrong ({total} != {expected})")
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    return {"write_s": write_s, "open_s": open_s, f"random_{reads}_rows_s": read_s,
            "bytes": size, "loadavg_1m": round(os.getloadavg()[0], 2)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", required=True, help="a store cache entry directory")
    ap.add_argument("--workdir", default="/tmp/store_formats")
    ap.add_argument("--out", default=os.path.join("output", "bench", "store_formats"))
    ap.add_argument("--reads", type=int, default=10_000)
    ap.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
    args = ap.parse_args(argv)
    flat, offsets = load_ids(args.store)
    report = {"command": " ".join(sys.argv), "machine": machine(), "rows": len(offsets) - 1,
              "tokens": int(len(flat)), "results": {}}
    for name in args.formats:
        report["results"][name] = r = measure(name, flat, offsets, args.workdir, args.reads)
        print(name, json.dumps(r), flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".json", "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {args.out}.json")


if __name__ == "__main__":
    main()
