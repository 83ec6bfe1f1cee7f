"""Where a warm-cache compiled process spends its compile (issue 20): a forked timing child's
view. Imports the fork servers' preload list first (as a server does), then runs the workload's
main() with its arguments, under cProfile when PROFILE=path is set.
python diag_warm.py WORKLOAD ARGS..."""
import cProfile, importlib, json, os, pstats, sys, time
sys.path.insert(0, os.getcwd())
from pipeline.forkserver import PRELOAD
t0 = time.perf_counter()
for m in PRELOAD:
    try:
        importlib.import_module(m)
    except Exception as e:  # noqa: BLE001
        print("not preloaded", m, e)
preloaded = set(sys.modules)
t1 = time.perf_counter()
from workloads.__main__ import main
prof = cProfile.Profile() if os.environ.get("PROFILE") else None
t2 = time.perf_counter()
if prof:
    prof.enable()
try:
    main(sys.argv[1:])
except SystemExit:
    pass
if prof:
    prof.disable()
t3 = time.perf_counter()
new = sorted(set(sys.modules) - preloaded)
print(f"== preload {t1 - t0:.2f} s, main {t3 - t2:.2f} s, {len(new)} modules imported in main")
print("new module roots", sorted({'.'.join(m.split('.')[:3]) for m in new})[:60])
from torch._dynamo.utils import compile_times, counters
print("stats", dict(counters["stats"]))
print("inductor", {k: v for k, v in counters["inductor"].items()})
rows = []
for line in compile_times(repr="str", aggregate=True).splitlines()[1:]:
    parts = line.rsplit(None, 1)
    try:
        rows.append((float(parts[1].split(",")[0]), parts[0].strip()))
    except (ValueError, IndexError):
        pass
for t, name in sorted(rows, reverse=True)[:25]:
    print(f"  {t:8.3f}  {name}")
if prof:
    prof.dump_stats(os.environ["PROFILE"])
    for key in ("cumulative", "tottime"):
        print(f"-- cProfile by {key}")
        pstats.Stats(prof).sort_stats(key).print_stats(45)
