"""Training throughput (real tokens/s), side by side.

    python benchmarks/train_throughput.py [--steps 10] [--out output/bench]           # batching
    python benchmarks/train_throughput.py --what static [--steps 30] [--configs ...]   # to_static
    python benchmarks/train_throughput.py --what cpu [--steps 20] [--configs ...]      # CPU settings
    python benchmarks/train_throughput.py --what anchor [--steps 20]                   # vs PaddleNLP

--what batching (the default): the sentiment Transformer under three batching schemes:

* pad_to_512   — every example padded to Data.max_len=512 (32 per batch): the naive baseline;
* random       — shuffled fixed batches of 32, padded to the batch's longest (dynamic padding);
* token_budget — length-sorted pools packed to Data.max_tokens padded tokens (the default).

Each scheme trains the same model (configs/sentiment/transformer.yaml, max_len 512) for
--steps optimizer steps after 2 warm-up steps and counts REAL (non-pad) tokens per second
of step time.  Writes train_throughput.json and train_throughput.png under --out.

The other modes train variants side by side on their own batches, INTERLEAVED step by step
(variant A step, variant B step, ...) so that load from other jobs hits all alike.  Each variant
runs in a process of its own (VariantProcess), because what is compared includes process-wide
settings: math threads, the C heap, MKL's CPU type, Paddle's executor flags.  Before each step
the machine idles --gap seconds (default 0.25), so the OpenMP threads of the variant that just
stepped, which spin up to 200 ms, are asleep and do not take the cores of the next one; that
idle makes every step start colder than in a real run (all variants alike).

--what static: for each shipped config, with ppvarlen's CPU settings (the trainer's defaults):
* eager           — the trainer with Train.to_static=false (dygraph);
* static_serial   — Train.to_static=true: forward + loss as one static program, backward
                    through it, AdamW eager (ppvarlen/engine/static_step.py), the programs'
                    ops on one thread (Train.static_executor=serial) and MKL on the cores;
* static_threaded — the same on Paddle's thread pool (Train.static_executor=threaded; one math
                    thread then, see ppvarlen/engine/cpu_settings.py);
* whole_step  — forward, backward, gradient clipping and AdamW as ONE static program
                (paddle.static + optimizer.minimize, run by an Executor with the serial
                executor flags).  Paddle 3.3.1's to_static cannot do this: a traced loss
                (pir.Value) has no .backward(), and optimizer.minimize inside a to_static
                function fails in ir_backward ("Value Wrapper is only support None and
                pir.Value": the layer's parameters stay dygraph tensors).  The model classes
                are built directly in static mode instead.  A model that cannot is recorded.
Writes train_throughput_static.json / .png.

--what cpu: eager and static_serial with ppvarlen's CPU settings (Train.cpu_threads null:
the cores; Train.keep_freed_memory true) against the same with Paddle's (one math thread) and
glibc's (heap returned to the OS) -- eager_paddle_cpu, static_serial_paddle_cpu -- and static
with one of the two only: static_serial_one_thread (heap kept), static_serial_glibc_heap (threads).
Writes train_throughput_cpu.json / .png.

--what anchor: the issue-16 anchor model (transformer.yaml at 2 layers x d128, 4 heads, ffn
512, max_len 512) trained by ppvarlen eager and Train.to_static (both executors), and the plain
PaddleNLP recipe: SamplerHelper shuffle -> sort in pools -> token-budget batch (the same
Data.max_tokens and pool size), paddlenlp.data.Pad, the same model and AdamW, eager -- twice:
* paddlenlp_recipe_plain — with Paddle's defaults for everything (the baseline: what a
  PaddleNLP user runs): one math thread, glibc's heap, and MKL's own kernel choice
  (ppvarlen/_mkl.py selects MKL's AVX2 kernels on AMD CPUs when a command or Trainer starts; switched off here);
* paddlenlp_recipe       — given every process setting ppvarlen's trainer makes (ratios against
  it are printed as well: what to_static, the trainer and batching give on their own).
Writes train_throughput_anchor.json / .png.

Every mode times the optimizer step only (collation excluded for every variant alike), after
2 warm-up steps per variant, and counts REAL (non-pad) tokens (seq2seq: both sides).
The CPU may be shared with other jobs: the JSON records the load average before and after, and
each variant's process CPU time beside its wall time (real_tokens_per_cpu_s, cpu_time_speedup_*;
with two math threads, MKL's spinning threads count too).
"""
import argparse
import json
import os
import time


