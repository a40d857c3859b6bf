"""A server's SIGTERM, whatever native library it loads while it serves.

Importing Paddle installs glog's failure handlers, SIGTERM's among them: it prints
"Termination signal" and kills the process instead of letting it drain.  A single export is
loaded before the server installs its handlers.  A model repository's versions load while it
serves, each on the runtime chosen for it (with backend auto, a version on ONNX Runtime never
imports Paddle), so a repository's server
- holds SIGTERM blocked in every thread it starts (``sigterm_held``) and takes it from the
  pending signals at each tick: a blocked signal reaches no handler;
- puts SIGTERM's action back as soon as Paddle's import has installed glog's
  (``PaddleImportWatch``), for the threads started before the server (NumPy's BLAS pool)
  that do not block it;
- re-arms Python's handlers on the main thread after every load (``rearm_signal_handlers``),
  for any other native library.

A single export's server holds SIGTERM the same way (Paddle's import, while its export loads,
would install glog's handler: a fatal-error report instead of an exit).
"""
import contextlib
import ctypes
import importlib.abc
import signal
import sys
import threading

# ctypes rather than the signal module: the action is read and put back in whichever thread
# imports Paddle, and signal.signal works on the main thread only
_LIBC = ctypes.CDLL(None, use_errno=True)
_SIGACTION_BYTES = 256  # more than any libc's struct sigaction: saved and restored whole


def _sigaction(sig, new=None):
    """SIGTERM's (``sig``'s) action as it was, raw; ``new`` (raw, from an earlier call)
    installed in its place."""
    old = ctypes.create_string_buffer(_SIGACTION_BYTES)
    if _LIBC.sigaction(sig, new, old) != 0:
        raise OSError(ctypes.get_errno(), f"sigaction({sig}) failed")
    return old


class PaddleImportWatch(importlib.abc.MetaPathFinder):
    """On ``sys.meta_path``: finds nothing itself, but wraps the loading of Paddle's modules
    that install glog's handlers.  ``paddle.base.core.init_glog`` (called as ``paddle.base``
    runs) installs them: SIGTERM's action from before the call is put back as it returns,
    and again once ``paddle.base`` has run, should a later Paddle install them elsewhere."""

    def find_spec(self, name, path=None, target=None):
        if name not in ("paddle.base", "paddle.base.core"):
            return None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
        else:
            return None
        run = getattr(spec.loader, "exec_module", None)
        if run is None:  # not a module of source or extension files: nothing to wrap
            return spec

        def exec_module(module):
            before = _sigaction(signal.SIGTERM)
            try:
                run(module)
            finally:
                _sigaction(signal.SIGTERM, before)
            if name == "paddle.base.core" and callable(getattr(module, "init_glog", None)):
                module.init_glog = _keeping_sigterm(module.init_glog)

        spec.loader.exec_module = exec_module  # this module's own loader instance
        return spec


def _keeping_sigterm(install):
    def call(*args, **kwargs):
        before = _sigaction(signal.SIGTERM)
        try:
            return install(*args, **kwargs)
        finally:
            _sigaction(signal.SIGTERM, before)
    return call


@contextlib.contextmanager
def sigterm_held(hold):
    """With ``hold``: SIGTERM blocked in this thread, and so in every thread started while it
    runs, and Paddle's import watched (``PaddleImportWatch``) -> True; the caller takes SIGTERM
    from the pending signals (``sigterm_pending``).  Afterwards what is pending is taken
    (uvicorn re-raises the signal it drained on) and the mask restored.  -> False, nothing
    done, elsewhere than the main thread (no signal handlers there), when SIGTERM was blocked
    already (the caller's to take), or where pending signals cannot be taken without waiting."""
    if (not hold or threading.current_thread() is not threading.main_thread()
            or not hasattr(signal, "sigtimedwait")):  # macOS has no sigtimedwait
        yield False
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    if signal.SIGTERM in before:
        yield False
        return
    watch = PaddleImportWatch()
    sys.meta_path.insert(0, watch)
    try:
        yield True
    finally:
        sys.meta_path.remove(watch)
        while sigterm_pending():
            pass
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def sigterm_pending():
    """Take a pending SIGTERM, without waiting -> whether there was one."""
    return signal.sigtimedwait({signal.SIGTERM}, 0) is not None


def rearm_signal_handlers():
    """Re-install Python's SIGINT/SIGTERM handlers at the C level (main thread only; a no-op
    elsewhere): a native library loaded after the server started may have replaced them."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(sig)
        if callable(handler):
            signal.signal(sig, handler)
