"""Fewer compute threads: a pool sized to the CPUs really free (a neighbour on the machine,
workers beside this one), tried on the endpoint as written, for each kind of pool.

- torch: the experiment cannot reach into the endpoint's own worker threads (each keeps its
  pool size), so while applied the model's calls run on one thread of the experiment's own,
  whose pool is the size tried, and the caller waits for it (the hand-off costs tens of
  microseconds: against the fix, not for it). The calls moved: the forwards of the models the
  requests called, and for a model class the requests built (a model built per request,
  whose construction and weight copies are parallel work too) its ``__init__``,
  ``load_state_dict`` and ``forward``, for every instance while applied. Setting that
  thread's size also sets the default of threads made later: it is put back as soon as the
  thread has started, so the endpoint's threads are never changed.
- ONNX Runtime: a session's intra-op pool is fixed when it is built, so a twin of each
  session the requests ran is built with the size tried (same model, options and providers;
  the memory bound counts it), and the session's ``run`` goes to the twin in the fixed blocks.
- BLAS and OpenMP (numpy, scikit-learn): ``threadpoolctl.threadpool_limits`` for the fixed
  blocks, lifted after each.
"""

from __future__ import annotations

import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from ..evidence import Evidence, WhatIf
from .lab import Fix, Lab
from .memo import patching
from .seen import Seen

__all__ = ["fewer_blas_threads", "fewer_ort_threads", "fewer_threads", "sized_pool", "thread_target"]


def sized_pool(torch: Any, threads: int, name: str = "servescope-threads") -> tuple[ThreadPoolExecutor, threading.Thread]:
    """A pool of one thread whose torch pool has ``threads`` threads. Setting the count also
    sets the default of threads made later, so it is put back as soon as that thread's pool is
    settled: the endpoint's threads keep theirs."""
    before = torch.get_num_threads()
    made: list[threading.Thread] = []

    def sized() -> None:
        torch.set_num_threads(threads)
        torch.get_num_threads()  # (this thread's pool is settled now, before the default goes back)
        made.append(threading.current_thread())

    pool = ThreadPoolExecutor(1, thread_name_prefix=name, initializer=sized)
    try:
        pool.submit(lambda: None).result()  # its thread starts now, sized ...
    finally:
        torch.set_num_threads(before)  # ... and the default new threads get is put back at once
    return pool, made[0]


