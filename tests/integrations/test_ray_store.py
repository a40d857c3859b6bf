"""The store built on a local Ray cluster is byte-identical to the one-machine store and is reused."""
import filecmp
import json
import os

import pytest

ray = pytest.importorskip("ray")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORDS = ["物流很快", "包装完好", "质量太差了", "服务很差", "再也不来了", "房间干净", "早餐丰富",
         "推荐", "一般般", "真好看"]


@pytest.fixture(scope="module")
def cluster():
    with pytest.MonkeyPatch.context() as mp:  # workers import this checkout's ppvarlen
        mp.setenv("PYTHONPATH", os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH"))
                                                if p))
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    """5,000 labelled lines of varied length: several encoding chunks (2,000 each) per split."""
    path = tmp_path_factory.mktemp("corpus") / "train.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for i in range(5000):
            text = "".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(1 + i % 9)) + str(i)
            f.write(json.dumps({"text": text, "label": ["negative", "positive"][i % 2]},
                               ensure_ascii=False) + "\n")
    return str(path)


def _cfg(corpus_file, cache_dir, *extra):
    from ppvarlen.config import load_config

    return load_config(overrides=["Data.corpus=jsonl", f"Data.train_file={corpus_file}",
                                  f"Data.cache_dir={cache_dir}", "Data.max_len=24",
                                  "Data.num_proc=1", *extra])


def _files(root):
    out = set()
    for d, _, names in os.walk(root):
        out |= {os.path.relpath(os.path.join(d, n), root) for n in names if not n.endswith(".lock")}
    return out


# The driver only cuts the raw file into 16 KB chunks of lines (about 40 here) and ships them;
# Ray tasks parse, count (Scanner) and encode (_ChunkEncoder) them.  With Data.limit the train
# split's tokens are counted again over the kept examples (_CountJob).
@pytest.mark.parametrize("mode", ["streamed", "limited"])
def test_ray_built_store_equals_the_one_machine_store(cluster, corpus_file, tmp_path,
                                                     monkeypatch, mode):
    from ppvarlen.data import chunks as record_chunks
    from ppvarlen.data import sources
    from ppvarlen.integrations import ray_store
    from ppvarlen.store_build import build_datasets

    chunks = []  # the jobs the Ray mapper ran
    real_mapper = ray_store.ray_mapper

    def counting_mapper(*args, **kwargs):
        mapper = real_mapper(*args, **kwargs)

        def run(fn, jobs):
            for out in mapper(fn, jobs):
                chunks.append(type(getattr(fn, "fn", fn)).__name__)
                yield out
        return run

    monkeypatch.setattr(ray_store, "ray_mapper", counting_mapper)
    monkeypatch.setattr(record_chunks, "CHUNK_BYTES", 16 << 10)
    extra = ("Data.limit=5000",) if mode == "limited" else ()
    local = build_datasets(_cfg(corpus_file, tmp_path / "local", *extra).Data)
    if mode == "streamed":  # the driver must not parse the corpus itself
        monkeypatch.setattr(sources, "read_corpus", lambda cfg: pytest.fail("driver read it"))
    on_ray = ray_store.build_store_on_ray(_cfg(corpus_file, tmp_path / "ray", *extra).Data,
                                          max_in_flight=2)
    if mode == "streamed":
        size = os.path.getsize(corpus_file)
        assert chunks.count("Scanner") == chunks.count("_ChunkEncoder") >= size // (16 << 10)
        assert set(chunks) == {"Scanner", "_ChunkEncoder"}
    else:  # Data.limit: the train split's tokens counted again, of the kept examples only
        assert set(chunks) == {"Scanner", "_CountJob", "_ChunkEncoder"}
    a, b = local.stats["store"]["dir"], on_ray.stats["store"]["dir"]
    assert os.path.basename(a) == os.path.basename(b)  # the same cache key
    assert on_ray.stats["store"]["cache"].startswith("built")
    files = _files(a)
    assert files == _files(b) and any(f.endswith(".bin") for f in files)
    assert {"train/input_ids.bin", "dev/manifest.json", "test/lengths.npy", "entry.json"} <= files
    _, mismatch, errors = filecmp.cmpfiles(a, b, sorted(files), shallow=False)
    assert mismatch == [] and errors == []
    assert len(on_ray.train) + len(on_ray.dev) + len(on_ray.test) == 5000

    # a one-machine command (no Ray) with the same config reads the Ray-built store as it is
    again = build_datasets(_cfg(corpus_file, tmp_path / "ray", *extra).Data)
    assert again.stats["store"]["cache"] == "reused" and again.stats["store"]["dir"] == b
    assert (again.train.lengths == local.train.lengths).all()


def test_a_bad_line_stops_the_ray_build_naming_it(cluster, tmp_path):
    from ppvarlen.data.errors import DataError
    from ppvarlen.integrations.ray_store import build_store_on_ray

    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps({"text": f"好{i}", "label": "a"}) + "\n" for i in range(30))
                    + '{"text": 5, "label": "a"}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"bad.jsonl.*31"):
        build_store_on_ray(_cfg(str(path), tmp_path / "c").Data)
    assert not os.path.isdir(tmp_path / "c") or not any(
        f.endswith("manifest.json") for f in _files(tmp_path / "c"))


def test_the_mapper_needs_a_cluster(corpus_file, tmp_path, monkeypatch):
    from ppvarlen.integrations.ray_store import build_store_on_ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with pytest.raises(RuntimeError, match="ray.init"):
        build_store_on_ray(_cfg(corpus_file, tmp_path / "x").Data)
