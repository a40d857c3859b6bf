"""Served models: one batcher per loaded model version, and a model repository with hot reload.

``ServedModel``: a predictor (plus one clone per extra worker thread) and its
``DynamicBatcher``.  ``LiveVersions``: the versions taking traffic, by model name; a
request picks one (the newest, or the version its path names), encodes with that version's
vocabulary and submits to that version's batcher — a version retired in between refuses the
submit (``BatcherClosed``) and the request simply picks again, so no request is lost.

``Repository``: ``DIR/NAME/VERSION/`` export directories (VERSION a positive integer in ASCII
digits, as in Triton's and TF Serving's repositories; other names are not versions).  A version
that appears is loaded and verified *before* it takes traffic — every file against the
manifest's sha256 (``load_manifest``), no symbolic link out of the repository or the export
unless ``Deploy.allow_external_symlinks``, then the admission check (``admission.admit``:
manifest against graph, special ids and the longest length, finite outputs, padding
invariance, every response path).  Then it takes traffic, and the older version drains (queued
texts finish) and is unloaded.  A version that fails — whatever it raises — is refused with the
reason (log, metrics, repository index, the load endpoint's 409), never raised out of start-up
or the poller: the newest version that passes serves, older good versions are the fallback.
New versions are found by polling (``Deploy.repository_poll_s``) and by
``POST /v2/repository/models/NAME/load``.

A version number names one model.  Each version's ``content_fingerprint`` (every file's name,
size, mtime, ctime and inode) is taken before it is loaded.  A refused version is examined
again when its fingerprint changes (a copy that completed, a permission fixed), the newest one
also on every ``POST .../load``.  A served version whose directory disappears, or whose files
change in place, keeps answering from the copy in memory -- it is never reloaded under the
same number (Triton would reload it; then one number would have answered as two models) --
but is marked ``STALE`` in the index (the reason says removed or changed, and what to do), on
``/health`` (``files_changed``), with a WARNING naming the path.  Each load logs the sha256 of
the manifest it loaded: what a number served, before and after a restart, is on record.  Temp
directories a dead export left in the repository (``.tmp-*``) are removed at each scan.
"""
import hashlib
import os
import threading
import time

import numpy as np

from ppvarlen.data.errors import DataError
from ppvarlen.utils.io import reap_dead_owners, sha256_file
from ppvarlen.utils.parallel import release_memory
from ppvarlen.utils.log import get_logger

from ppvarlen.runtime import admission, choice_cache, precision_choice, threads_choice
from ppvarlen.runtime.admission import AdmissionError, admit, first_line
from ppvarlen.serve.batcher import BatcherClosed, Callers, DynamicBatcher
from ppvarlen.serve.errors import shown
from ppvarlen.serve.stats import VersionStats
from ppvarlen.runtime.manifest import VERSION_NAME  # noqa: F401 - the data plane reads it from here
from ppvarlen.runtime.manifest import MANIFEST, UnservableExportError, is_version_name, outside

log = get_logger("serve.repository")