def thread_target(ev: Evidence, pool: str = "torch_threads") -> int | None:
    """The pool size to try: the CPUs this process may use, less those other processes kept
    busy, shared among the workers; None when the pool (an ``Environment`` field) is no bigger."""
    env = ev.environment
    threads = getattr(env, pool, None) if env is not None else None
    if env is None or not threads or threads <= 1 or not env.cpus_available:
        return None
    others = ev.machine.others_cores if ev.machine is not None and ev.machine.others_cores is not None else 0.0
    target = max(1, min(int(env.cpus_available) // max(env.workers, 1), int(env.cpus_available - others + 0.5)))
    return target if target < threads else None


def fewer_threads(ev: Evidence, lab: Lab, seen: Seen) -> WhatIf | None:
    target = thread_target(ev)
    torch = seen.torch
    if target is None or torch is None:
        return None
    module_type = torch.nn.Module
    targets = list({id(o): (o, m) for o, m, _ in seen.owners.values() if isinstance(o, module_type)}.values())
    targets += [(m, "forward") for m in seen.modules if id(m) not in {id(o) for o, _ in targets}]
    built = [t for t in seen.model_types if isinstance(t, type) and issubclass(t, module_type) and not t.__module__.startswith("torch.")]
    if not targets and not built:
        return None
    pool, sized_thread = sized_pool(torch, target)
    count = [0]

    def make(call: Callable[..., Any]) -> Callable[..., Any]:
        def on_fewer_threads(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is sized_thread:  # (a call within a moved call: already there)
                return call(*args, **kwargs)
            count[0] += 1
            grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()

            def run() -> Any:  # the caller's autograd mode, on the experiment's thread
                with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                    return call(*args, **kwargs)

            return pool.submit(run).result()

        return on_fewer_threads

    def apply() -> Callable[[], None]:
        with patching() as patches:
            for obj, method in targets:
                patches.method(obj, method, make(getattr(obj, method)))
            for cls in built:  # every instance, the ones built during the block too
                for method in ("__init__", "load_state_dict", "forward"):
                    patches.set(cls, method, make(getattr(cls, method)))
        return patches.undo

    return lab.compare(
        Fix("torch-threads", f"torch.set_num_threads({target}) for the model's calls", apply, hits=lambda: count[0],
            release=lambda: pool.shutdown(wait=False))  # fmt: skip
    )


def fewer_ort_threads(ev: Evidence, lab: Lab, seen: Seen) -> WhatIf | None:
    target = thread_target(ev, "ort_threads")
    ort = sys.modules.get("onnxruntime")
    if target is None or ort is None:
        return None
    sessions = list({id(o): o for o, _, _ in seen.owners.values() if isinstance(o, ort.InferenceSession)}.values())
    if not sessions:
        return None
    words = f"sess_options.intra_op_num_threads = {target} for the ONNX Runtime sessions"
    if not all(getattr(s, "_model_bytes", None) or getattr(s, "_model_path", None) for s in sessions):
        return WhatIf(fix=words, why_not="a session whose model the doctor cannot read again (neither its path nor its bytes are kept)")
    twins: dict[int, Any] = {}  # built by the first fixed block: after the lab's time and memory are read
    count = [0]

    def twin_of(session: Any) -> Any:
        if id(session) not in twins:
            opts = session.get_session_options()
            twin_opts = ort.SessionOptions()
            for name in ("graph_optimization_level", "execution_mode", "inter_op_num_threads", "enable_mem_pattern", "enable_cpu_mem_arena"):
                setattr(twin_opts, name, getattr(opts, name))
            twin_opts.intra_op_num_threads = target
            providers = session.get_providers()
            provider_options = session.get_provider_options()
            source = getattr(session, "_model_bytes", None) or session._model_path
            twins[id(session)] = ort.InferenceSession(
                source, twin_opts, providers=providers, provider_options=[provider_options.get(p, {}) for p in providers]
            )
        return twins[id(session)]

    def make(session: Any) -> Callable[..., Any]:
        twin = twin_of(session)

        def on_fewer_threads(*args: Any, **kwargs: Any) -> Any:
            count[0] += 1
            return twin.run(*args, **kwargs)

        return on_fewer_threads

    def apply() -> Callable[[], None]:
        with patching() as patches:
            for session in sessions:
                patches.method(session, "run", make(session))
        return patches.undo

    return lab.compare(Fix("ort-threads", words, apply, hits=lambda: count[0], release=twins.clear))


def fewer_blas_threads(ev: Evidence, lab: Lab, seen: Seen) -> WhatIf | None:
    """BLAS's pool (OpenBLAS, MKL) is the process's, OpenMP's each thread's own: the limit is
    set around each model call, on the thread that makes it, and lifted after it. A torch
    module's calls are left to ``torch-threads`` (the limit would shrink torch's OpenMP pool:
    the same experiment again)."""
    target = thread_target(ev, "blas_threads")
    module = seen.torch.nn.Module if seen.torch is not None else ()
    targets = list({id(o): (o, m) for o, m, _ in seen.owners.values() if not isinstance(o, module)}.values())
    if target is None or not targets:
        return None
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    controller = ThreadpoolController()
    count = [0]

    def make(call: Callable[..., Any]) -> Callable[..., Any]:
        def on_fewer_threads(*args: Any, **kwargs: Any) -> Any:
            count[0] += 1
            with controller.limit(limits=target):
                return call(*args, **kwargs)

        return on_fewer_threads

    def apply() -> Callable[[], None]:
        with patching() as patches:
            for obj, method in targets:
                patches.method(obj, method, make(getattr(obj, method)))
        return patches.undo

    return lab.compare(Fix("blas-threads", f"threadpoolctl.threadpool_limits({target}) for numpy's BLAS and OpenMP", apply, hits=lambda: count[0]))