SCHEMES = {
    "pad_to_512": ["Data.sampler=bucket", "Data.buckets=[512]", "Data.pad_to_bucket=true",
                   "Data.max_tokens=16384"],
    "random": ["Data.sampler=random", "Data.batch_size=32"],
    "token_budget": ["Data.sampler=token_budget", "Data.max_tokens=4096"],
}


def measure(config, overrides, steps, out_dir):
    from ppvarlen.config import load_config
    from ppvarlen.engine.trainer import Trainer

    cfg = load_config(config, ["Data.max_len=512", "Model.max_position=512", "Train.progress_bar=false",
                               f"Global.output_dir={out_dir}", "Global.overwrite_output_dir=true"]
                      + overrides)  # a scratch directory: a re-run replaces the last one's
    t = Trainer(cfg)
    t.ddp_model.train()
    real = padded = examples = 0
    secs = 0.0
    for i, idxs in enumerate(t.sampler):
        if i >= steps + 2:
            break
        batch = t.collate([t.data.train[j] for j in idxs])
        t0 = time.perf_counter()
        t.train_step(batch)
        dt = time.perf_counter() - t0
        if i >= 2:  # skip warm-up steps (allocator, first kernels)
            secs += dt
            real += int(batch["seq_len"].sum())
            padded += int(batch["input_ids"].size)
            examples += len(idxs)
    return {"steps": steps, "seconds": round(secs, 3), "real_tokens": real, "padded_tokens": padded,
            "real_tokens_per_s": real / secs, "examples_per_s": examples / secs,
            "padding_efficiency": real / padded}


