"""Findings that name memory (docs/findings.md): from a run's memory capture, what holds its
peak, and the time-for-memory trade its fix measured.

``activations_dominate_peak``: the activations (tensors saved for backward) are at least
:data:`ACTIVATION_SHARE` of the bytes alive at the step's peak, in a run that computes a
backward and does not checkpoint yet: activation checkpointing (``checkpoint: layers``)
keeps each layer's input only and recomputes the rest in backward. Where the results hold a
run that differs from this one in the checkpoint key only (its ladder's checkpoint rung, or
any run), the finding quotes what that run measured: its peak memory saved (GiB the step held,
``peak_memory_gib``) and the step time it paid, with the speed-up's 95% CI (as every fix's
gain); a variant that changes more is a joint gain and its memory is not credited to the fix.

``checkpoint_trade`` (on a run with ``checkpoint: layers`` whose twin without it finished): the
trade it measured, peak GiB saved against the step time paid (the twin's speed-up with its 95%
CI), and what holds the checkpointed run's peak. Below :data:`MIN_SAVED` of the twin's peak
it does not pay: the activations it frees were not what held the peak (parameters, gradients
and optimizer state at the end of backward, say), so the fix is to train without it, or to
shrink what holds the peak.
"""

from __future__ import annotations

from collections.abc import Iterator

from analysis.outputs.finding_base import SUMMARY, Context, Finding, Fix, recommend
from analysis.outputs.memory import CATEGORIES  # the memory view's, at the peak

# Half the peak in activations: checkpointing frees most of them, so the peak can fall by a
# third or more (it keeps one input per layer and the largest layer's recomputation).
ACTIVATION_SHARE = 0.5
SHARE_COLUMN = "memory_at_peak_share_activations"
# the workloads whose layers checkpoint: layers wraps (the GPT's blocks, a model's layers)
LAYERED = ("gpt", "model")
CHECKPOINT = Fix("activation checkpointing (checkpoint: layers)", {"checkpoint": ("layers",)})
# A fifth of the peak: less than that rarely buys a larger batch or model, for a step that
# recomputes every layer's forward (a third more GPU work or so)
MIN_SAVED = 0.2
NO_CHECKPOINT = Fix("train without activation checkpointing (checkpoint: none)",
                    {"checkpoint": ("none", None)})


def activations_dominate_peak(ctx: Context, run: str) -> Iterator[Finding]:
    """Activations hold most of the peak: checkpointing trades step time for that memory."""
    share = ctx.cell(run, SHARE_COLUMN)
    params = ctx.params(run)
    if share is None or float(share) < ACTIVATION_SHARE or params.get("mode") == "forward":
        return
    if params.get("workload") not in LAYERED:
        return
    f = Finding(
        rule="activations_dominate_peak",
        run=run,
        title=f"activations are {float(share):.0%} of the peak memory",
        value=float(share),
        threshold=ACTIVATION_SHARE,
        source=SUMMARY,
        key_column="run",
        key=run,
        value_column=SHARE_COLUMN,
        fix="",
    )
    found = recommend(ctx, f, [CHECKPOINT])
    if found is None:
        return
    if found.gain_run and not found.joint:
        found.fix += memory_trade(ctx, run, found.gain_run, found.gain)
    yield found


def memory_trade(ctx: Context, run: str, variant: str, gain: float | None) -> str:
    """ "; measured in V: peak -X GiB (A -> B GiB) for +Y% step time"."""
    before, after = ctx.cell(run, "peak_memory_gib"), ctx.cell(variant, "peak_memory_gib")
    if before is None or after is None or not gain:
        return ""
    saved = float(before) - float(after)
    return (
        f"; measured in `{variant}`: peak {-saved:+.2f} GiB ({float(before):.2f} → "
        f"{float(after):.2f} GiB) for {1 / gain - 1:+.0%} step time"
    )


def checkpoint_trade(ctx: Context, run: str) -> Iterator[Finding]:
    """What checkpointing bought and cost, measured against the run without it."""
    params = ctx.params(run)
    peak = ctx.cell(run, "peak_memory_gib")
    if params.get("checkpoint") != "layers" or peak is None:
        return
    f = Finding(
        rule="checkpoint_trade",
        run=run,
        title="",
        value=0.0,
        threshold=MIN_SAVED,
        source=SUMMARY,
        key_column="run",
        key=run,
        value_column="peak_memory_gib",
        fix="",
    )
    found = recommend(ctx, f, [NO_CHECKPOINT])
    twin_peak = ctx.cell(found.gain_run, "peak_memory_gib") if found and found.gain_run else None
    if found is None or found.joint or not found.gain or twin_peak is None:
        return
    saved = 1 - float(peak) / float(twin_peak)
    found.value = saved
    found.title = (
        f"activation checkpointing: peak {float(twin_peak):.2f} → {float(peak):.2f} GiB "
        f"({-saved:+.0%}) for {found.gain - 1:+.0%} step time{time_ci(found)}; "
        f"{peak_holders(ctx, run)}"
    )
    if saved >= MIN_SAVED:
        found.fix = ("keep it where the memory it frees is used (a larger batch: batch: max; a "
                     "larger model), else " + NO_CHECKPOINT.text)
    yield found


def time_ci(f: Finding) -> str:
    """ " (95% CI +76% to +154%)": the step time paid, from the twin's speed-up CI."""
    if f.gain_ci_low is None or f.gain_ci_high is None:
        return ""
    return f" (95% CI {f.gain_ci_low - 1:+.0%} to {f.gain_ci_high - 1:+.0%})"


def peak_holders(ctx: Context, run: str) -> str:
    """ "at its peak: optimizer state 49%, parameters 25%, ..." (the categories above 10%)."""
    shares = [(c, ctx.cell(run, f"memory_at_peak_share_{c}")) for c in CATEGORIES]
    held = sorted(((c, float(v)) for c, v in shares if v is not None), key=lambda x: -x[1])
    named = [f"{c.replace('_', ' ')} {v:.0%}" for c, v in held if v >= 0.1]
    return "at its peak: " + ", ".join(named) if named else "no memory capture of its peak"


MEMORY_RULES = [activations_dominate_peak, checkpoint_trade]
