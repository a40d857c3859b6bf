"""A Parquet corpus pyarrow cannot read is a DataError naming the file (and the row group),
through the trainer's entry (``store_build.build_datasets``), on one process and across the
worker pool; a string cell that is not UTF-8 is a bad line like a JSONL one."""
import pickle

import pytest

from ppvarlen.data.errors import DataError
from ppvarlen.store_build import build_datasets
from ppvarlen.utils import parallel

from test_sources import data_cfg

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

ROWS = [{"text": f"好评 {i} 很好", "label": "pos" if i % 2 else "neg"} for i in range(300)]


def _good(path):
    pq.write_table(pa.Table.from_pylist(ROWS), path, row_group_size=100)
    return path


def _build(tmp_path, path, num_proc, **data):
    data.setdefault("cache_dir", str(tmp_path / f"cache{num_proc}"))
    return build_datasets(data_cfg(corpus="parquet", train_file=str(path), num_proc=num_proc,
                                   **data))


def _damaged_row_group(path, group):
    """The file with the first data page of row group ``group`` overwritten."""
    data = bytearray(path.read_bytes())
    start = pq.ParquetFile(path).metadata.row_group(group).column(0).data_page_offset
    data[start:start + 64] = b"\xab" * 64
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("num_proc", [1, 2])
def test_a_truncated_parquet_file_is_a_data_error_naming_it(tmp_path, num_proc):
    path = _good(tmp_path / "reviews.parquet")
    path.write_bytes(path.read_bytes()[:-200])
    with pytest.raises(DataError) as e:
        _build(tmp_path, path, num_proc)
    msg = str(e.value)
    assert msg.startswith(f"{path}: cannot read as Parquet (pyarrow: ")
    assert "ParquetFile(" in msg and "\n" not in msg


@pytest.mark.parametrize("num_proc", [1, 2])
def test_garbage_bytes_named_parquet_are_a_data_error_naming_the_file(tmp_path, num_proc):
    path = tmp_path / "garbage.parquet"
    path.write_bytes(bytes(range(256)) * 20)
    with pytest.raises(DataError, match=r"garbage\.parquet: cannot read as Parquet"):
        _build(tmp_path, path, num_proc, task="classification")


@pytest.mark.parametrize("num_proc", [1, 2])
def test_a_damaged_row_group_is_a_data_error_naming_file_and_group(tmp_path, num_proc):
    """Read by a worker of the pool when num_proc=2: the message, not a pool traceback."""
    path = _damaged_row_group(_good(tmp_path / "reviews.parquet"), 2)
    with pytest.raises(DataError) as e:
        _build(tmp_path, path, num_proc)
    msg = str(e.value)
    assert msg.startswith(f"{path}: row group 2 (0-based; its first row is row 201): cannot "
                          f"read as Parquet (pyarrow: ")
    assert "\n" not in msg
    again = pickle.loads(pickle.dumps(e.value))  # what a worker's error crosses the pool as
    assert type(again) is DataError and str(again) == msg


def test_a_string_cell_not_utf8_is_a_bad_line(tmp_path):
    texts = pa.array([r["text"].encode() for r in ROWS[:9]] + [b"\xff\xfe bad"], pa.binary())
    # pyarrow writes a string column without checking its bytes: the file a buggy writer makes
    column = pa.Array.from_buffers(pa.string(), len(texts), texts.buffers())
    path = tmp_path / "mixed.parquet"
    pq.write_table(pa.table({"text": column, "label": [r["label"] for r in ROWS[:10]]}), path)
    with pytest.raises(DataError, match=r"mixed\.parquet:10: field 'text' is not valid UTF-8 "
                                        r"\(bad byte b'\\xff' at byte 0 of the cell\)"):
        _build(tmp_path, path, 1)
    bundle = _build(tmp_path, path, 2, skip_invalid=True, cache_dir=str(tmp_path / "skip"))
    files = bundle.stats["corpus"]["files"]["train"]
    assert files["skipped"] == {"not_utf8": 1} and files["examples"] == 9
    assert "not valid UTF-8" in files["first_skipped"]["not_utf8"]


def test_a_damaged_row_group_under_a_mapper_is_the_same_data_error(tmp_path):
    """With a mapper (the Ray store build) the parent reads the row groups to ship them."""
    path = _damaged_row_group(_good(tmp_path / "reviews.parquet"), 1)
    with parallel.use_mapper(lambda fn, jobs: map(fn, jobs)):
        with pytest.raises(DataError, match=r"reviews\.parquet: row group 1 \(0-based; its first "
                                            r"row is row 101\): cannot read as Parquet"):
            _build(tmp_path, path, 2)


def test_batch_inference_shards_report_a_damaged_parquet_file_the_same_way(tmp_path):
    """Ray batch inference's shard reader (integrations/text_shards.py) words a Parquet file or
    row group pyarrow cannot read as the store build does: the file, the row group, the fix."""
    from ppvarlen.integrations.text_shards import plan_units, read_unit

    path = _damaged_row_group(_good(tmp_path / "reviews.parquet"), 1)
    units = plan_units(str(path))
    assert [u["row_group"] for u in units] == [0, 1, 2]
    assert len(read_unit(units[0])) == 100
    with pytest.raises(DataError) as e:
        read_unit(units[1])
    assert str(e.value).startswith(f"{path}: row group 1 (0-based; its first row is row 101): "
                                   f"cannot read as Parquet (pyarrow: ")
    path.write_bytes(path.read_bytes()[:-200])
    with pytest.raises(DataError) as e:
        plan_units(str(path))
    assert str(e.value).startswith(f"{path}: cannot read as Parquet (pyarrow: ")
