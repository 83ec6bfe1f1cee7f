# Stage 2: statistics per run (the nsys reports and what nsys lacks), then across runs.


# Per run, the tables the report lists under "4. Runs" (kernels, NVTX ranges with their GPU
# time, GPU time per phase).
REPORTED_RUN_TABLES = ["cuda_gpu_kern_sum", "nvtx_gpu_proj_sum", "phase_gpu_time"]


rule run_stats:
    """The 7 nsys stats reports (same values as `nsys stats`) plus extras, for one run; a run
    that failed gets empty reports and a metrics.json with its status. The run record gives
    the model size and a whole-step CUDA graph's node counts per phase; a compiled run's
    TORCH_TRACE maps its kernels to their source ops and model code (kernel_map.csv). From
    the same captures, the run's Perfetto trace (every rank on one clock) and timeline figure;
    a failed run gets an empty trace and a labelled placeholder figure."""
    input:
        image=IMAGE_INPUT,
        sqlite=f"{RESULTS}/{{run}}/profile.sqlite",
        exports=run_exports,
        times=f"{RESULTS}/{{run}}/times.json",
        trace=f"{RESULTS}/{{run}}/torch_trace",
    output:
        # per-run tables the report shows (sortable), the CSVs stay the source
        csvs=[
            (
                report(
                    f"{RESULTS}/{{run}}/stats/{name}.csv",
                    caption=f"../report/run_{name}.rst",
                    category="4. Runs",
                    subcategory="{run}",
                )
                if name in REPORTED_RUN_TABLES
                else f"{RESULTS}/{{run}}/stats/{name}.csv"
            )
            for name in STATS_CSVS
        ],
        metrics=f"{RESULTS}/{{run}}/stats/metrics.json",
        perfetto=report(
            f"{RESULTS}/{{run}}/trace/trace.perfetto-trace.gz",
            caption="../report/run_trace.rst",
            category="4. Runs",
            subcategory="{run}",
        ),
        timeline=report(
            f"{RESULTS}/{{run}}/trace/timeline.png",
            caption="../report/run_timeline.rst",
            category="4. Runs",
            subcategory="{run}",
        ),
    log:
        f"{LOGS}/run_stats/{{run}}.log",
    benchmark:
        f"{LOGS}/benchmark/run_stats/{{run}}.jsonl"
    params:
        python=PYTHON,
        outdir=lambda wc, output: os.path.dirname(output.metrics),
        tracedir=lambda wc, output: os.path.dirname(output.timeline),
        reports=" ".join(STATS_CSVS),
    container:
        RULE_CONTAINER
    shell:
        "if {params.python} -m pipeline.outcome ok {input.times}; then"
        " {params.python} -m analysis all {input.sqlite} -o {params.outdir}"
        " --record {input.times} --torch-trace {input.trace} > {log} 2>&1;"
        " else {params.python} -m pipeline.outcome failed-stats {input.times} {params.outdir}"
        " {params.reports} > {log} 2>&1; fi;"
        " {params.python} -m analysis trace {input.exports} -o {params.tracedir}"
        " --record {input.times} --torch-trace {input.trace} --name {wildcards.run} >> {log} 2>&1"


rule op_stats:
    """The operator table of a run's op capture (ops.csv: per PyTorch op its calls, the GPU
    time of the kernels it launched itself, kernels per call, CPU time, share of the step;
    ops_by_shape.csv with `ops: shapes`) and what the op ranges cost (ops_metrics.json)."""
    input:
        image=IMAGE_INPUT,
        sqlite=f"{RESULTS}/{{run}}/ops.sqlite",
        times=f"{RESULTS}/{{run}}/ops_times.json",
        lean=f"{RESULTS}/{{run}}/times.json",
    output:
        ops=report(
            f"{RESULTS}/{{run}}/stats/ops.csv",
            caption="../report/run_ops.rst",
            category="4. Runs",
            subcategory="{run}",
        ),
        shapes=f"{RESULTS}/{{run}}/stats/ops_by_shape.csv",
        metrics=f"{RESULTS}/{{run}}/stats/ops_metrics.json",
    log:
        f"{LOGS}/op_stats/{{run}}.log",
    benchmark:
        f"{LOGS}/benchmark/op_stats/{{run}}.jsonl"
    params:
        python=PYTHON,
        outdir=lambda wc, output: os.path.dirname(output.metrics),
    container:
        RULE_CONTAINER
    shell:
        # A failed op capture gives empty tables and its status in ops_metrics.json.
        "{params.python} -m analysis ops {input.sqlite} -o {params.outdir}"
        " --times {input.times} --lean-times {input.lean} > {log} 2>&1"