class ServedModel:
    """One model version: predictor(s) and the batcher they take work from."""

    def __init__(self, name, version, predictor):
        self.name, self.version, self.predictor = name, str(version), predictor
        self.task, self.task_name = predictor.task, predictor.task.name
        self.label_names = list(predictor.label_names)
        # what the protocols read of the export (kept after an unload drops the predictor)
        self.manifest = predictor.manifest
        self.backend, self.long_text = predictor.backend, predictor.long_text
        self.threads = predictor.threads  # math threads per worker
        # the precision it serves and why (auto: timed on this host; precision_choice)
        self.precision_choice = getattr(predictor, "precision_choice", None) or \
            precision_choice.as_requested(predictor.precision)
        self.threads_reason = self.precision_choice.get("threads_reason")  # or start's
        # Deploy.split_threads_under_load: {"batches_at_once", "threads_each"} when on
        self.under_load = None
        self.batcher = None
        self.example = None  # (the task's example items, this version's predictions of them)
        self.overhead_tokens = None
        self.shape_grid = None  # Paddle oneDNN: the grid its batches run on, with their costs
        self.unhealthy = None  # why this version stopped being trusted (non-finite outputs)
        self.stats = VersionStats()  # Triton's statistics extension
        self.settings = None  # the Deploy section it started with (the model config reads it)
        # why this version's directory no longer holds what it serves (removed, changed in
        # place); it keeps answering from memory, the index and /health say so
        self.files_changed = None

    def start(self, deploy, metrics=None, callers=None):
        """Warm up, measure the batching overhead, start the batcher with the ``deploy``
        settings (blocking); ``callers``: the server's ``batcher.Callers``, used when
        ``Deploy.batch_when_all_queued`` is on."""
        p = self.predictor
        self.settings = deploy
        if not self.threads_reason:  # a count no timing chose
            self.threads_reason = threads_choice.untimed_reason(
                deploy.threads, deploy.workers, deploy.device, served=self.threads)
        predictors = [p] + [p.clone() for _ in range(deploy.workers - 1)]
        split, unsplit = self._split_under_load(deploy)
        if split:
            narrow = p.clone(threads=1)
            release_memory()  # what building the session freed goes back to the OS
            predictors += [narrow] + [narrow.clone() for _ in range(p.threads - 1)]
            self.under_load = {"batches_at_once": p.threads, "threads_each": 1}
        # a Paddle oneDNN shape grid: the batcher plans with its measured cost per shape
        # (timing other shapes would put them in Paddle's cache, dropping grid shapes)
        self.shape_grid = grid = getattr(p.engine, "shape_grid", None)
        batch_cost = grid.cost if grid is not None else None
        kept = choice_cache.kept_grid_times(p) if grid is not None and deploy.choice_cache \
            else None
        self.overhead_tokens = deploy.batch_overhead_tokens
        if self.overhead_tokens is None:
            self.overhead_tokens = 0 if batch_cost else p.measure_overhead_tokens()
        self.example = _example(self)
        p._reset_counters()  # the example is not traffic
        differs = split and _differs(p, narrow)
        if differs:  # a text's answer must not depend on the session that ran it
            log.warning("model %s version %s: the one-thread session %s; every batch runs on "
                        "all %d threads", self.name, self.version, differs, p.threads)
            split, predictors, self.under_load = False, predictors[:1], None
        def on_batch(size, real, padded, waits, compute_s):
            self.stats.observe_batch(size, compute_s)
            if metrics is not None:
                metrics.observe_batch(self.name, self.version, size, real, padded, waits)

        self.batcher = DynamicBatcher(predictors, deploy.max_wait_ms, deploy.max_batch_tokens,
                                      deploy.max_batch_size, deploy.queue_size,
                                      self.overhead_tokens, on_batch,
                                      callers if deploy.batch_when_all_queued else None,
                                      batch_cost, warmup=lambda q: q.warmup(kept_times=kept))
        if grid is not None and deploy.choice_cache:
            choice_cache.keep_grid_times(p)
        if batch_cost:
            log.info("model %s version %s ready (%s, %s backend, %d worker(s)); batches run on "
                     "a grid of %d held shapes (rows %s, widths %s) with %s, planned with each "
                     "shape's fastest run so far (/metrics.json shape_grid_ms follows them; "
                     "now, ms, rows x width: %s)", self.name, self.version,
                     p.task.name, p.backend, deploy.workers, len(grid.costs), grid.rows,
                     grid.widths, "one weight copy for all of them"
                     if p.engine.settings.get("onednn_shared_weights") else "a weight copy each",
                     ", ".join(f"{shape} {ms}" for shape, ms in grid.times_ms().items()))
        else:
            log.info("model %s version %s ready (%s, %s backend, %d worker(s)); a forward pass "
                     "costs as much as %d tokens", self.name, self.version, p.task.name,
                     p.backend, deploy.workers, self.overhead_tokens)
        if split:
            log.info("model %s version %s: a lone text runs on %d math threads; batches that "
                     "queue run up to %d at once on one thread each (a second session, a "
                     "second weight copy; Deploy.split_threads_under_load)", self.name,
                     self.version, p.threads, p.threads)
        elif unsplit and p.threads <= 1:
            log.warning("model %s version %s: Deploy.split_threads_under_load: nothing split: "
                        "%s", self.name, self.version, unsplit)
        elif unsplit:
            log.info("model %s version %s: every batch runs on all %d math threads, one at a "
                     "time (%s)", self.name, self.version, p.threads, unsplit)
        return self

    def _split_under_load(self, deploy):
        """(whether ``Deploy.split_threads_under_load`` splits this version's threads, why
        not where there were threads to split)."""
        p = self.predictor
        if deploy.workers != 1 or (p.threads <= 1 and not deploy.split_threads_under_load):
            return False, None
        if not deploy.split_threads_under_load:
            return False, "Deploy.split_threads_under_load is false"
        if p.threads <= 1:  # asked for, and nothing to split: say why
            return False, f"one math thread to split ({self.threads_reason})"
        if not p.can_change_threads():
            return False, f"this export's {p.backend} engine is not built again on other " \
                          f"thread counts"
        return True, None

    def batch_metrics(self):
        """The batcher's counters (``/metrics.json``), with the grid shapes' current costs."""
        out = self.batcher.metrics()
        if self.shape_grid is not None:
            out["shape_grid_ms"] = self.shape_grid.times_ms()
        return out

    def stop_waiting(self):
        batcher = self.batcher
        if batcher is not None:
            batcher.stop_waiting()

    def submit(self, items, loop=None, deadline=None):
        batcher = self.batcher
        if batcher is None:
            raise BatcherClosed(f"model {self.name} version {self.version} is unloaded")
        return batcher.submit(items, loop, deadline)

    def close(self, timeout):
        """Drain the queue, stop the workers, drop the engines; True when drained in time."""
        drained = self.batcher.close(True, timeout) if self.batcher is not None else True
        if self.shape_grid is not None and self.predictor is not None \
                and self.settings.choice_cache:
            choice_cache.keep_grid_times(self.predictor)  # with the times traffic lowered
        self.batcher = None
        self.predictor = None
        return drained


