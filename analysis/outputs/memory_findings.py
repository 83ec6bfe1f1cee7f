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
"""

from __future__ import annotations

from collections.abc import Iterator

from analysis.outputs.finding_base import SUMMARY, Context, Finding, Fix, recommend

# Half the peak in activations: checkpointing frees most of them, so the peak can fall by a
# third or more (it keeps one input per layer and the largest layer's recomputation).
ACTIVATION_SHARE = 0.5
SHARE_COLUMN = "memory_at_peak_share_activations"
# the workloads whose layers checkpoint: layers wraps (the GPT's blocks, a model's layers)
LAYERED = ("gpt", "model")
CHECKPOINT = Fix("activation checkpointing (checkpoint: layers)", {"checkpoint": ("layers",)})


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


MEMORY_RULES = [activations_dominate_peak]
