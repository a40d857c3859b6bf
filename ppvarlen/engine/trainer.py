"""The training loop: data engine -> model -> AdamW, evaluation, checkpoints, exact resume.

Exact resume: a checkpoint records the epoch and how many of that epoch's
batches are done; the sampler is deterministic in (seed, epoch, rank), so the
resumed run replays the same batch list and skips what was done.  Dropout
randomness is re-seeded at every step from (seed, rank, step), so step k+1 draws
the same masks whether or not the process was restarted in between.
"""
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import paddle
from tqdm import tqdm

from .. import _mkl
from ..config import ConfigError, save_config
from ..data.lengths import length_stats, optimal_boundaries, quantile_boundaries
from ..data.loader import train_loader
from ..data.readers import label_set_line
from ..data.vocab import vocab_sha256
from ..models import build_model
from ..models.weights import load_weights, read_metadata
from ..store_build import build_datasets
from ..tasks import get_task
from ..utils.io import atomic_write_json
from ..utils.log import get_logger, setup_logging
from . import checkpoint as ckpt
from . import cpu_settings, rundir
from .distributed import all_reduce_sum, barrier, init_distributed, wrap_model
from .evaluate import decoding_of, evaluate
from .logbook import Logbook
from .optim import build_optimizer
from .static_step import compile_loss

log = get_logger("engine")


def select_device(name):
    """``Global.device`` -> 'cpu' | 'gpu:N' (the launcher's device for this rank)."""
    has_gpu = paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0
    if name == "gpu" and not has_gpu:
        raise ConfigError("Global.device: gpu requested but this Paddle build has no usable GPU; "
                          "use -o Global.device=cpu (or auto)")
    if name == "cpu" or not has_gpu:
        paddle.set_device("cpu")
        return "cpu"
    paddle.set_device(f"gpu:{paddle.distributed.ParallelEnv().device_id}")
    return "gpu"


def amp_settings(amp_cfg, device):
    """None (fp32) or {level, dtype}.  Paddle 3.3.1 ignores autocast on CPU: say so once."""
    if not amp_cfg.enable:
        return None
    if device != "gpu":
        log.warning("Train.amp.enable=true, but Paddle 3.3.1 has no CPU autocast (it is a silent "
                    "no-op there): training in float32. Reduced precision on CPU is available "
                    "at inference (export precisions bf16/fp16).")
        return None
    return {"level": amp_cfg.level, "dtype": amp_cfg.dtype}


def _install_stop_flag():
    """First Ctrl-C / SIGTERM asks for a clean stop at the next step boundary; a second kills."""
    flag = {"stop": False}

    def handler(signum, frame):
        if flag["stop"]:
            raise KeyboardInterrupt
        flag["stop"] = True
        log.warning("interrupt received: finishing this step, saving a checkpoint, then exiting "
                    "(interrupt again to abort without saving)")

    previous = {}
    try:
        for s in (signal.SIGINT, signal.SIGTERM):
            previous[s] = signal.signal(s, handler)
    except ValueError:  # not the main thread (e.g. called from a server): no handler
        pass
    return flag, previous


def _plan_in_background(sampler):
    """A future of (batches per epoch on this rank, seconds the plan took)."""
    started = time.perf_counter()
    pool = ThreadPoolExecutor(1, thread_name_prefix="sampler-plan")
    planned = pool.submit(lambda: (len(sampler), time.perf_counter() - started))
    pool.shutdown(wait=False)
    return planned


def _restore_handlers(previous):
    for s, h in previous.items():
        signal.signal(s, h)


def _check_init_vocabulary(path, encoder):
    """A warm start needs the same token -> id order, not just the same vocabulary size."""
    saved = read_metadata(path).get("vocab_sha256")
    if saved is not None and saved != vocab_sha256(encoder):
        raise ConfigError(f"Model.init_from: {path} was pretrained with a different vocabulary "
                          f"(token order differs from this run's Data settings); pretrain with "
                          f"the same Data section, or set Model.init_from: null")