def _differs(predictor, other):
    """How ``other`` differs from ``predictor`` on admission's smoke rows (every special id,
    the largest vocabulary id, the longest and the shortest row) -> None when it gives the
    same outputs bit for bit."""
    rows = admission.smoke_rows(predictor)
    mine, _ = predictor.run_engine(rows)
    try:
        theirs, _ = other.run_engine(rows)
    except Exception as e:  # noqa: BLE001 - the first session runs them: the split is dropped
        return f"fails admission's smoke rows ({type(e).__name__}: {first_line(e)})"
    finally:
        predictor._reset_counters()
        other._reset_counters()
    if mine.keys() != theirs.keys() or not all(
            np.array_equal(np.asarray(mine[k]), np.asarray(theirs[k])) for k in mine):
        return "answers admission's smoke rows otherwise than the first"
    return None


def _example(model):
    """The task's example items and the predictions this version really gives them (what
    the protocols' documents show), or None when they do not fit the export."""
    texts = model.predictor.task.examples
    try:
        return texts, model.predictor.predict(texts)
    except DataError as e:  # e.g. an export whose max_len is shorter than the example
        log.warning("no /docs example: the example texts do not fit this export (%s)", e)
        return None


class NotServed(LookupError):
    """No ready model or version answers to this name; the message says what is served."""


class SeveralModels(NotServed):
    """A route that takes no model name (``/predict``) on a server holding several models."""


