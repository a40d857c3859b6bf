"""Build the encoded-corpus store on a Ray cluster: the same store the one-machine build writes.

    build_store_on_ray(cfg.Data)          # on a running cluster (ray.init / --address auto)
    python deploy/ray/build_store.py -c configs/sentiment/transformer.yaml \\
        -o Data.corpus=jsonl -o Data.train_file=big.jsonl [--address auto]

The store build (``ppvarlen.store_build.build_datasets``) cuts its work into jobs and runs
them with ``utils.parallel``; inside ``use_mapper`` the jobs run as Ray tasks on every CPU of the
cluster instead of a local fork pool.  Every corpus takes the one ingestion path
(``data.sources``): the driver only cuts the raw files into chunks (about 4 MB of whole lines, a
Parquet row group) and ships each chunk's bytes with its job, the tasks parse, check, count the
vocabulary (pass 1) and encode (pass 2).  The driver gets the
results back in job order and writes the store with the store's own writer, so the files are
byte-identical to a one-machine build (tests/integrations/test_ray_store.py, both ways) and land in the same
content-keyed cache entry (``Data.cache_dir``): ``tools/train.py`` with the same config, and
every training rank, then reads it ("store cache: reusing ...") unchanged.

Ray tasks rather than Ray Data: a job's result is the counts or the numpy columns the writer
appends in order, which Ray Data would push through Arrow blocks for nothing.  The job
function (tokenizer and vocabulary included) is put in the object store once.  At most
``max_in_flight`` jobs are pending, so the driver holds a bounded number of chunks.  The input
files need only be readable by the driver; ``Data.cache_dir`` must be on storage the training
machines see (a shared filesystem) for them to reuse the store.
"""
import argparse
import collections
import json

from ppvarlen.cli import positive_int, run_command
from ppvarlen.config import add_config_args, load_config
from ppvarlen.utils.parallel import use_mapper
from ppvarlen.store_build import build_datasets
from ppvarlen.utils.log import setup_logging

from .ray_cluster import add_cluster_args, ray_cluster


def _run_job(fn, job):
    return fn(job)


def ray_mapper(max_in_flight=None, num_cpus=1):
    """A ``utils.parallel.use_mapper`` mapper running each job as a Ray task, results in order."""
    def mapper(fn, jobs):
        import ray

        if not ray.is_initialized():
            raise RuntimeError("build_store_on_ray needs a Ray cluster: call ray.init() first "
                               "(or pass --address to deploy/ray/build_store.py)")
        limit = max_in_flight or max(2, 2 * int(ray.cluster_resources().get("CPU", 1)))
        run = ray.remote(num_cpus=num_cpus)(_run_job)
        fn_ref = ray.put(fn)
        pending = collections.deque()
        for job in jobs:
            pending.append(run.remote(fn_ref, job))
            if len(pending) >= limit:
                yield ray.get(pending.popleft())
        while pending:
            yield ray.get(pending.popleft())
    return mapper


def build_store_on_ray(data_cfg, task_hint=None, splits=("train", "dev", "test"),
                       extra_corpora=(), max_in_flight=None):
    """Encode ``splits`` of ``data_cfg``'s corpus into its cache entry on the running Ray
    cluster -> the ``DataBundle`` (its ``stats["store"]`` names the entry and whether it was
    built or reused)."""
    with use_mapper(ray_mapper(max_in_flight)):
        return build_datasets(data_cfg, task_hint=task_hint, splits=splits,
                              extra_corpora=extra_corpora)


def main(argv=None):
    """``deploy/ray/build_store.py``: exit 0; 2 on a bad config or data (ppvarlen.cli's policy)."""
    parser = add_config_args(argparse.ArgumentParser(
        description="Encode a config's corpus into the store cache on a Ray cluster; "
        "tools/train.py with the same config then reuses it"))
    add_cluster_args(parser)
    parser.add_argument("--max-in-flight", type=positive_int, default=None,
                        help="chunks pending at once (default: 2 x the cluster's CPUs)")
    return run_command(parser, argv, _build_store)


def _build_store(args):
    setup_logging()
    cfg = load_config(args.config, args.override)
    with ray_cluster(args):
        # the trainer's arguments, so the entry is the one tools/train.py looks up
        bundle = build_store_on_ray(cfg.Data, task_hint=cfg.Train.task,
                                    extra_corpora=cfg.Pretrain.extra_corpora,
                                    max_in_flight=args.max_in_flight)
    sizes = {s: len(getattr(bundle, s)) for s in ("train", "dev", "test")}
    print(json.dumps({"store": bundle.stats["store"], "task": bundle.task, "items": sizes},
                     ensure_ascii=False))
    return 0
