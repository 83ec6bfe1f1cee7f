"""Where a cold compile of the GPT train step goes: model fwd/bwd vs the optimizer's first step.
python diag_master.py SIZE OPTIMIZER BLOCKS [DEVICE]"""
import os, sys, tempfile, time
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="diag-inductor-"))
import torch
from workloads import optim
from workloads.steps import build_gpt, Speed
size, opt, blocks = sys.argv[1:4]
dev = torch.device(sys.argv[4] if len(sys.argv) > 4 else "cuda")
sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
spent = {"optimizer_step": []}
orig = optim.MasterAdamW.step
def timed(self):
    sync(); t = time.time(); orig(self); sync(); spent["optimizer_step"].append(round(time.time() - t, 2))
optim.MasterAdamW.step = timed
kw = dict(context=512, batch=4, vocab=10000) if dev.type == "cuda" else dict(context=32, batch=2, vocab=512)
w = build_gpt(size=size, mode="train", dtype="bf16", attention="sdpa", device=dev, seed=0,
              speed=Speed(optimizer=opt, compile="default", compile_blocks=blocks,
                          sdpa_backend="cudnn" if dev.type == "cuda" else "auto"), **kw)
steps = []
for _ in range(3):
    sync(); t = time.time(); w.step(); sync(); steps.append(round(time.time() - t, 2))
from torch._dynamo.utils import counters, compile_times
print(f"== {size} {opt} {blocks}: step s {steps} optimizer step s {spent['optimizer_step']}")
print("stats", dict(counters["stats"]))
print("inductor", {k: v for k, v in counters["inductor"].items() if "cache" in k or "autotune" in k or "benchmark" in k})
rows = []
for line in compile_times(repr="str", aggregate=True).splitlines()[1:]:
    parts = line.rsplit(None, 1)
    try: rows.append((float(parts[1].split(",")[0]), parts[0].strip()))
    except (ValueError, IndexError): pass
for t, name in sorted(rows, reverse=True)[:22]: print(f"  {t:8.2f}  {name}")
