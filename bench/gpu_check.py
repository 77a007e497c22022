"""The CUDA paths, checked on a real GPU. Run it on a machine with one; commit its output.

    python bench/gpu_check.py > docs/gpu-check.md

Checks: (1) CUDA-event stage timing charges a kernel to the stage that launched it, while
host clocks charge it to the stage that synchronises, and what each clock costs per request; (2) the doctor's probes count real
host<->device copies, pinned sources and sync points; (3) the model-not-on-accelerator rule
fires for a CPU model when a GPU is there; (4) servescope.serve runs on the GPU with pinned
staging buffers and batches concurrent requests.
"""

from __future__ import annotations

import asyncio
import platform
import sys
import time

import torch

import servescope
from servescope import stage, trace
from servescope.doctor import DoctorOptions, diagnose
from servescope.doctor.probes import Probes, new_evidence, set_evidence


def line(text: str = "") -> None:
    print(text, flush=True)


def timing_check() -> None:
    a = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    line("## 1. Stage timing: host clock vs CUDA events vs sync\n")
    line("| mode | infer ms | to_host ms |\n|---|---|---|")
    for mode in ("wall", "events", "sync"):
        rows = []
        for _ in range(5):
            with trace(cuda=mode) as t:
                with stage("infer"):
                    b = a @ a
                    for _ in range(4):
                        b = b @ a
                with stage("to_host"):
                    b[:1, :1].cpu()
            rows.append(t.durations_ms)
        med = {k: sorted(r.get(k, 0.0) for r in rows)[2] for k in ("infer", "to_host")}
        line(f"| {mode} | {med['infer']:.3f} | {med['to_host']:.3f} |")
    line("\nExpected: `wall` shows a tiny infer and a large to_host; `events` and `sync` agree on a large infer.\n")


def overhead_check() -> None:
    line("## 1b. What a traced request costs the host, per clock (8 empty stages)\n")
    names = ("validate", "preprocess", "to_device", "infer", "to_host", "postprocess", "serialize", "send")
    line("| clock | us per request |\n|---|---|")
    for mode in ("wall", "events", "sync"):
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(500):
                with trace(cuda=mode):
                    for name in names:
                        with stage(name):
                            pass
            best = min(best, (time.perf_counter() - t0) / 500 * 1e6)
        line(f"| {mode} | {best:.1f} |")
    line("\nEvents cost two CUDA event records per stage and one read each at the end.\n")


def probes_check() -> None:
    line("## 2. Probes on real copies\n")
    model = torch.nn.Linear(512, 512).cuda().eval()
    ev = new_evidence()
    with Probes():
        set_evidence(ev)
        with trace() as t:
            x = torch.randn(8, 512)
            parts = [x[i].cuda(non_blocking=True) for i in range(8)]  # unpinned, piecemeal
            pinned = x.pin_memory().to("cuda", non_blocking=True)
            with torch.inference_mode():
                y = model(pinned)
            [float(v) for v in y[0, :4]]  # .item-like syncs in a loop
            y.cpu()
    keys = ("h2d", "d2h", "small_copies", "unpinned_async", "syncs", "copy_bytes")
    line("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    line("| " + " | ".join(str(ev[k]) for k in keys) + " |")
    line(f"\nforward: {ev['forwards'][0]}\n\nstages: {t.durations_ms}\n")
    del parts


def rule_check() -> None:
    line("## 3. model-not-on-accelerator on a CPU model\n")
    cpu_model = torch.nn.Sequential(torch.nn.Linear(256, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10)).eval()

    def predict(payload):
        with torch.inference_mode():
            return cpu_model(torch.tensor(payload["x"]).unsqueeze(0)).tolist()

    rep = diagnose(predict, payload={"x": [0.1] * 256}, options=DoctorOptions(requests=10, concurrency=4, concurrent_requests=16))
    for f in rep.findings:
        line(f"- {f.severity} {f.id}: {f.evidence}")
    line("")


def serve_check() -> None:
    line("## 4. servescope.serve on the GPU\n")

    class MLP(servescope.Model):
        example = {"x": [0.0] * 256}

        def load(self, device):
            return torch.nn.Sequential(torch.nn.Linear(256, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10))

        def validate(self, payload):
            return payload["x"]

        def preprocess(self, item):
            return torch.tensor(item, dtype=torch.float32)

        def postprocess(self, output):
            return {"y": output.numpy()}

    import httpx

    app = servescope.serve(MLP(), max_batch_size=32)

    async def go():
        await app.startup()
        await app.wait_ready()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            lone = [await c.post("/predict", json={"x": [0.1] * 256}) for _ in range(5)]
            t0 = time.perf_counter()
            rs = await asyncio.gather(*(c.post("/predict", json={"x": [0.1] * 256}) for _ in range(256)))
            dt = time.perf_counter() - t0
        await app.shutdown()
        return lone, rs, dt

    lone, rs, dt = asyncio.run(go())
    line(f"a lone request runs inline on the event loop: {app.info.get('inline')}; its Server-Timing: {lone[-1].headers['server-timing']}")
    line(f"device: {app.info['device']}; 256 concurrent requests in {dt:.3f} s; statuses {sorted({r.status_code for r in rs})}")
    line(f"pinned staging buffers: {len(app.runtime._pinned)}; batches: {app.batcher.batches}")
    line(f"a response's Server-Timing: {rs[-1].headers['server-timing']}\n")


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("no CUDA device: run this on a GPU machine")
    line(f"# GPU check ({time.strftime('%Y-%m-%d')})\n")
    line(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}, Python {platform.python_version()}")
    line(f"stages in C (servescope._speedups): {servescope.timing.SPEEDUPS}\n")
    for check in (timing_check, overhead_check, probes_check, rule_check, serve_check):
        try:
            check()
        except Exception as exc:  # one failing check must not hide the others
            line(f"**{check.__name__} failed**: {type(exc).__name__}: {exc}\n")


if __name__ == "__main__":
    main()
