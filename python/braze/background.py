"""Graphs compiled on a background thread (Options.early_backward): AOTAutograd hands a training
graph's backward over with its forward, and braze compiles it while the forward runs. The
backward's first call waits for what is left of the compile."""
import threading
import time

_lock = threading.Lock()
_pool = None  # the thread pool, once needed
_pending = set()  # its compiles not yet done
_waited = 0.0  # seconds calls have waited for them


def start(compile_fn):
    """Runs compile_fn() (which returns a boxed callable) on the background thread. Returns a
    boxed callable that waits for it at its first call, then calls what it returned; it raises
    what compile_fn raised."""
    global _pool
    with _lock:
        if _pool is None:
            from concurrent.futures import ThreadPoolExecutor
            _pool = ThreadPoolExecutor(2, thread_name_prefix="braze-backward")
        future = _pool.submit(compile_fn)
        _pending.add(future)
    future.add_done_callback(_finished)
    compiled = None

    def call(args):
        global _waited
        nonlocal compiled
        if compiled is None:
            begin = time.perf_counter()
            fn = future.result()
            with _lock:
                _waited += time.perf_counter() - begin
            compiled = fn
        return compiled(args)
    call._boxed_call = True
    return call


def _finished(future):
    with _lock:
        _pending.discard(future)


def waited():
    """Seconds calls have waited for background compiles, in this process."""
    return _waited


def wait_all():
    """Waits until every background compile is done (their errors are raised by the calls
    that use them)."""
    with _lock:
        pending = list(_pending)
    for future in pending:
        future.exception()