rule aggregate:
    """One row per run: untraced step time with its CI, traced time and profiler overhead,
    status, parameters, GPU metrics, phase GPU time and provenance."""
    input:
        image=IMAGE_INPUT,
        plan=f"{RESULTS}/plan.json",
        calibration=CALIBRATION_INPUT,
        timing=expand(f"{RESULTS}/{{run}}/timing/r{{repeat}}.json", run=RUNS, repeat=REPEATS),
        times=expand(f"{RESULTS}/{{run}}/times.json", run=PROFILED),
        metrics=expand(f"{RESULTS}/{{run}}/stats/metrics.json", run=PROFILED),
        ops=expand(f"{RESULTS}/{{run}}/stats/ops_metrics.json", run=OP_CAPTURED),
        # the memory view's peak and categories (memory_* columns)
        memory=expand(f"{RESULTS}/{{run}}/stats/memory_metrics.json", run=MEMORY_CAPTURED),
        # `batch: max` runs' searches (batch_from, max_batch_* columns)
        max_batch=expand(f"{RESULTS}/{{run}}/maxbatch.json", run=MAX_BATCH),
    output:
        report(
            f"{RESULTS}/summary.csv",
            caption="../report/summary.rst",
            category="Summary",
        ),
    log:
        f"{LOGS}/aggregate.log",
    params:
        python=PYTHON,
        results=results_folder,
        calibration=lambda wc, input: f"--calibration {input.calibration}"
        if input.calibration
        else "",
    container:
        RULE_CONTAINER
    shell:
        "{params.python} -m analysis aggregate --results {params.results} --plan {input.plan}"
        " {params.calibration} -o {output} > {log} 2>&1"


rule ladders:
    """Per ladder (e.g. per model size): each rung's step time with CI, gain over the rung
    before and over the first, MFU and peak memory."""
    input:
        image=IMAGE_INPUT,
        plan=f"{RESULTS}/plan.json",
        summary=f"{RESULTS}/summary.csv",
    output:
        [
            report(
                f"{RESULTS}/ladders/{table}.csv",
                caption="../report/ladder.rst",
                category="Ladders",
            )
            for table in LADDER_TABLES
        ],
    log:
        f"{LOGS}/ladders.log",
    params:
        python=PYTHON,
        results=results_folder,
        outdir=lambda wc, output: os.path.dirname(output[0]),
    container:
        RULE_CONTAINER
    shell:
        "{params.python} -m analysis ladders --results {params.results} --plan {input.plan}"
        " --summary {input.summary} -o {params.outdir} > {log} 2>&1"


rule speedup:
    """Baseline vs candidate untraced step time: the speed-up with its 95% CI and whether
    the difference is significant."""
    input:
        image=IMAGE_INPUT,
        a=lambda wc: expand(
            f"{RESULTS}/{COMPARISONS[wc.name]['a']}/timing/r{{repeat}}.json", repeat=REPEATS
        ),
        b=lambda wc: expand(
            f"{RESULTS}/{COMPARISONS[wc.name]['b']}/timing/r{{repeat}}.json", repeat=REPEATS
        ),
    output:
        report(
            f"{RESULTS}/compare/{{name}}/speedup.csv",
            caption="../report/speedup.rst",
            category="Comparisons",
            subcategory="{name}",
        ),
    log:
        f"{LOGS}/speedup/{{name}}.log",
    params:
        python=PYTHON,
        a=lambda wc: f"{RESULTS}/{COMPARISONS[wc.name]['a']}",
        b=lambda wc: f"{RESULTS}/{COMPARISONS[wc.name]['b']}",
    container:
        RULE_CONTAINER
    shell:
        "{params.python} -m analysis speedup {params.a} {params.b} -o {output} > {log} 2>&1"