class LiveVersions:
    """Model versions taking traffic, by name (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.callers = Callers()  # the requests on their way through submit (every version's)
        self._ready = {}  # name -> {version: ServedModel}
        self.status = {}  # (name, version) -> {"state": ..., "reason": ...}

    def add(self, model):
        with self._lock:
            self._ready.setdefault(model.name, {})[model.version] = model
            self.status[(model.name, model.version)] = {"state": "READY", "reason": ""}

    def withdraw(self, model):
        """Take ``model`` out of routing (requests already queued in its batcher still run)."""
        with self._lock:
            self._ready.get(model.name, {}).pop(model.version, None)
            self.status[(model.name, model.version)] = {"state": "UNAVAILABLE",
                                                        "reason": "unloaded"}

    def refuse(self, name, version, reason):
        with self._lock:
            self.status[(name, str(version))] = {"state": "UNAVAILABLE", "reason": reason}

    def mark_unhealthy(self, model, reason):
        """``model`` answered NaN/inf: it keeps its place (a newer version replaces it) but
        says so in the index, /health and its ready endpoint.  True the first time."""
        with self._lock:
            first = model.unhealthy is None
            model.unhealthy = model.unhealthy or reason
            if self._ready.get(model.name, {}).get(model.version) is model:
                self.status[(model.name, model.version)] = {"state": "UNHEALTHY",
                                                            "reason": model.unhealthy}
            return first

    def mark_files_changed(self, model, reason):
        """``model``'s files on disk are no longer what it serves (``reason``; None: they are
        again): it keeps answering, the index says STALE with the reason."""
        with self._lock:
            model.files_changed = reason
            if self._ready.get(model.name, {}).get(model.version) is model \
                    and model.unhealthy is None:
                self.status[(model.name, model.version)] = (
                    {"state": "STALE", "reason": reason} if reason else
                    {"state": "READY", "reason": ""})

    def names(self):
        with self._lock:
            return sorted(n for n, vs in self._ready.items() if vs)

    def versions(self, name):
        with self._lock:
            return sorted(self._ready.get(name, {}), key=int)

    def models(self):
        with self._lock:
            return [m for vs in self._ready.values() for m in vs.values()]

    def get(self, name=None, version=None):
        """The version named, or the newest ready one; ``name`` None = the only model served."""
        with self._lock:
            versions = self._ready.get(name) if name is not None else None
            if versions and version is None:  # the request path's usual case: no sorting
                return versions[max(versions, key=int)]
            served = sorted(n for n, vs in self._ready.items() if vs)
            if name is None:
                if len(served) > 1:
                    raise SeveralModels(f"this server holds models {served}; /predict serves a "
                                        f"repository of one model: address one as POST "
                                        f"/v2/models/NAME/infer")
                if not served:
                    raise NotServed("no model is ready")
                name = served[0]
            versions = self._ready.get(name) or {}
            if not versions:
                raise NotServed(f"model {shown(name)} is not served; served models: {served}")
            if version is None:
                return versions[max(versions, key=int)]
            if str(version) not in versions:
                state = self.status.get((name, str(version)))
                why = f" ({state['reason']})" if state and state["reason"] else ""
                raise NotServed(f"model {shown(name)} has no ready version {shown(version)}{why}; "
                                f"ready versions: {sorted(versions, key=int)}")
            return versions[str(version)]

    def submit(self, encode, name=None, version=None, attempts=5, loop=None, deadline=None):
        """Pick a version, ``encode(predictor)`` the texts, queue them -> (model, futures)
        (``loop``, ``deadline``: see ``DynamicBatcher.submit``).

        A version withdrawn between the pick and the submit refuses it; pick again (the
        version that replaced it is ready by then).  ``encode`` may raise (bad texts)."""
        for attempt in range(attempts):
            model = self.get(name, version)
            predictor = model.predictor  # None once unloaded
            try:
                if predictor is None:
                    raise BatcherClosed(f"model {model.name} version {model.version} is unloaded")
                return model, model.submit(encode(predictor), loop, deadline)
            except BatcherClosed:
                if version is not None or attempt == attempts - 1:
                    raise

    def queue_depth(self):
        return sum(m.batcher.queue_depth() for m in self.models() if m.batcher is not None)

    def index(self):
        with self._lock:
            return [{"name": n, "version": v, **s} for (n, v), s in sorted(self.status.items())]


# ---------------------------------------------------------------- repository

def scan(root):
    """{name: [version, ...]} of ``root/NAME/VERSION/`` directories (VERSION a positive integer
    in ASCII digits).  A dead export's temp directories there are removed on the way."""
    out = {}
    for name in sorted(os.listdir(root)):
        model_dir = os.path.join(root, name)
        if name.startswith(".") or not os.path.isdir(model_dir):
            continue
        for debris in reap_dead_owners(model_dir):
            log.warning("removed %s, left by an export that died", debris)
        versions = [v for v in os.listdir(model_dir)
                    if is_version_name(v) and os.path.isdir(os.path.join(model_dir, v))]
        out[name] = sorted(versions, key=int)
    return out


