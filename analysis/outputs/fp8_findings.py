"""Findings of FP8 training (run key ``float8``): whether it pays, measured, and why, from the
profile.

FP8 speeds up the GEMMs of the converted Linear layers and adds kernels that compute each
operand's scale (an amax) and cast it to FP8 (analysis/metrics/categories.py: FP8GEMM,
FP8Cast). It pays when the GEMM time it saves is more than the casts cost; the GEMMs grow
with the tokens per step (M) while the weights' casts do not, so small batches and narrow
layers lose. Each rule compares an FP8 run with its bf16 twin, a finished run that differs in
``float8`` alone, and quotes the measured speed-up with its 95% CI (finding_base.py):

* ``fp8_does_not_pay`` (on the FP8 run): FP8 is slower, or not significantly faster, than
  bf16. The cell is the FP8 run's cast/scale share of GPU time (kernel_categories.csv,
  FP8Cast), the threshold the share of its GPU time that its FP8 GEMMs saved over bf16's
  GEMMs: casts above it cost more than the GEMMs gained. The fix, ``float8: none``, comes with
  the bf16 twin's measured gain.
* ``fp8_pays`` (on the bf16 twin): the FP8 run is significantly faster. The cell is the bf16
  run's GEMM share (what FP8 can speed up), the fix ``float8`` with the FP8 run's gain.

Both titles give the cause from the two captures: GEMM ms per step in bf16 and in FP8, the
casts' ms per step, each run's GPU work per step, M and the converted layers' K x N; and,
where the GPU's wait for the host grew by more than the GPU's work changed (either way),
the host (the GPU's wait per untraced step and the kernels launched per step, each run's).
Without both captures they say so.
findings.py's ``find_all`` runs :data:`FP8_RULES`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from analysis.outputs.finding_base import Context, Finding, Fix, Rule, recommend
from analysis.outputs.runs import read_timing

RECIPES = ("tensorwise", "rowwise")
NO_FP8 = Fix("train the Linear layers in bf16 (float8: none)", {"float8": ("none", None)})
USE_FP8 = Fix(
    "train the Linear layers in FP8 (float8: tensorwise or rowwise; torchao)", {"float8": RECIPES}
)
CATEGORIES_CSV = "kernel_categories"


def is_fp8(params: dict[str, Any]) -> bool:
    return params.get("float8") in RECIPES


def _ms_per_step(ctx: Context, run: str, category: str) -> float | None:
    """GPU ms per captured step of one kernel category (summary: category_time_ns_<cat>)."""
    return _per_step(ctx, run, f"category_time_ns_{category}", 1e-6)


def _record(ctx: Context, run: str) -> dict[str, Any]:
    timing = read_timing(ctx.results / run)
    return (timing.ok_records or [{}])[0]


def tokens_per_step(record: dict[str, Any]) -> int | None:
    """M of every GEMM of a Linear layer: the record's tokens per step."""
    rate, mean_ms = record.get("tokens_per_s"), record.get("mean_ms")
    return round(rate * mean_ms / 1e3) if rate and mean_ms else None


def _per_step(ctx: Context, run: str, column: str, scale: float = 1.0) -> float | None:
    """A capture's total (summary column) per captured step, times ``scale``."""
    total, steps = ctx.cell(run, column), ctx.cell(run, "steps")
    return float(total) * scale / float(steps) if total is not None and steps else None


def host_wait(ctx: Context, run: str, gpu_ms: float) -> float | None:
    """ms of the untraced step not covered by the GPU's work (``gpu_ms`` per captured step):
    the untraced step time less it (kernel durations barely change under tracing; the host's
    launches do), where the GPU waits for the host, at least."""
    step = ctx.cell(run, "step_ms")
    return max(float(step) - gpu_ms, 0.0) if step is not None else None