class Trainer:
    def __init__(self, cfg):
        self.started = time.time()
        self.mkl = _mkl.apply()  # before this process's first MKL call (PITFALLS 38)
        self.cfg = cfg
        self.out = cfg.Global.output_dir
        self.world, self.rank = init_distributed()
        self.main = self.rank == 0
        # rank 0 owns the output directory (engine/rundir.py) from before the slow set-up:
        # a refusal comes at once, and a second run never writes beside this one
        self.output_lock = rundir.claim_output_dir(cfg) if self.main else None
        try:
            self._set_up(cfg)
        except BaseException:
            self.close()
            raise

    def close(self):
        """Let the next run into Global.output_dir (``train`` calls it; so does a failed set-up)."""
        if self.output_lock is not None:
            self.output_lock.release()
            self.output_lock = None

    def _set_up(self, cfg):
        self.device = select_device(cfg.Global.device)
        self.cpu_settings = cpu_settings.configure(cfg.Train, self.world, self.device)
        paddle.seed(cfg.Global.seed)
        np.random.seed(cfg.Global.seed)

        started = time.perf_counter()
        self.data = build_datasets(cfg.Data, task_hint=cfg.Train.task,
                                   extra_corpora=cfg.Pretrain.extra_corpora)
        data_s = time.perf_counter() - started
        self.task = get_task(self.data.task)
        self.task.check_train_config(cfg)
        self.task.check_lengths(cfg)
        enc = self.data.encoder
        if cfg.Train.label_smoothing and cfg.Model.get("rdrop_alpha"):
            raise ConfigError("Model.rdrop_alpha lives in the model's own loss, which "
                              "Train.label_smoothing bypasses; set one of them to 0")
        if cfg.Model.get("init_from"):
            _check_init_vocabulary(cfg.Model.init_from, enc)
        self.num_labels = self.task.num_labels(enc, self.data.label_names)
        if self.data.label_names:
            log.info("%s", label_set_line(list(self.data.label_names)))
        # the first epoch's batches are planned in a thread while the model, the static program
        # and the optimizer are built: the plan is numpy sorts and gathers, which release the
        # GIL, and it grows with the corpus while the rest does not
        self.loader, self.sampler, self.collate = self._batching(self.data.train)
        self._data_s, self._plan, self._steps = data_s, _plan_in_background(self.sampler), None
        self.model = build_model(cfg.Model, enc.vocab_size, self.num_labels, enc.pad_id,
                                 self.task.name)
        self.task.configure_model(self.model, cfg, enc)
        self.amp = amp_settings(cfg.Train.amp, self.device)
        o2 = bool(self.amp) and self.amp["level"] == "O2"
        # Train.to_static (engine/static_step.py): forward + loss as one program, probed here.
        # AMP O2 decorates the model with its optimizer, so its program is compiled after them;
        # otherwise before the optimizer, whose schedule may wait for the plan (Train.epochs)
        self.static_loss = None
        if cfg.Train.to_static and not o2:
            self.static_loss = self._compile_static_loss()
        self.total_steps = cfg.Train.max_steps or cfg.Train.epochs * self._steps_per_epoch()
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg.Optimizer, self.total_steps)
        self.scaler = None
        if o2:
            self.model, self.optimizer = paddle.amp.decorate(
                models=self.model, optimizers=self.optimizer, level="O2", dtype=self.amp["dtype"])
        if self.amp and self.amp["dtype"] == "float16":
            self.scaler = paddle.amp.GradScaler(init_loss_scaling=2.0 ** 15)

        self.state = {"step": 0, "epoch": 0, "batch_in_epoch": 0, "world_size": self.world,
                      "best": None, "train_time_s": 0.0, "real_tokens": 0, "padded_tokens": 0}
        resume_dir = ckpt.resolve_resume(cfg.Train.resume, self.out)
        if resume_dir:
            self._steps_per_epoch()  # the sampler's plan done before its state is set
            self._resume(resume_dir)
            self._reconcile_best(resume_dir)
        if cfg.Train.to_static and o2:
            self.static_loss = self._compile_static_loss()
        steps_per_epoch = self._steps_per_epoch()
        # loss_weighting=example: scale each batch's mean loss by B / (average B), so the
        # gradient weighs examples equally instead of favouring those in small (long-text) batches
        self.example_scale = None
        if self.task.example_weighting and cfg.Train.loss_weighting == "example":
            self.example_scale = len(self.data.train) / (steps_per_epoch * self.world)
        self.ddp_model = wrap_model(self.model if self.static_loss is None else self.static_loss,
                                    self.world)
        if self.main:
            rundir.start_run(cfg)
            save_config(cfg, os.path.join(self.out, "config.yaml"))
            self.logbook = Logbook(self.out, self.state["step"] if resume_dir else None,
                                   cfg.Train.visualdl)

    # ------------------------------------------------------------ pieces

    def _steps_per_epoch(self):
        """Batches of an epoch on this rank, once the background plan is done (logged once)."""
        if self._steps is None:
            started = time.perf_counter()
            steps, plan_s = self._plan.result()
            wait_s = time.perf_counter() - started
            # what the time to the first step went to (benchmarks/corpus_scale.py reads this)
            log.info("data ready in %.2f s (%d train examples); sampler planned %d batches in "
                     "%.2f s (beside the model's set-up; waited %.2f s for it)", self._data_s,
                     len(self.data.train), steps, plan_s, wait_s)
            if steps == 0:
                raise ConfigError("the training split gives no batches; check Data.limit / "
                                  "Data.train_file")
            self._steps = steps
        return self._steps

    def _batching(self, dataset):
        """The train loader (``data.loader``: Data.num_workers processes read the store)."""
        loader = train_loader(dataset, self.cfg.Data, num_replicas=self.world,
                              rank=self.rank, seed=self.cfg.Global.seed)
        return loader, loader.sampler, loader.collate

    def _resume(self, path):
        state = ckpt.load_training_state(path, self.model, self.optimizer, self.scheduler)
        if state["world_size"] != self.world:
            raise ConfigError(f"Train.resume: {path} was written by {state['world_size']} "
                              f"process(es) but this run has {self.world}; the data order depends "
                              f"on it, so resume with --nproc_per_node {state['world_size']}")
        for key in self.state:
            self.state[key] = state[key]
        try:
            self.sampler.load_state_dict(state["sampler"])
        except ValueError as e:  # the data changed since the checkpoint (Data.limit, files, ...)
            raise ConfigError(f"Train.resume: {path}: {e}") from None
        log.info("resumed from %s at step %d (epoch %d, batch %d)", path, state["step"],
                 state["epoch"], state["batch_in_epoch"])

    def _reconcile_best(self, resume_dir):
        """The resumed state's best is the one best/ holds.  A run that died while writing best/
        recorded a newer best in its checkpoint than best/ has: best/ is rebuilt from that
        step's checkpoint when it is still on disk, else the state takes best/'s record."""
        st, metric = self.state, self.task.main_metric
        held = ckpt.read_best(self.out)
        if st["best"] is None or (held and held[0] == st["best"]["step"]):
            return
        source = os.path.join(self.out, f"ckpt-{st['best']['step']}")
        if not os.path.isfile(os.path.join(source, "meta.json")):
            source = resume_dir if st["best"]["step"] == st["step"] else None
        if source is not None:
            if self.main:
                log.warning("best/ holds step %s but %s recorded step %d as best: rebuilding "
                            "best/ from %s", held and held[0], resume_dir, st["best"]["step"],
                            source)
                ckpt.copy_checkpoint(source, os.path.join(self.out, "best"))
            barrier(self.world)
            return
        log.warning("best/ holds step %s but %s recorded step %d as best, whose checkpoint is "
                    "gone: best/ stays the best", held and held[0], resume_dir, st["best"]["step"])
        st["best"] = None if held is None else {
            "metric": metric, "value": held[1][metric], "step": held[0], "dev": held[1]}

    def meta(self, metrics=None):
        d, enc = self.cfg.Data, self.data.encoder
        if not hasattr(self, "_length_profile"):  # fixed for the run: compute once
            train = self.data.train
            stats = length_stats(train.lengths if train.src_lengths is None else train.src_lengths)
            self._length_profile = {k: stats[k] for k in ("p50", "p95", "p99", "max")}
            self._bucket_list = self._buckets()
        return {
            "task": self.task.name, "model_name": self.cfg.Model.name,
            "label_names": list(self.data.label_names), "num_labels": self.num_labels,
            "special_ids": dict(enc.special_ids),
            "tokenizer": d.tokenizer, "max_len": d.max_len, "max_position": self.cfg.Model.max_position,
            "long_text": d.long_text, "buckets": self._bucket_list,
            "length_profile": self._length_profile,
            "step": self.state["step"], "metrics": metrics or {}, **self.task.meta_extras(self.cfg),
            **self.task.model_meta(self.model),
        }

    def _buckets(self):
        d = self.cfg.Data
        if getattr(self.sampler, "boundaries", None) is not None:
            return [int(b) for b in self.sampler.boundaries]
        if d.buckets:
            return list(d.buckets)
        if d.bucket_method == "quantile":
            return [int(b) for b in quantile_boundaries(self.data.train.lengths,
                                                        pad_to_multiple_of=d.pad_to_multiple_of)]
        return [int(b) for b in optimal_boundaries(self.data.train.lengths, d.num_buckets,
                                                   d.pad_to_multiple_of)]

    def save(self, metrics=None, best=False):
        """Rank 0 writes ckpt-<step>, points ``last`` at it, keeps the newest N; best/ on request."""
        if self.main:
            state = dict(self.state, sampler=self.sampler.state_dict(self.state["batch_in_epoch"]))
            args = (self.model, self.optimizer, self.scheduler, self.data.encoder, self.cfg,
                    self.meta(metrics), state)
            path = ckpt.save_checkpoint(os.path.join(self.out, f"ckpt-{self.state['step']}"), *args)
            ckpt.point_last(self.out, path)
            ckpt.rotate(self.out, self.cfg.Train.keep_last, just_written=path)
            if best:
                ckpt.save_checkpoint(os.path.join(self.out, "best"), *args)
        barrier(self.world)

    def _dev_subset(self):
        """The first Train.eval_max_examples dev items (whole documents: windows stay together)."""
        dev, n = self.data.dev, self.cfg.Train.eval_max_examples
        if n is None or n >= len(dev):
            return dev
        if n < 1:
            raise ConfigError(f"Train.eval_max_examples must be >= 1 or null, got {n}")
        while n < len(dev) and dev[n]["doc_id"] == dev[n - 1]["doc_id"]:
            n += 1
        return dev.subset(n)

    def run_eval(self, split):
        if split == "dev":
            if not hasattr(self, "_dev_eval"):
                self._dev_eval = self._dev_subset()
            dataset = self._dev_eval
        else:
            dataset = getattr(self.data, split)
        return evaluate(self.model, dataset, self.task, self.collate, self.data.label_names,
                        self.cfg.Data.eval_max_tokens, self.cfg.Data.padding_side,
                        self.world, self.rank, self.data.encoder, decoding_of(self.cfg.Model),
                        num_workers=self.cfg.Data.num_workers)

    # ------------------------------------------------------------ one step

    def _batch_loss(self, model, batch):
        return self.task.loss(model, batch, self.cfg.Train.label_smoothing)

    def _autocast(self):
        return paddle.amp.auto_cast(True, level=self.amp["level"], dtype=self.amp["dtype"])

    def _compile_static_loss(self):  # Train.to_static: fails at start if the model cannot
        probe = self.collate([self.data.train[i] for i in range(min(2, len(self.data.train)))])
        return compile_loss(self.model, self._batch_loss, probe, self.cfg.Model.name,
                            self._autocast if self.amp else None, self.cfg.Train.static_executor)

    def _loss(self, batch):
        if self.static_loss is not None:  # Train.to_static: ddp_model wraps the static loss
            loss = self.ddp_model(*self.static_loss.inputs(batch))
            self.static_loss.check_traced_once()
            return loss
        return self._batch_loss(self.ddp_model, batch)

    def train_step(self, batch):
        """One optimizer step; returns the batch's mean loss (unscaled, for the log)."""
        step = self.state["step"]
        paddle.seed(self.cfg.Global.seed * 1_000_003 + self.rank * 7_919 + step)
        if self.static_loss is None:
            return self._step(batch)
        with self.static_loss.running():  # Paddle's executor flags for its forward AND backward
            return self._step(batch)

    def _step(self, batch):
        if self.amp:
            with self._autocast():
                loss = self._loss(batch)
        else:
            loss = self._loss(batch)
        objective = (loss * (self.task.batch_size(batch) / self.example_scale)
                     if self.example_scale else loss)
        if self.scaler:
            self.scaler.scale(objective).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            objective.backward()
            self.optimizer.step()
        self.optimizer.clear_grad()
        self.scheduler.step()
        return float(loss)

    # ------------------------------------------------------------ the loop

    def fit(self):
        stop, previous = _install_stop_flag()
        try:
            return self._fit(stop)
        finally:
            _restore_handlers(previous)

    def _fit(self, stop):
        cfg, st = self.cfg.Train, self.state
        metric = self.task.main_metric
        bar = self._progress_bar()
        window = {"loss": 0.0, "steps": 0, "real": 0, "padded": 0, "time": 0.0}
        last_eval_step = -1
        self.ddp_model.train()
        log.info("training %s on %s for %d steps (%d batches/epoch, %d process(es))",
                 self.cfg.Model.name, self.device, self.total_steps, len(self.sampler), self.world)
        for line in (self.mkl, *self.cpu_settings):
            log.info("%s", line)
        while st["step"] < self.total_steps:
            self.sampler.set_epoch(st["epoch"])  # keeps a resumed mid-epoch position
            t0 = time.perf_counter()
            for batch in self.loader:
                loss = self.train_step(batch)
                dt = time.perf_counter() - t0
                st["step"] += 1
                st["batch_in_epoch"] += 1
                real, padded = self.task.token_counts(batch)
                for k, v in (("loss", loss), ("steps", 1), ("real", real), ("padded", padded), ("time", dt)):
                    window[k] += v
                if st["step"] % cfg.log_every == 0 or st["step"] == self.total_steps:
                    self._log_window(window, bar)
                    window = dict.fromkeys(window, 0)
                    window["loss"], window["time"] = 0.0, 0.0
                if cfg.eval_every and st["step"] % cfg.eval_every == 0:
                    self._eval_and_save(metric)
                    last_eval_step = st["step"]
                elif cfg.save_every and st["step"] % cfg.save_every == 0:
                    self.save()
                if self._should_stop(stop):
                    if window["steps"]:
                        self._log_window(window, bar)
                    self.save()
                    log.warning("stopped at step %d; resume with -o Train.resume=auto", st["step"])
                    return {"interrupted": True, "step": st["step"]}
                if st["step"] >= self.total_steps:
                    break
                t0 = time.perf_counter()
            else:  # epoch finished
                st["epoch"] += 1
                st["batch_in_epoch"] = 0
                self.sampler.set_epoch(st["epoch"])  # so a checkpoint here records the new epoch
                if not cfg.eval_every and st["step"] < self.total_steps:
                    self._eval_and_save(metric)
                    last_eval_step = st["step"]
        if bar is not None:
            bar.close()
        if last_eval_step != st["step"]:
            self._eval_and_save(metric)
        return self._finish(metric)

    def _should_stop(self, stop):
        flags = all_reduce_sum([stop["stop"]], self.world) if self.world > 1 else [stop["stop"]]
        return flags[0] > 0

    def _progress_bar(self):
        if not (self.main and self.cfg.Train.progress_bar):
            return None
        return tqdm(total=self.total_steps, initial=self.state["step"], desc="train",
                    dynamic_ncols=True, leave=False)

    def _log_window(self, w, bar):
        loss_sum, steps, real, padded, secs = all_reduce_sum(
            [w["loss"], w["steps"], w["real"], w["padded"], w["time"]], self.world)
        st = self.state
        st["real_tokens"] += int(real)
        st["padded_tokens"] += int(padded)
        st["train_time_s"] += secs / self.world  # ranks run in parallel: wall time is per rank
        wall = secs / self.world
        rec = {"step": st["step"], "epoch": st["epoch"], "loss": loss_sum / steps,
               "lr": float(self.optimizer.get_lr()),
               "tokens_per_s": real / wall if wall else 0.0,
               "padding_efficiency": real / padded if padded else 1.0}
        if self.main:
            self.logbook.write(rec)
            if bar is not None:
                bar.update(st["step"] - bar.n)
                bar.set_postfix(loss=f"{rec['loss']:.4f}", tok_s=f"{rec['tokens_per_s']:.0f}",
                                pad_eff=f"{rec['padding_efficiency']:.2f}")
            else:
                log.info("step %d  loss %.4f  lr %.2e  %.0f tok/s  padding eff %.3f", st["step"],
                         rec["loss"], rec["lr"], rec["tokens_per_s"], rec["padding_efficiency"])

    def _eval_and_save(self, metric):
        dev = self.run_eval("dev")
        st = self.state
        improved = st["best"] is None or dev[metric] > st["best"]["value"]
        if improved:
            st["best"] = {"metric": metric, "value": dev[metric], "step": st["step"], "dev": dev}
        if self.main:
            self.logbook.write({"step": st["step"], "dev": _scalars(dev)})
            log.info("step %d  dev %s %.4f%s", st["step"], metric, dev[metric],
                     "  (best)" if improved else f"  (best {st['best']['value']:.4f} @ {st['best']['step']})")
        self.save(metrics={"dev": _scalars(dev)}, best=improved)

    def _finish(self, metric):
        st = self.state
        best_dir = os.path.join(self.out, "best")
        barrier(self.world)
        # the reported best is read from best/ itself (its meta.json is written inside the same
        # atomic directory as its weights), so metrics.json describes the weights best/ holds
        best_step, best_dev = ckpt.read_best(self.out)
        load_weights(self.model, os.path.join(best_dir, "model.safetensors"))
        test = self.run_eval("test") if len(self.data.test) else {}
        secs = st["train_time_s"]
        result = {
            "task": self.task.name, "model_name": self.cfg.Model.name,
            "best_step": best_step, "dev": _scalars(best_dev), "test": _scalars(test),
            "test_per_type_f1": test.get("per_type_f1"),
            "steps": st["step"], "world_size": self.world, "device": self.device,
            "amp": self.amp or "off (float32)",
            "train_time_s": round(secs, 2),  # optimizer steps only, summed over resumed segments
            "wall_time_s": round(time.time() - self.started, 2),  # this process: data, eval, saves
            "throughput": {
                "real_tokens_per_s": st["real_tokens"] / secs if secs else 0.0,
                "padded_tokens_per_s": st["padded_tokens"] / secs if secs else 0.0,
                "padding_efficiency": st["real_tokens"] / st["padded_tokens"] if st["padded_tokens"] else 1.0,
            },
        }
        if self.main:
            result.update(self.task.write_artifacts(self.model, self.data, self.out))
            # models wrapping a PaddleNLP model (models/paddlenlp_auto.py): the best weights also
            # as a PaddleNLP directory, which AutoModelFor*.from_pretrained reads
            save_paddlenlp_dir = getattr(self.model, "save_paddlenlp_dir", None)
            if save_paddlenlp_dir is not None:
                result["paddlenlp_dir"] = save_paddlenlp_dir(
                    os.path.join(self.out, "paddlenlp"), self.data.encoder, self.data.label_names)
            atomic_write_json(os.path.join(self.out, "metrics.json"), result)
            self.logbook.plot(os.path.join(self.out, "curves.png"), metric)
            self.logbook.close()
            log.info("best dev %s %.4f at step %d; test %s", metric, best_dev[metric], best_step,
                     {k: round(v, 4) for k, v in _scalars(test).items()})
        return result


def _scalars(d):
    """Top-level numbers only (per-type F1 stays in the eval dict, not the curves)."""
    return {k: v for k, v in d.items() if isinstance(v, (int, float))}


def train(cfg):
    """Train per ``cfg`` (a validated Config); return the final metrics dict (see metrics.json)."""
    setup_logging(cfg.Global.log_level)
    trainer = Trainer(cfg)
    try:
        return trainer.fit()
    finally:
        trainer.close()