def content_fingerprint(path):
    """A digest of what the version directory ``path`` holds without reading the files: every
    entry's relative name, type, size, mtime, ctime and inode (a copy in place, a rewrite, a
    chmod or a rename each change it) -> hex string, or None when ``path`` is gone."""
    digest = hashlib.sha256()
    try:
        os.stat(path)
    except OSError:
        return None
    for top, dirs, files in os.walk(path, onerror=lambda e: digest.update(repr(e).encode())):
        dirs.sort()
        for entry in sorted(dirs + files):
            full = os.path.join(top, entry)
            try:
                st = os.stat(full)
            except OSError as e:  # a dangling link, a file removed meanwhile
                digest.update(f"{full}: {e.errno}".encode())
                continue
            digest.update(repr((os.path.relpath(full, path), st.st_mode, st.st_size,
                                st.st_mtime_ns, st.st_ctime_ns, st.st_ino)).encode())
    return digest.hexdigest()


def manifest_sha256(path):
    """The sha256 of the version's manifest.json (it lists every file's sha256: the content
    a version number names), or None when unreadable."""
    try:
        return sha256_file(os.path.join(path, MANIFEST))
    except OSError:
        return None


class Refused(Exception):
    """A version is not served; ``kind`` is the metrics' reason label (manifest, load, symlink)."""

    def __init__(self, kind, reason):
        super().__init__(reason)
        self.kind = kind