def cause(ctx: Context, fp8: str, bf16: str) -> tuple[str, float | None, float | None]:
    """(the profile's account of the difference, the FP8 run's cast share of GPU time in %,
    the share its FP8 GEMMs saved in %); the shares None without both captures.

    The GPU's side: GEMM ms per step in bf16 and FP8, the casts' ms, and the whole GPU work per
    step of each (casts also replace autocast's weight copies and absorb normalizations, so
    GEMMs and casts alone do not sum to the change). Where the untraced step changed more by
    the host than by the GPU's work (the GPU waits longer per step for the host than bf16's
    did, by more than its work changed, up or down), the host is named as the cause, with the
    kernels each launches per step."""
    record = _record(ctx, fp8)
    shapes = (record.get("float8") or {}).get("shapes") or []
    m = tokens_per_step(record)
    where = (f"M = {m} tokens per step" if m else "M unknown") + (
        f", K×N {', '.join(f'{k}×{n}' for k, n in shapes)}" if shapes else ""
    )
    if any("capture_recompiled" in str(ctx.cell(r, "flags") or "") for r in (fp8, bf16)):
        return f"no cause from the captures: one recompiled, its kernels are not the timed ones " \
               f"({where})", None, None
    gemm16 = _ms_per_step(ctx, bf16, "GEMM")
    gemm8, other8 = _ms_per_step(ctx, fp8, "FP8GEMM"), _ms_per_step(ctx, fp8, "GEMM")
    casts = _ms_per_step(ctx, fp8, "FP8Cast")
    gpu8, gpu16 = (_per_step(ctx, r, "kernel_time_ns", 1e-6) for r in (fp8, bf16))
    if None in (gemm16, gemm8, other8, casts, gpu8, gpu16) or not gpu8:
        return f"no capture of both runs to say why ({where})", None, None
    saved = gemm16 - (gemm8 + other8)
    gpu_text = (
        f"its FP8 GEMMs take {gemm8:.3g} ms/step (with {other8:.3g} ms of GEMMs left in "
        f"bf16) where bf16's took {gemm16:.3g} ms: {saved:.3g} ms saved, against "
        f"{casts:.3g} ms/step of cast/scale kernels; GPU work {gpu8:.4g} ms/step against "
        f"bf16's {gpu16:.4g}"
    )
    wait8, wait16 = host_wait(ctx, fp8, gpu8), host_wait(ctx, bf16, gpu16)
    # the untraced step moved by the GPU's work and the host's wait: the host is the cause
    # only where its wait grew by more than the GPU's work changed, either way (a whole-step
    # graph whose wait grows 0.1 ms while FP8 saves 6 ms of GPU work is the GPU's gain)
    if wait8 is not None and wait16 is not None and wait8 - wait16 > abs(gpu8 - gpu16):
        k8, k16 = (_per_step(ctx, r, "kernel_count") for r in (fp8, bf16))
        kernels = f" while the host launches {k8:.0f} kernels per step (bf16: {k16:.0f})" \
            if k8 and k16 else ""
        text = (
            f"the host holds the step: the GPU waits at least {wait8:.3g} ms of each untraced "
            f"step (bf16: {wait16:.3g} ms){kernels}; on the GPU, {gpu_text} ({where})"
        )
    else:
        text = f"{gpu_text} ({where})"
    return text, casts / gpu8 * 100, saved / gpu8 * 100


def fp8_does_not_pay(ctx: Context, run: str) -> Iterator[Finding]:
    """The FP8 run is not significantly faster than its bf16 twin."""
    params = ctx.params(run)
    if not is_fp8(params):
        return
    twin = ctx.fix_variant(run, [NO_FP8])
    if twin is None or set(ctx.changed_keys(run, twin)) != {"float8"}:
        return
    text, cast_share, saved_share = cause(ctx, run, twin)
    f = Finding(
        rule="fp8_does_not_pay",
        run=run,
        title=f"FP8 ({params['float8']}) does not pay here: {text}",
        value=cast_share if cast_share is not None else float("nan"),
        threshold=saved_share if saved_share is not None else float("nan"),
        source=f"{run}/stats/{CATEGORIES_CSV}.csv",
        key_column="Category",
        key="FP8Cast",
        value_column="Time (%)",
        fix="",
    )
    found = recommend(ctx, f, [NO_FP8])
    # slower, or within the noise: bf16 at least as fast (a gain of bf16 over FP8 >= 1)
    if found and found.gain is not None and (found.gain >= 1 or not found.gain_significant):
        yield found


def fp8_pays(ctx: Context, run: str) -> Iterator[Finding]:
    """A bf16 run whose FP8 twin is significantly faster."""
    if is_fp8(ctx.params(run)) or ctx.params(run).get("mode") != "train":
        return
    twin = ctx.fix_variant(run, [USE_FP8])
    if twin is None or set(ctx.changed_keys(run, twin)) != {"float8"}:
        return
    text, _, _ = cause(ctx, twin, run)
    share = ctx.category_share(run, "GEMM")
    f = Finding(
        rule="fp8_pays",
        run=run,
        title=f"FP8 ({ctx.params(twin)['float8']}) pays here: {text}",
        value=share if share is not None else float("nan"),
        threshold=float("nan"),
        source=f"{run}/stats/{CATEGORIES_CSV}.csv",
        key_column="Category",
        key="GEMM",
        value_column="Time (%)",
        fix="",
        severity="info",
    )
    found = recommend(ctx, f, [USE_FP8])
    if found and found.gain is not None and found.gain > 1 and found.gain_significant:
        yield found


FP8_RULES: list[Rule] = [fp8_does_not_pay, fp8_pays]