def batching(args):
    load_before = os.getloadavg()
    results = {name: measure(args.config, ov, args.steps, os.path.join(args.out, "train_throughput_runs", name))
               for name, ov in SCHEMES.items()}
    base = results["pad_to_512"]["real_tokens_per_s"]
    for r in results.values():
        r["speedup_vs_pad_to_512"] = r["real_tokens_per_s"] / base
    report = {"config": args.config, "cpu_count": os.cpu_count(), "loadavg_before": load_before,
              "loadavg_after": os.getloadavg(), "schemes": results}
    with open(os.path.join(args.out, "train_throughput.json"), "w") as f:
        json.dump(report, f, indent=2)
    for name, r in results.items():
        print(f"{name:>13}: {r['real_tokens_per_s']:8.0f} real tok/s  {r['examples_per_s']:6.1f} ex/s  "
              f"padding eff {r['padding_efficiency']:.3f}  x{r['speedup_vs_pad_to_512']:.2f}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = list(results)
    ax.bar(names, [results[n]["real_tokens_per_s"] for n in names], color=["C3", "C1", "C2"])
    for i, n in enumerate(names):
        ax.text(i, results[n]["real_tokens_per_s"], f"x{results[n]['speedup_vs_pad_to_512']:.1f}\n"
                f"pad eff {results[n]['padding_efficiency']:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("real tokens / s (training)")
    ax.set_title("sentiment Transformer, CPU")
    fig.tight_layout()
    from ppvarlen.utils.io import atomic_save_png

    atomic_save_png(fig, os.path.join(args.out, "train_throughput.png"), dpi=100)

# ---------------------------------------------------------------- eager vs static, interleaved

SHIPPED = ["configs/sentiment/transformer.yaml", "configs/g2p/transformer.yaml",
           "configs/sentiment/transformer_ngram.yaml", "configs/sentiment/wide_deep.yaml",
           "configs/sentiment/bilstm.yaml", "configs/sentiment/ernie_tiny.yaml",
           "configs/ner/bigru_crf.yaml"]  # pretrain_mlm.yaml trains through tools/pretrain.py
ANCHOR = ["Data.max_len=512", "Model.max_position=512", "Model.hidden_size=128",
          "Model.num_layers=2", "Model.num_heads=4", "Model.ffn_size=512"]


def build_trainer(config, overrides, out_dir, to_static):
    from ppvarlen.config import load_config
    from ppvarlen.engine.trainer import Trainer

    cfg = load_config(config, overrides + ["Train.progress_bar=false", f"Global.output_dir={out_dir}",
                                           "Global.overwrite_output_dir=true",  # a scratch dir
                                           f"Train.to_static={str(to_static).lower()}"])
    return Trainer(cfg)


def endless(sampler):
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from sampler
        epoch += 1


class TrainerVariant:
    """The ppvarlen trainer (eager, or Train.to_static with a Train.static_executor) on its own
    batches."""

    def __init__(self, config, overrides, out_dir, to_static, executor="serial"):
        self.t = build_trainer(config, overrides + [f"Train.static_executor={executor}"],
                               out_dir, to_static)
        self.t.ddp_model.train()
        self.order = endless(self.t.sampler)

    def next_batch(self):
        return self.t.collate([self.t.data.train[i] for i in next(self.order)])

    def step(self, batch):
        self.t.train_step(batch)

    def real_tokens(self, batch):
        return self.t.task.token_counts(batch)[0]

    def info(self):
        sl = self.t.static_loss
        return {"traced_count": sl.traced_count()} if sl is not None else {}


class WholeStepVariant(TrainerVariant):
    """Forward + backward + clipping + AdamW as one paddle.static program (Executor.run)."""

    def __init__(self, config, overrides, out_dir):
        import paddle

        from ppvarlen.engine.static_step import fields_read

        super().__init__(config, overrides, out_dir, False)
        t = self.t
        probe = t.collate([t.data.train[i] for i in range(2)])
        self.fields = fields_read(t._batch_loss, t.model, probe)
        self.exe = paddle.static.Executor(paddle.CPUPlace())
        paddle.enable_static()
        try:
            # what is timed must compute eager's loss: an eval-mode (no dropout) twin of the
            # program, given the eager model's weights, must give its loss on the same batch
            check, check_loss, check_model = self._build(train=False)
            scope = paddle.static.global_scope()
            for k, v in t.model.state_dict().items():
                scope.find_var(check_model.state_dict()[k].name).get_tensor().set(
                    v.numpy(), paddle.CPUPlace())
            static_loss = float(self.exe.run(check, feed=self._feed(probe),
                                             fetch_list=[check_loss])[0])
            self.main, self.loss, _ = self._build(train=True)
        finally:
            paddle.disable_static()
        t.model.eval()
        with paddle.no_grad():
            eager_loss = float(t._batch_loss(t.model, probe))
        t.model.train()
        if not abs(static_loss - eager_loss) <= 1e-4 * max(1.0, abs(eager_loss)):
            raise ValueError(f"the whole-step program computes another loss than eager "
                             f"({static_loss:.6f} vs {eager_loss:.6f}, same batch and weights)")

    def _build(self, train):
        import paddle

        from ppvarlen.engine.optim import build_optimizer
        from ppvarlen.models import build_model

        t, enc = self.t, self.t.data.encoder
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            feeds = {n: paddle.static.data(n, [None] * nd, dt) for n, dt, nd in self.fields}
            model = build_model(t.cfg.Model, enc.vocab_size, t.num_labels, enc.pad_id, t.task.name)
            t.task.configure_model(model, t.cfg, enc)  # seq2seq: its label smoothing
            model.train() if train else model.eval()
            loss = t._batch_loss(model, feeds)
            if train:
                optimizer, self.scheduler = build_optimizer(model, t.cfg.Optimizer, t.total_steps)
                optimizer.minimize(loss)
        self.exe.run(startup)
        return main, loss, model

    def _feed(self, batch):
        return {n: batch[n] for n, _, _ in self.fields}

    def step(self, batch):
        import paddle

        from ppvarlen.engine.static_step import executor_flags

        paddle.enable_static()
        try:  # the executor settings of Train.to_static's default (serial), for a like comparison
            with executor_flags("serial"):
                self.exe.run(self.main, feed=self._feed(batch), fetch_list=[self.loss])
        finally:
            paddle.disable_static()
        self.scheduler.step()

    def info(self):
        return {}


class PaddleNLPRecipe(TrainerVariant):
    """The plain PaddleNLP recipe on the same encoded train split, model and optimizer."""

    def __init__(self, config, overrides, out_dir):
        import paddle
        from paddlenlp.data import Pad, SamplerHelper, Stack
        from paddlenlp.datasets import MapDataset

        from ppvarlen.engine.optim import build_optimizer
        from ppvarlen.models import build_model

        super().__init__(config, overrides, out_dir, False)
        t, enc, d = self.t, self.t.data.encoder, self.t.cfg.Data
        paddle.seed(t.cfg.Global.seed)
        self.model = build_model(t.cfg.Model, enc.vocab_size, t.num_labels, enc.pad_id, t.task.name)
        self.model.train()
        self.optimizer, self.scheduler = build_optimizer(self.model, t.cfg.Optimizer, t.total_steps)
        items = [t.data.train[i] for i in range(len(t.data.train))]  # store items: numpy rows
        self.examples = MapDataset([(it["input_ids"], len(it["input_ids"]), it["label"])
                                    for it in items])
        pad, stack = Pad(axis=0, pad_val=enc.pad_id, dtype="int64"), Stack(dtype="int64")
        self.collate_fn = lambda rows: (pad([r[0] for r in rows]), stack([r[1] for r in rows]),
                                        stack([r[2] for r in rows]))
        # the PaddleNLP machine-translation batching: longest-in-batch x count <= max_tokens
        self.sampler = (SamplerHelper(self.examples).shuffle(seed=t.cfg.Global.seed)
                        .sort(key=lambda i, ds: ds[i][1], buffer_size=d.max_tokens // 64 * d.pool_size)
                        .batch(batch_size=d.max_tokens, batch_size_fn=lambda new, count, sofar,
                               ds: max(sofar, ds[new][1]), key=lambda sofar, count: sofar * count)
                        .shuffle(seed=t.cfg.Global.seed))
        self.order = self._endless()

    def _endless(self):
        while True:
            yield from self.sampler

    def next_batch(self):
        ids, seq_len, labels = self.collate_fn([self.examples[i] for i in next(self.order)])
        return {"input_ids": ids, "seq_len": seq_len, "labels": labels}

    def step(self, batch):
        import paddle

        loss, _ = self.model(*(paddle.to_tensor(batch[k]) for k in ("input_ids", "seq_len", "labels")))
        loss.backward()
        self.optimizer.step()
        self.optimizer.clear_grad()
        self.scheduler.step()

    def info(self):
        return {}


# Paddle's defaults for the CPU settings ppvarlen's trainer makes (ppvarlen/engine/cpu_settings.py:
# one math thread is FLAGS_paddle_num_threads=1; keep_freed_memory false leaves glibc alone)
# and for MKL's kernels on AMD (ppvarlen/_mkl.py, decided when a Trainer is built, from the environment)
PADDLE_CPU_DEFAULTS = ["Train.cpu_threads=1", "Train.keep_freed_memory=false"]
PADDLE_MKL_DEFAULT = {"MKL_DEBUG_CPU_TYPE": None, "PPVARLEN_MKL_AVX2": "0"}

# variant name -> (what it builds, extra config overrides, environment changes for its process)
VARIANTS = {
    "eager": ("trainer", {"to_static": False}, [], {}),
    "static_serial": ("trainer", {"to_static": True, "executor": "serial"}, [], {}),
    "static_threaded": ("trainer", {"to_static": True, "executor": "threaded"}, [], {}),
    "whole_step": ("whole_step", {}, [], {}),
    # --what cpu: the same trainers with Paddle's own thread count and glibc's own heap policy
    "eager_paddle_cpu": ("trainer", {"to_static": False}, PADDLE_CPU_DEFAULTS, {}),
    "static_serial_paddle_cpu": ("trainer", {"to_static": True, "executor": "serial"},
                                 PADDLE_CPU_DEFAULTS, {}),
    # ... and each of the two settings alone
    "static_serial_one_thread": ("trainer", {"to_static": True, "executor": "serial"},
                                 ["Train.cpu_threads=1"], {}),
    "static_serial_glibc_heap": ("trainer", {"to_static": True, "executor": "serial"},
                                 ["Train.keep_freed_memory=false"], {}),
    # --what anchor: the PaddleNLP recipe as a PaddleNLP user runs it (all of Paddle's defaults),
    # and the same recipe given every process setting ppvarlen's trainer makes
    "paddlenlp_recipe_plain": ("recipe", {}, PADDLE_CPU_DEFAULTS, PADDLE_MKL_DEFAULT),
    "paddlenlp_recipe": ("recipe", {}, [], {}),
}


def _build_variant(kind, kwargs, config, overrides, out_dir):
    if kind == "whole_step":
        return WholeStepVariant(config, overrides, out_dir)
    if kind == "recipe":
        return PaddleNLPRecipe(config, overrides, out_dir)
    return TrainerVariant(config, overrides, out_dir, **kwargs)


def _variant_process(conn, kind, kwargs, config, overrides, out_dir):
    """A variant's own process: builds it, then answers next / step / info over a Pipe."""
    try:
        variant = _build_variant(kind, kwargs, config, overrides, out_dir)
    except Exception as e:  # noqa: BLE001 -- recorded in the JSON: which variant cannot run and why
        conn.send(("failed", f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}"))
        return
    conn.send(("ready", {"MKL_DEBUG_CPU_TYPE": os.environ.get("MKL_DEBUG_CPU_TYPE"),
                         "cpu_settings": variant.t.cpu_settings}))
    batch = None
    while True:
        request = conn.recv()
        if request == "next":
            batch = variant.next_batch()
            conn.send((batch, variant.real_tokens(batch)))
        elif request == "step":
            t0, c0 = time.perf_counter(), time.process_time()
            variant.step(batch)
            conn.send((time.perf_counter() - t0, time.process_time() - c0))
        else:
            conn.send(variant.info())
            return


class VariantProcess:
    """One variant in a process of its own, so that process-wide settings are its own: math
    threads, the C heap, MKL's CPU type (all read or set once per process) and Paddle's executor
    flags.  Stepped in turn with the others; its step times and CPU time are measured in it."""

    def __init__(self, name, config, overrides, out_dir):
        import multiprocessing

        kind, kwargs, extra, env = VARIANTS[name]
        self.conn, child = multiprocessing.Pipe()
        saved = {k: os.environ.get(k) for k in env}
        for k, v in env.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        try:  # a spawned child starts from a fresh interpreter with this environment
            self.proc = multiprocessing.get_context("spawn").Process(
                target=_variant_process, args=(child, kind, kwargs, config, overrides + extra,
                                               out_dir), daemon=True)
            self.proc.start()
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        self.overrides = extra

    def wait_ready(self):
        status, detail = self.conn.recv()
        if status == "failed":
            self.proc.join(timeout=30)
            raise RuntimeError(detail)
        self.process = detail

    def next_batch(self):
        self.conn.send("next")
        return self.conn.recv()

    def step(self):
        self.conn.send("step")
        return self.conn.recv()

    def info(self):
        self.conn.send("info")
        info = self.conn.recv()
        self.proc.join(timeout=30)
        return dict(info, process=self.process, overrides=self.overrides)


def interleaved(variants, steps, warmup=2, gap=0.25):
    """Round-robin one step of every variant at a time (order reversed every other round);
    per variant: real tok/s of step time.  ``gap`` seconds of idle between two steps: MKL's
    OpenMP workers spin up to 200 ms (KMP_BLOCKTIME) after a multi-threaded step, and must not
    take the cores from the next variant's process."""
    stats = {name: {"seconds": 0.0, "cpu_seconds": 0.0, "real_tokens": 0, "padded_tokens": 0,
                    "steps": 0} for name in variants}
    times = {name: [] for name in variants}  # per measured step, for the paired comparison
    shapes = {name: [] for name in variants}
    for i in range(warmup + steps):
        names = list(variants) if i % 2 == 0 else list(variants)[::-1]  # no fixed first/last
        for name in names:
            v = variants[name]
            batch, real = v.next_batch()
            time.sleep(gap)
            dt, cpu = v.step()
            if i >= warmup:
                times[name].append(dt)
                shapes[name].append(tuple(a.shape for a in batch.values()))
                s = stats[name]
                s["seconds"] += dt
                s["cpu_seconds"] += cpu
                s["steps"] += 1
                s["real_tokens"] += real
                s["padded_tokens"] += sum(int(a.size) for k, a in batch.items()
                                          if k in ("input_ids", "src_ids", "tgt_in"))
    for name, s in stats.items():
        s["step_seconds"] = [round(t, 4) for t in times[name]]
        s["real_tokens_per_s"] = s["real_tokens"] / s["seconds"]
        # the variant process's CPU time (all its threads): what a step costs when other jobs
        # take the cores away; with one math thread it is steadier than wall time
        s["real_tokens_per_cpu_s"] = s["real_tokens"] / s["cpu_seconds"]
        s["padding_efficiency"] = s["real_tokens"] / s["padded_tokens"]
        s.update(variants[name].info())
    return stats, shapes


def paired_speedups(stats, shapes, baseline):
    """Median over steps of (baseline step time / variant step time) on the SAME batch.

    Variants built from one config replay the same batches in the same round, so each
    round is a paired measurement; its median shrugs off the load bursts of a shared CPU.
    """
    base = stats[baseline]["step_seconds"]
    for name, s in stats.items():
        if name != baseline and shapes[name] == shapes[baseline]:
            ratios = sorted(b / t for b, t in zip(base, s["step_seconds"]))
            s[f"median_paired_speedup_vs_{baseline}"] = ratios[len(ratios) // 2]


def build_variants(config, overrides, out_dir, names):
    """Start every variant's process (they build at once), then wait for each."""
    started = {name: VariantProcess(name, config, overrides, os.path.join(out_dir, name))
               for name in names}
    made, failed = {}, {}
    for name, v in started.items():
        try:
            v.wait_ready()
            made[name] = v
        except RuntimeError as e:
            failed[name] = str(e)
    return made, failed


def compare(args, configs, overrides, names, baseline, tag):
    results = {}
    for config in configs:
        load = os.getloadavg()
        variants, failed = build_variants(config, overrides, os.path.join(
            args.out, f"train_throughput_{tag}_runs", os.path.basename(os.path.dirname(config)) +
            "_" + os.path.basename(config)[:-5]), names)
        stats, shapes = interleaved(variants, args.steps, gap=args.gap)
        paired_speedups(stats, shapes, baseline)
        base = stats[baseline]["real_tokens_per_s"]
        base_cpu = stats[baseline]["real_tokens_per_cpu_s"]
        for s in stats.values():
            s[f"speedup_vs_{baseline}"] = s["real_tokens_per_s"] / base
            s[f"cpu_time_speedup_vs_{baseline}"] = s["real_tokens_per_cpu_s"] / base_cpu
        results[config] = {"variants": stats, "failed": failed, "loadavg_before": load,
                           "loadavg_after": os.getloadavg()}
        print(config, {n: f"{s['real_tokens_per_s']:.0f} tok/s x{s[f'speedup_vs_{baseline}']:.2f}"
                       f" (paired median x{s.get(f'median_paired_speedup_vs_{baseline}', 1):.2f},"
                       f" CPU time x{s[f'cpu_time_speedup_vs_{baseline}']:.2f})"
                       for n, s in stats.items()}, failed or "", os.getloadavg(), flush=True)
    return results


def write_report(args, tag, results, overrides, baseline, title):
    from ppvarlen import _mkl
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report = {"what": tag, "steps_per_variant": args.steps, "warmup_steps": 2,
              "interleaved": "one step of each variant in turn, order reversed every other round", "overrides": overrides,
              "cpu_count": os.cpu_count(), "mkl": _mkl.describe(), "results": results}
    from ppvarlen.utils.io import atomic_write_json

    atomic_write_json(os.path.join(args.out, f"train_throughput_{tag}.json"), report)
    names = sorted({n for r in results.values() for n in r["variants"]},
                   key=lambda n: (n != baseline, n))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(results) + 2), 3.8))
    width = 0.8 / len(names)
    for j, n in enumerate(names):
        xs = [i + j * width for i in range(len(results))]
        ys = [r["variants"].get(n, {}).get("real_tokens_per_s", 0) for r in results.values()]
        ax.bar(xs, ys, width, label=n, color=f"C{j}")
        for x, r in zip(xs, results.values()):
            s = r["variants"].get(n)
            if s:
                ax.text(x, s["real_tokens_per_s"], f"x{s[f'speedup_vs_{baseline}']:.2f}",
                        ha="center", va="bottom", fontsize=7)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(results))])
    ax.set_xticklabels([c.replace("configs/", "").replace(".yaml", "") for c in results],
                       rotation=20, fontsize=7)
    ax.set_ylabel("real tokens / s (training)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    from ppvarlen.utils.io import atomic_save_png

    atomic_save_png(fig, os.path.join(args.out, f"train_throughput_{tag}.png"), dpi=100)


MODES = {  # --what -> (variants, baseline, configs (None = --configs), overrides, title)
    "static": (["eager", "static_serial", "static_threaded", "whole_step"], "eager", None, [],
               "eager vs Train.to_static vs whole step as one program (interleaved, CPU)"),
    "cpu": (["eager_paddle_cpu", "eager", "static_serial_paddle_cpu", "static_serial_one_thread",
             "static_serial_glibc_heap", "static_serial"],
            "eager_paddle_cpu", None, [],
            "ppvarlen's CPU settings vs Paddle's (math threads, C heap; interleaved)"),
    "anchor": (["paddlenlp_recipe_plain", "paddlenlp_recipe", "eager", "static_serial",
                "static_threaded"], "paddlenlp_recipe_plain", ["configs/sentiment/transformer.yaml"],
               ANCHOR, "anchor: 2 x d128 Transformer, max_len 512 (interleaved, CPU)"),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--what", choices=["batching", *MODES], default="batching")
    ap.add_argument("-c", "--config", default="configs/sentiment/transformer.yaml",
                    help="batching: the config measured")
    ap.add_argument("--configs", nargs="+", default=SHIPPED, help="static, cpu: the configs compared")
    ap.add_argument("--steps", type=int, default=10, help="measured steps per variant")
    ap.add_argument("--variants", nargs="+", help="static, cpu, anchor: only these variants "
                    "(the baseline always runs)")
    ap.add_argument("--gap", type=float, default=0.25, help="idle seconds before each step "
                    "(other variants' spinning OpenMP threads go to sleep)")
    ap.add_argument("--out", default="output/bench")
    ap.add_argument("-o", "--override", action="append", default=[],
                    help="static/cpu/anchor: extra config overrides for every variant (quick checks)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.what == "batching":
        return batching(args)
    load = os.getloadavg()
    names, baseline, configs, overrides, title = MODES[args.what]
    if args.variants:
        unknown = set(args.variants) - set(names)
        if unknown:
            ap.error(f"--variants {sorted(unknown)}: --what {args.what} has {names}")
        names = [n for n in names if n == baseline or n in args.variants]
    configs = configs or args.configs
    overrides = overrides + args.override
    results = compare(args, configs, overrides, names, baseline, args.what)
    for r in results.values():
        r["loadavg_run_start"] = load
        same = r["variants"].get("paddlenlp_recipe")
        if args.what == "anchor" and same:  # the share of ppvarlen's process settings taken out
            for n, s in r["variants"].items():
                s["speedup_vs_paddlenlp_recipe"] = s["real_tokens_per_s"] / same["real_tokens_per_s"]
                s["cpu_time_speedup_vs_paddlenlp_recipe"] = (s["real_tokens_per_cpu_s"]
                                                             / same["real_tokens_per_cpu_s"])
                print(f"  {n}: x{s['speedup_vs_paddlenlp_recipe']:.2f} the recipe given ppvarlen's "
                      f"process settings (CPU time x{s['cpu_time_speedup_vs_paddlenlp_recipe']:.2f})")
    write_report(args, args.what, results, overrides, baseline, title)


if __name__ == "__main__":
    main()