rule compare:
    """Baseline vs candidate: time per kernel category and NVTX range, and their ratio.
    From both runs' statistics, not their captures: re-capturing one side (or resuming
    without captures) redoes the comparison without capturing the other side again."""
    input:
        image=IMAGE_INPUT,
        a=lambda wc: f"{RESULTS}/{COMPARISONS[wc.name]['a']}/stats/metrics.json",
        b=lambda wc: f"{RESULTS}/{COMPARISONS[wc.name]['b']}/stats/metrics.json",
        ta=lambda wc: f"{RESULTS}/{COMPARISONS[wc.name]['a']}/times.json",
        tb=lambda wc: f"{RESULTS}/{COMPARISONS[wc.name]['b']}/times.json",
    output:
        categories=report(
            f"{RESULTS}/compare/{{name}}/compare_categories.csv",
            caption="../report/compare.rst",
            category="Comparisons",
            subcategory="{name}",
        ),
        nvtx=report(
            f"{RESULTS}/compare/{{name}}/compare_nvtx.csv",
            caption="../report/compare.rst",
            category="Comparisons",
            subcategory="{name}",
        ),
        metrics=report(
            f"{RESULTS}/compare/{{name}}/compare_metrics.csv",
            caption="../report/compare.rst",
            category="Comparisons",
            subcategory="{name}",
        ),
    log:
        f"{LOGS}/compare/{{name}}.log",
    params:
        python=PYTHON,
        outdir=lambda wc, output: os.path.dirname(output.categories),
        a=lambda wc, input: os.path.dirname(input.a),
        b=lambda wc, input: os.path.dirname(input.b),
        reports=" ".join(["compare_categories", "compare_nvtx", "compare_metrics"]),
    container:
        RULE_CONTAINER
    shell:
        # A side that failed has no statistics: the comparison is left empty, with the reason.
        "if {params.python} -m pipeline.outcome ok {input.ta} &&"
        " {params.python} -m pipeline.outcome ok {input.tb}; then"
        " {params.python} -m analysis compare {params.a} {params.b} -o {params.outdir}"
        " > {log} 2>&1;"
        " else for r in {params.reports}; do : > {params.outdir}/$r.csv; done;"
        " echo 'one side failed: see its times.json' > {log}; fi"


# Per captured run, made by run_stats from the same captures: a Perfetto trace of its measured
# steps and the timeline figure of one step (python -m analysis trace; docs/analysis.md,
# "Timeline and trace").
TRACE_FILES = ["trace.perfetto-trace.gz", "timeline.png"]
TRACE_OUTPUTS = expand(f"{RESULTS}/{{run}}/trace/{{name}}", run=PROFILED, name=TRACE_FILES)


# Per run with a memory capture (rules/profile.smk: profile_memory): its memory view.
MEMORY_STATS = ["memory_metrics.json", "memory_ops.csv", "memory_modules.csv",
                "memory_phases.csv"]


rule memory_stats:
    """Where a run's memory goes: peak allocated and reserved, the bytes by category at the
    peak, per ATen op and per module, per phase, and the memory figure beside the timeline
    (python -m analysis memory; docs/analysis.md "Where the memory goes")."""
    input:
        image=IMAGE_INPUT,
        memory=f"{RESULTS}/{{run}}/memory.json",
        times=f"{RESULTS}/{{run}}/memory_times.json",
    output:
        metrics=f"{RESULTS}/{{run}}/stats/memory_metrics.json",
        ops=report(
            f"{RESULTS}/{{run}}/stats/memory_ops.csv",
            caption="../report/run_memory.rst",
            category="4. Runs",
            subcategory="{run}",
        ),
        modules=f"{RESULTS}/{{run}}/stats/memory_modules.csv",
        phases=f"{RESULTS}/{{run}}/stats/memory_phases.csv",
        figure=report(
            f"{RESULTS}/{{run}}/trace/memory.png",
            caption="../report/run_memory.rst",
            category="4. Runs",
            subcategory="{run}",
        ),
    log:
        f"{LOGS}/memory_stats/{{run}}.log",
    params:
        python=PYTHON,
        outdir=lambda wc, output: os.path.dirname(output.metrics),
    container:
        RULE_CONTAINER
    shell:
        "{params.python} -m analysis memory {input.memory} -o {params.outdir}"
        " --figure {output.figure} --name {wildcards.run} > {log} 2>&1"