class Repository:
    """Loads, verifies, swaps in and unloads versions of ``root/NAME/VERSION/``."""

    def __init__(self, root, load_predictor, registry, deploy, metrics=None, after_load=None,
                 renderers=()):
        if not os.path.isdir(root):
            raise UnservableExportError(f"model repository not found: {root}; pass a directory holding "
                              f"NAME/VERSION/ export directories")
        if not any(scan(root).values()):
            raise UnservableExportError(f"model repository {root} holds no NAME/VERSION/ export "
                              f"directories (VERSION a positive integer, e.g. {root}/NAME/1/)")
        self.root, self.registry, self.deploy = root, registry, deploy
        self.load_predictor = load_predictor  # export dir -> Predictor (verifies the manifest)
        self.metrics, self.poll_s = metrics, deploy.repository_poll_s
        self.after_load = after_load  # called once a version's predictor exists (server hook)
        self.renderers = list(renderers)  # the protocols' answer forms admission checks
        self.allow_external_symlinks = deploy.allow_external_symlinks
        self._refused = {}  # (name, version) -> content_fingerprint when refused
        self._loaded = {}  # (name, version) -> (path, content_fingerprint) it was loaded from
        self._unloaded = set()  # names unloaded on request: the poller leaves them so
        self._lock = threading.Lock()  # one load at a time
        self._stop = threading.Event()
        self._thread = None

    def load_all(self):
        """Start-up: each model's newest version that passes (older ones tried if it fails)."""
        for name, versions in scan(self.root).items():
            if versions:  # a directory without version directories is not a model (yet)
                self.refresh(name)
        if not self.registry.names():
            raise UnservableExportError(f"no servable version in the model repository {self.root}: "
                              f"{self.registry.index() or 'no NAME/VERSION/ directories'}")

    def refresh(self, name, retry_newest=True):
        """Load ``name``'s newest new version if it is newer than the one served; returns the
        registry status of the newest version (READY, or UNAVAILABLE with the reason).  A
        version refused before is examined again when its files changed since, and the newest
        one always when ``retry_newest`` (the load endpoint; not the poller)."""
        with self._lock:
            if retry_newest:  # a load asked for it: no longer unloaded on request
                self._unloaded.discard(name)
            elif name in self._unloaded:
                return {"name": name, "version": "", "state": "UNAVAILABLE",
                        "reason": "unloaded on request"}
            self._check_served(name)
            versions = scan(self.root).get(name)
            if not versions:
                raise UnservableExportError(f"no model {shown(name)} in the repository {self.root}")
            served = self.registry.versions(name)
            newest_served = int(served[-1]) if served else 0
            for v in reversed(versions):
                if int(v) <= newest_served:
                    break
                path = os.path.join(self.root, name, v)
                if not (retry_newest and v == versions[-1]) and \
                        self._refused.get((name, v), False) == content_fingerprint(path):
                    continue  # refused before and unchanged
                if self._load(name, v, path):
                    self._retire_older(name, v)
                    break
            newest = versions[-1]
            return {"name": name, "version": newest,
                    **self.registry.status.get((name, newest), {"state": "UNAVAILABLE",
                                                                "reason": "not loaded"})}

    def _check_served(self, name):
        """Mark (and log once) each served version of ``name`` whose directory is gone or whose
        files changed since it was loaded; clear the mark when they are back as loaded."""
        for version in self.registry.versions(name):
            path, loaded = self._loaded.get((name, version), (None, None))
            if path is None:
                continue
            model = self.registry.get(name, version)
            now = content_fingerprint(path)
            if now == loaded:
                reason = None
            elif now is None:
                reason = (f"files removed: {path} is gone; still answering from the copy loaded "
                          f"in memory, a restart will not serve this version")
            else:
                reason = (f"files changed in place: {path} is not what was loaded; still "
                          f"answering from the copy loaded in memory (a version number names "
                          f"one model: publish new files as a new version directory)")
            if reason == model.files_changed:
                continue
            if reason is None:
                log.info("model %s version %s: the files at %s are back as they were loaded",
                         name, version, path)
            else:
                log.warning("model %s version %s: %s", name, version, reason)
            self.registry.mark_files_changed(model, reason)

    def _load(self, name, version, path):
        """Load, admit and start one version -> True; False when refused (never raises)."""
        start = time.monotonic()
        # before the files are read: a change during the load shows at the next look
        fingerprint, manifest_digest = content_fingerprint(path), manifest_sha256(path)
        try:
            model = ServedModel(name, version, self._admitted(path))
            model.start(self.deploy, self.metrics, self.registry.callers)
        except Refused as e:
            kind, reason = e.kind, str(e)
        except AdmissionError as e:
            kind, reason = e.check, str(e)
        except Exception as e:  # noqa: BLE001 - any failure refuses the version
            kind, reason = "load", f"start: {type(e).__name__}: {first_line(e)}"
        else:
            self.registry.add(model)
            self._loaded[(name, version)] = (path, fingerprint)
            self._refused.pop((name, version), None)
            if self.metrics is not None:
                self.metrics.mark_loaded(model)
            log.info("model %s version %s verified and serving in %s (%.1fs; manifest sha256 "
                     "%s)", name, version, model.precision_choice["precision"],
                     time.monotonic() - start, manifest_digest)
            return True
        log.error("model %s version %s refused (%s): %s; still serving %s", name, version,
                  kind, reason, self.registry.versions(name) or "nothing")
        self._refused[(name, version)] = fingerprint
        self.registry.refuse(name, version, reason)
        if self.metrics is not None:
            self.metrics.load_failures.labels(name, version, kind).inc()
        release_memory()
        return False

    def _admitted(self, path):
        """The predictor of the version at ``path`` once it passed admission; Refused (or
        AdmissionError) with the reason otherwise."""
        if not self.allow_external_symlinks:
            real = os.path.realpath(path)
            if outside(real, self.root):
                raise Refused("symlink", f"{path} resolves to {real}, outside the repository "
                              f"{self.root}; move the export into the repository or set "
                              f"Deploy.allow_external_symlinks: true")
        try:
            predictor = self.load_predictor(path)
        except AdmissionError:  # the server's loader admits (each precision it tries)
            raise
        except (UnservableExportError, DataError, OSError, ValueError) as e:
            raise Refused("manifest", first_line(e)) from None
        except Exception as e:  # noqa: BLE001 - a broken file raises anything from a runtime
            raise Refused("load", f"{path}: {type(e).__name__}: {first_line(e)}") from None
        if self.after_load is not None:
            self.after_load()
        if getattr(predictor, "admission", None) is None:  # a loader that does not admit
            predictor.admission = admit(predictor, renderers=self.renderers)
        return predictor

    def _retire_older(self, name, version):
        older = [old for old in self.registry.versions(name) if int(old) < int(version)]
        for old in older:
            self._retire(name, old)  # new requests go to `version` from now on
        if older:  # a full collection walks every object of the process: only when one went
            release_memory()

    def _retire(self, name, version):
        """Take one version out of routing, then answer what its queue holds and unload it."""
        model = self.registry.get(name, version)
        self.registry.withdraw(model)
        self._loaded.pop((name, version), None)
        drained = model.close(self.deploy.drain_timeout_s)
        if self.metrics is not None:
            self.metrics.mark_unloaded(model)
        log.info("model %s version %s unloaded (%s)", name, version,
                 "queue drained" if drained else "NOT drained before the timeout")

    def unload(self, name):
        """Every served version of ``name`` unloaded (queues drained); the poller leaves the
        model unloaded until ``refresh(name)`` with ``retry_newest`` (the load endpoint)."""
        with self._lock:
            self._unloaded.add(name)
            for version in self.registry.versions(name):
                self._retire(name, version)
        release_memory()

    def unserved(self):
        """Models of the repository with no version serving that were not unloaded on
        request (every version refused): the server is not ready while there are any."""
        seen = {e["name"] for e in self.registry.index()
                if os.path.isdir(os.path.join(self.root, e["name"]))}  # removed: not a model
        return sorted(seen - set(self.registry.names()) - self._unloaded)

    # ------------------------------------------------------------ polling
    def start_polling(self):
        if not self.poll_s:
            return
        self._thread = threading.Thread(target=self._poll, name="repository-poll", daemon=True)
        self._thread.start()

    def _poll(self):
        while not self._stop.wait(self.poll_s):
            try:
                models = [n for n, versions in scan(self.root).items() if versions]
            except OSError:
                log.exception("model repository scan failed")
                continue
            for name in self.registry.names():
                if name not in models:  # every version directory gone: only the marks to set
                    with self._lock:
                        self._check_served(name)
            for name in models:  # one model's failure does not hold up the others
                try:
                    self.refresh(name, retry_newest=False)
                except Exception:  # noqa: BLE001 - the poller must outlive a bad model
                    log.exception("model repository: refreshing %s failed", name)

    def stop(self, wait=True):
        self._stop.set()
        if wait and self._thread is not None:
            self._thread.join(60)
