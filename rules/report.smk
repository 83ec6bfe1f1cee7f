# Stage 3: figures, findings and the overview for the report (the HTML report itself is
# `snakemake --report report.html`; its first result is the overview).

# Figures (analysis/outputs/figures.py): one file each, drawn from the summary and the
# per-run statistics with one shared vocabulary (analysis/outputs/style.py).
BASELINE = config.get("baseline") or ""
DIFF_OUTPUTS = (
    [f"{RESULTS}/diff/{name}" for name in ("summary.md", "runs.csv", "ratios.png")]
    if BASELINE
    else []
)
FIGURE_STATS = ["phase_gpu_time", "kernel_categories", "cuda_gpu_kern_sum", "idle_time",
                "kernel_durations"]
PLOTS = [
    "ladder_waterfall",
    "attention_sweep",
    "phase_gpu_time",
    "kernel_categories",
    "step_time",
    "top_kernels",
    "idle_time",
    "kernel_durations",
    "gpu_utilization",
]


rule plots:
    """PNG figures across runs, from the summary, the ladder tables and per-run statistics."""
    input:
        image=IMAGE_INPUT,
        summary=f"{RESULTS}/summary.csv",
        plan=f"{RESULTS}/plan.json",
        metrics=expand(f"{RESULTS}/{{run}}/stats/metrics.json", run=PROFILED),
        # the per-run tables the figures read
        stats=expand(f"{RESULTS}/{{run}}/stats/{{name}}.csv", run=PROFILED, name=FIGURE_STATS),
        ladders=expand(f"{RESULTS}/ladders/{{table}}.csv", table=LADDER_TABLES),
    output:
        [
            report(
                f"{RESULTS}/plots/{name}.png",
                caption=f"../report/plot_{name}.rst",
                category="2. Figures",
            )
            for name in PLOTS
        ],
    log:
        f"{LOGS}/plots.log",
    # the figures are drawn side by side (the last job before the report: nothing waits on
    # its cores)
    threads: len(PLOTS)
    params:
        python=PYTHON,
        results=results_folder,
        outdir=lambda wc, output: os.path.dirname(output[0]),
    container:
        RULE_CONTAINER
    shell:
        "{params.python} -m analysis plots --summary {input.summary} --results {params.results}"
        " -o {params.outdir} --jobs {threads} > {log} 2>&1"


rule findings:
    """Rules over the statistics: what to change, the evidence, and the fix's measured gain."""
    input:
        image=IMAGE_INPUT,
        summary=f"{RESULTS}/summary.csv",
        plan=f"{RESULTS}/plan.json",
        metrics=expand(f"{RESULTS}/{{run}}/stats/metrics.json", run=PROFILED),
        # distributed runs: the cross-run table the communication rules read
        distributed=DISTRIBUTED_OUTPUTS[:1],
    output:
        report(
            f"{RESULTS}/findings.csv",
            caption="../report/findings.rst",
            category="1. Overview",
        ),
    log:
        f"{LOGS}/findings.log",
    params:
        python=PYTHON,
        results=results_folder,
    container:
        RULE_CONTAINER
    shell:
        "{params.python} -m analysis findings --results {params.results} -o {output} > {log} 2>&1"


rule overview:
    """The answer first: provenance, headline table, top findings, key figures."""
    input:
        image=IMAGE_INPUT,
        summary=f"{RESULTS}/summary.csv",
        findings=f"{RESULTS}/findings.csv",
        plots=expand(f"{RESULTS}/plots/{{name}}.png", name=PLOTS),
        distributed_plots=DISTRIBUTED_PLOT_FILES,
        ladders=expand(f"{RESULTS}/ladders/{{table}}.csv", table=LADDER_TABLES),
        baseline=DIFF_OUTPUTS,
    output:
        md=f"{RESULTS}/SUMMARY.md",
        # the Snakemake report's first page (the Snakefile's `report:`, rules/common.smk)
        landing=f"{RESULTS}/{LANDING_PAGE}",
        html=report(
            f"{RESULTS}/overview.html",
            caption="../report/overview.rst",
            category="1. Overview",
        ),
    log:
        f"{LOGS}/overview.log",
    params:
        python=PYTHON,
        results=results_folder,
    container:
        RULE_CONTAINER
    shell:
        "{params.python} -m analysis overview --results {params.results} -o {output.md}"
        " --html {output.html} --rst {output.landing} > {log} 2>&1"


# `baseline: FOLDER` in the config: the report includes this results folder diffed against it
# (python -m analysis diff; docs/diff.md).
if BASELINE:

    rule diff_baseline:
        """Run by run, old (the baseline folder) vs new: untraced speed-up with its CI, the
        kernels and NVTX ranges that account for each change, provenance differences first."""
        input:
            image=IMAGE_INPUT,
            summary=f"{RESULTS}/summary.csv",
        output:
            md=report(f"{RESULTS}/diff/summary.md", caption="../report/diff.rst",
                      category="3. Against the baseline"),
            runs=report(f"{RESULTS}/diff/runs.csv", caption="../report/diff.rst",
                        category="3. Against the baseline"),
            ratios=report(f"{RESULTS}/diff/ratios.png", caption="../report/diff.rst",
                          category="3. Against the baseline"),
        log:
            f"{LOGS}/diff_baseline.log",
        params:
            python=PYTHON,
            baseline=BASELINE,
            results=results_folder,
            outdir=lambda wc, output: os.path.dirname(output.md),
        container:
            RULE_CONTAINER
        shell:
            "{params.python} -m analysis diff {params.baseline} {params.results}"
            " -o {params.outdir} > {log} 2>&1"
