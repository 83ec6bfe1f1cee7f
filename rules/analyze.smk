# Stage 2: statistics per run (the nsys reports and what nsys lacks), then across runs.


rule run_stats:
    """The 7 nsys stats reports (same values as `nsys stats`) plus extras, for one run."""
    input:
        image=IMAGE_INPUT,
        sqlite=f"{RESULTS}/{{run}}/profile.sqlite",
    output:
        csvs=[f"{RESULTS}/{{run}}/stats/{report}.csv" for report in NSYS_REPORTS],
        metrics=f"{RESULTS}/{{run}}/stats/metrics.json",
    log:
        f"{LOGS}/run_stats/{{run}}.log",
    params:
        python=PYTHON,
        outdir=lambda wc, output: os.path.dirname(output.metrics),
    container:
        RULE_CONTAINER
    shell:
        "{params.python} -m analysis all {input.sqlite} -o {params.outdir} > {log} 2>&1"


rule aggregate:
    """One row per run: parameters, step times, provenance and the per-run GPU metrics."""
    input:
        image=IMAGE_INPUT,
        times=expand(f"{RESULTS}/{{run}}/times.json", run=RUNS),
        metrics=expand(f"{RESULTS}/{{run}}/stats/metrics.json", run=RUNS),
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
        runs=list(RUNS),
        results=lambda wc, input: os.path.dirname(os.path.dirname(input.times[0])),
    container:
        RULE_CONTAINER
    shell:
        "{params.python} -m analysis aggregate --results {params.results}"
        " --runs {params.runs} -o {output} > {log} 2>&1"


rule compare:
    """Baseline vs candidate: time per kernel category and NVTX range, and their ratio."""
    input:
        image=IMAGE_INPUT,
        a=lambda wc: f"{RESULTS}/{COMPARISONS[wc.name]['a']}/profile.sqlite",
        b=lambda wc: f"{RESULTS}/{COMPARISONS[wc.name]['b']}/profile.sqlite",
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
    container:
        RULE_CONTAINER
    shell:
        "{params.python} -m analysis compare {input.a} {input.b} -o {params.outdir} > {log} 2>&1"
