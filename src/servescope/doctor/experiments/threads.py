"""Fewer torch threads: the intra-op pool sized to the CPUs really free (a neighbour on the
machine, workers beside this one), tried on the endpoint as written.

``torch.set_num_threads`` holds for threads that have not run a parallel region yet; the
endpoint's own worker threads keep the size they started with. So while applied, the model
call runs on one thread of the experiment's own, whose pool is the size tried, and the
caller waits for it (the hand-off costs tens of microseconds: against the fix, not for it).
Setting that thread's size also sets the default of threads made later: it is put back as
soon as the thread has started, so the endpoint's threads, old and new, are never changed.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from ..evidence import Evidence, WhatIf
from .lab import Fix, Lab
from .memo import patching
from .seen import Seen

__all__ = ["fewer_threads", "thread_target"]


def thread_target(ev: Evidence) -> int | None:
    """The intra-op pool to try: the CPUs this process may use, less those other processes
    kept busy, shared among the workers; None when torch already uses no more."""
    env = ev.environment
    if env is None or not env.torch_threads or env.torch_threads <= 1 or not env.cpus_available:
        return None
    others = ev.machine.others_cores if ev.machine is not None and ev.machine.others_cores is not None else 0.0
    target = max(1, min(int(env.cpus_available) // max(env.workers, 1), int(env.cpus_available - others + 0.5)))
    return target if target < env.torch_threads else None


def fewer_threads(ev: Evidence, lab: Lab, seen: Seen) -> WhatIf | None:
    target = thread_target(ev)
    torch = seen.torch
    if target is None or torch is None:
        return None
    module_type = torch.nn.Module
    targets = list({id(o): (o, m) for o, m, _ in seen.owners.values() if isinstance(o, module_type)}.values())
    targets += [(m, "forward") for m in seen.modules if id(m) not in {id(o) for o, _ in targets}]
    if not targets:
        return None
    before = torch.get_num_threads()
    def sized() -> None:
        torch.set_num_threads(target)
        torch.get_num_threads()  # (this thread's pool is settled now, before the default goes back)

    pool = ThreadPoolExecutor(1, thread_name_prefix="servescope-threads", initializer=sized)
    pool.submit(lambda: None).result()  # its thread starts now, sized to the target ...
    torch.set_num_threads(before)  # ... and the default new threads get is put back at once
    count = [0]

    def make(call: Callable[..., Any]) -> Callable[..., Any]:
        def on_fewer_threads(*args: Any, **kwargs: Any) -> Any:
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
        return patches.undo

    return lab.compare(
        Fix("torch-threads", f"torch.set_num_threads({target}) for the model's calls", apply, hits=lambda: count[0],
            release=lambda: pool.shutdown(wait=False))  # fmt: skip
    )
