"""Fixes to the model call itself, tried by wrapping the method the endpoint calls on the
very objects it calls (an instance attribute, removed after each block): autograd off, eval
mode, padding trimmed, a repeated call answered from memory."""

from __future__ import annotations

from typing import Any, Callable

from ..evidence import Evidence, WhatIf
from ..inputs import fingerprint
from .lab import Fix, Lab
from .memo import patching
from .seen import Seen

__all__ = ["eval_mode", "inference_mode", "is_seq", "map_tensors", "mask_of", "memoise_repeated", "trim_padding"]


def _wrap_each(targets: list[tuple[Any, str]], make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Callable[[], Callable[[], None]]:
    """A fix's ``apply``: each target's method replaced on the instance by ``make(bound method)``."""

    def apply() -> Callable[[], None]:
        with patching() as patches:
            for obj, name in targets:
                patches.method(obj, name, make(getattr(obj, name)))
        return patches.undo

    return apply


def _counted(count: list[int], body: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return body(*args, **kwargs)

    return call


def inference_mode(ev: Evidence, lab: Lab, seen: Seen) -> WhatIf | None:
    warm = ev.warm
    if warm is None or not warm.forwards.grad or seen.torch is None or not seen.modules:
        return None
    torch, count = seen.torch, [0]
    tried: WhatIf | None = None
    for words, mode in (("the forward under torch.inference_mode()", torch.inference_mode), ("the forward under torch.no_grad()", torch.no_grad)):

        def make(forward: Callable[..., Any], mode: Any = mode) -> Callable[..., Any]:
            def quiet(*args: Any, **kwargs: Any) -> Any:
                with mode():
                    return forward(*args, **kwargs)

            return _counted(count, quiet)

        count[0] = 0
        tried = lab.compare(Fix("inference-mode", words, _wrap_each([(m, "forward") for m in seen.modules], make), hits=lambda: count[0]))
        if tried.tried or "failed with the fix" not in tried.why_not:
            return tried  # (inference tensors refuse some later in-place use: then no_grad, which does not)
    return tried


def eval_mode(ev: Evidence, lab: Lab, seen: Seen) -> WhatIf | None:
    warm = ev.warm
    if warm is None or not warm.forwards.training or not seen.modules:
        return None
    count = [0]

    def make(forward: Callable[..., Any]) -> Callable[..., Any]:
        module = forward.__self__

        def in_eval(*args: Any, **kwargs: Any) -> Any:
            flags = [(m, m.training) for m in module.modules()]
            module.eval()
            try:
                return forward(*args, **kwargs)
            finally:
                for m, flag in flags:
                    m.training = flag

        return _counted(count, in_eval)

    changes = warm.forwards.training_changes_output > 0
    return lab.compare(
        Fix("eval-mode", "the model in eval() for its forward", _wrap_each([(m, "forward") for m in seen.modules], make),
            same_answers=not changes, hits=lambda: count[0])  # fmt: skip
    )


def trim_padding(ev: Evidence, lab: Lab, seen: Seen) -> WhatIf | None:
    """The columns that are padding in every row of the batch cut off before the forward, and
    the outputs padded back after it (with zeros, where the attention mask hides them)."""
    warm = ev.warm
    if warm is None or warm.forwards.pad_share is None or warm.forwards.pad_share < 0.5 or seen.torch is None or not seen.modules:
        return None
    torch, count = seen.torch, [0]

    def make(forward: Callable[..., Any]) -> Callable[..., Any]:
        def trimmed(*args: Any, **kwargs: Any) -> Any:
            mask = mask_of(args, kwargs)
            if mask is None or mask.dim() != 2:
                return forward(*args, **kwargs)
            used = (mask != 0).any(0).nonzero()
            if used.numel() == 0:
                return forward(*args, **kwargs)
            lo, hi, length = int(used[0]), int(used[-1]) + 1, int(mask.shape[1])
            if hi - lo == length:
                return forward(*args, **kwargs)
            count[0] += 1
            cut = lambda t: t[:, lo:hi] if is_seq(torch, t, length) else t  # noqa: E731
            out = forward(*map_tensors(args, cut), **map_tensors(kwargs, cut))

            def back(t: Any) -> Any:
                if not is_seq(torch, t, hi - lo):
                    return t
                full = t.new_zeros((t.shape[0], length, *t.shape[2:]))
                full[:, lo:hi] = t
                return full

            return map_tensors(out, back)

        return trimmed

    return lab.compare(Fix("trim-padding", "padding columns cut from the model's input", _wrap_each([(m, "forward") for m in seen.modules], make),
                           hits=lambda: count[0]))  # fmt: skip


def memoise_repeated(ev: Evidence, lab: Lab, seen: Seen) -> WhatIf | None:
    """A call whose inputs were the same in every request answered from memory."""
    r = ev.repeated
    if r is None or r.calls_per_request < 1:
        return None
    targets = {fp: seen.owners[fp] for fp in seen.constant if fp in seen.owners}
    if not targets:
        return WhatIf(fix="the repeated call answered from memory", why_not="the object the repeated call went to was not kept (built per request)")
    memory: dict[str, Any] = {}
    count = [0]

    def apply() -> Callable[[], None]:
        with patching() as patches:
            for fp, (obj, method, inputs_of) in targets.items():

                def remembered(*args: Any, _call: Any = getattr(obj, method), _fp: str = fp, _of: Any = inputs_of, **kwargs: Any) -> Any:
                    if fingerprint(_of(args, kwargs)) != _fp:
                        return _call(*args, **kwargs)
                    if _fp in memory:
                        count[0] += 1
                        return memory[_fp]
                    memory[_fp] = out = _call(*args, **kwargs)
                    return out

                patches.method(obj, method, remembered)
        return patches.undo

    return lab.compare(Fix("memoise-repeated", "the repeated call answered from memory", apply, hits=lambda: count[0], release=memory.clear))


def mask_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    m = kwargs.get("attention_mask")
    if m is None and args and isinstance(args[0], dict):
        m = args[0].get("attention_mask")
    if m is None and len(args) > 1 and hasattr(args[1], "dim"):
        m = args[1]  # model(input_ids, attention_mask)
    return m if hasattr(m, "dim") else None


def is_seq(torch: Any, t: Any, length: int) -> bool:
    return isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[1] == length


def map_tensors(obj: Any, fn: Callable[[Any], Any], depth: int = 0) -> Any:
    """``fn`` on every tensor in a structure; dict types (BatchEncoding, ModelOutput) and tuples kept."""
    if depth > 4:
        return obj
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(map_tensors(v, fn, depth + 1) for v in obj)
    if isinstance(obj, list):
        return [map_tensors(v, fn, depth + 1) for v in obj]
    if isinstance(obj, dict):
        mapped = {k: map_tensors(v, fn, depth + 1) for k, v in obj.items()}
        if hasattr(obj, "to_tuple"):  # transformers' ModelOutput: a dataclass over a dict
            return obj.__class__(**mapped)
        try:
            return obj.__class__(mapped)  # BatchEncoding and other dict types keep their type
        except Exception:
            return mapped
    return fn(obj)

