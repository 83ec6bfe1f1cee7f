# Distributed runs (run keys `parallel: ddp | fsdp`, `gpus: N`; docs/distributed.md): N ranks
# under torchrun, launched by pipeline/launch.py (an `unsupported` row where the machine has
# fewer than N GPUs, or CPU cores for gloo). Kept apart from rules/profile.smk: the timing and
# capture rules below are the same as time_run and profile with the launcher in front, one rule
# per rank count N (their per-rank outputs are declared, and N must be known per rule), and they
# take precedence over time_run / profile for the runs they match (ruleorder).
#
# Outputs of a distributed run <run> with N ranks, besides every run's:
#   <run>/profile.rank<r>.sqlite|.nsys-rep  one nsys capture per rank (rank 0's is also
#                                           <run>/profile.sqlite, a hard link: every existing
#                                           per-run output reads rank 0)
#   <run>/stats/rank<r>/                    the 7 reports and the extras of each rank's export
#   <run>/distributed/                      the cross-rank analysis (analysis/metrics/ranks.py)
# and, per results folder: calibration_allreduce_<N>ranks.json (all-reduce sweep),
# distributed.csv (scaling, exposed communication, overlap, stragglers, bandwidth) and the
# figures plots/rank_timeline.png, plots/comm_bandwidth.png, plots/scaling.png.
DISTRIBUTED = PLAN.distributed  # run -> ranks
PROFILED_DISTRIBUTED = {run: n for run, n in DISTRIBUTED.items() if run in PROFILED}
RANK_COUNTS = sorted(set(DISTRIBUTED.values()))
# Operator ranges in CPU captures (the compute side of the CPU timeline, workloads/parallel.py).
OP_RANGES_ENV = "PROFBENCH_OP_RANGES=1"
COMM_CALIBRATIONS = (
    [f"{RESULTS}/calibration_allreduce_{n}ranks.json"
     for n in sorted(set(PROFILED_DISTRIBUTED.values())) if n > 1]
    if config["calibrate"]
    else []
)
DISTRIBUTED_TABLES = ["rank_steps", "ranks", "steps", "collectives"]
DISTRIBUTED_PLOTS = ["rank_timeline", "comm_bandwidth", "scaling"]
# the overview shows them among its key figures (analysis/outputs/overview.py)
DISTRIBUTED_PLOT_FILES = (
    expand(f"{RESULTS}/plots/{{name}}.png", name=DISTRIBUTED_PLOTS) if DISTRIBUTED else []
)
DISTRIBUTED_OUTPUTS = (
    [
        f"{RESULTS}/distributed.csv",
        *DISTRIBUTED_PLOT_FILES,
        *expand(f"{RESULTS}/{{run}}/distributed/metrics.json", run=PROFILED_DISTRIBUTED),
    ]
    if DISTRIBUTED
    else []
)
# start-up checks (rules/common.smk) count these runs' jobs too
CAPTURE_RULES.update(f"profile_{n}ranks" for n in RANK_COUNTS)
TIMING_RULES.update(f"time_run_{n}ranks" for n in RANK_COUNTS)


for _n in RANK_COUNTS:

    rule:
        name:
            f"time_run_{_n}ranks"
        input:
            image=IMAGE_INPUT,
        output:
            f"{RESULTS}/{{run}}/timing/r{{repeat}}.json",
        log:
            f"{LOGS}/time_run/{{run}}.r{{repeat}}.log",
        benchmark:
            f"{LOGS}/benchmark/time_run/{{run}}.r{{repeat}}.jsonl"
        wildcard_constraints:
            run=PLAN.runs_with_ranks(_n),
        params:
            workload=lambda wc: workload_args(wc.run),
            # pipeline/launch.py in front: the run's ranks, on its device
            launch=lambda wc, output: f"{PYTHON} -m pipeline.launch {PLAN.launch_args(wc.run)}"
            f" --out {output[0]}",
            guard=guard_command,
            python=PYTHON,
        threads: timing_threads()
        resources:
            gpu=_n,  # a whole GPU per rank (rules/common.smk)
            nodes=1,
            mem_mb=gpu_job_mem_mb,
            runtime=gpu_job_runtime,
        container:
            RULE_CONTAINER
        shell:
            # as time_run: every core, the ranks one CPU thread each
            "{params.guard} --run {wildcards.run} --out {output} -- {params.launch} --"
            " {params.python} -m workloads {params.workload} --out {output} > {log} 2>&1"

    rule:
        name:
            f"profile_{_n}ranks"
        input:
            image=IMAGE_INPUT,
            nsys=NSYS_INPUT,
        output:
            # captures are temp() as profile's (rules/common.smk: capture_output)
            sqlite=capture_output(f"{RESULTS}/{{run}}/profile.sqlite"),
            rep=capture_output(f"{RESULTS}/{{run}}/profile.nsys-rep"),
            times=f"{RESULTS}/{{run}}/times.json",
            ranks=[
                capture_output(f"{RESULTS}/{{run}}/profile.rank{rank}.sqlite")
                for rank in range(_n)
            ],
            rank_reps=[
                capture_output(f"{RESULTS}/{{run}}/profile.rank{rank}.nsys-rep")
                for rank in range(_n)
            ],
            # as profile's: a compiled run's TORCH_TRACE (every rank's log), empty otherwise
            trace=capture_output(directory(f"{RESULTS}/{{run}}/torch_trace")),
        log:
            f"{LOGS}/profile/{{run}}.log",
        benchmark:
            f"{LOGS}/benchmark/profile/{{run}}.jsonl"
        wildcard_constraints:
            run=PLAN.runs_with_ranks(_n),
        params:
            workload=lambda wc: workload_args(wc.run),
            launch=lambda wc, output: f"{PYTHON} -m pipeline.launch {PLAN.launch_args(wc.run)}"
            f" --out {output.times}",
            guard=guard_command,
            nsys=NSYS,
            python=PYTHON,
            op_ranges=OP_RANGES_ENV,
            trace=config["nsys"]["trace"],
            capture=CAPTURE_ARGS[config["nsys"]["capture"]],
            extra=config["nsys"]["extra_args"],
            stats="true" if config["nsys"]["console_stats"] else "false",
            prefix=lambda wc, output: output.sqlite.removesuffix(".sqlite"),
            torch_trace=torch_trace_env,
        resources:
            gpu=_n,  # a whole GPU per rank (rules/common.smk)
            nodes=1,
            mem_mb=gpu_job_mem_mb,
            runtime=gpu_job_runtime,
        container:
            RULE_CONTAINER
        shell:
            # As rule profile, one nsys session per rank: torchrun starts `nsys profile` as
            # each rank, which names its capture after the RANK torchrun gave it (%q{{RANK}}).
            # Rank 0's capture is also the run's own (a hard link), for every per-run output.
            "mkdir -p {output.trace};"
            " {params.guard} --run {wildcards.run} --out {output.times}"
            " --expect {output.ranks} {output.rank_reps} -- {params.launch} --"
            " env NSYS_NVTX_PROFILER_REGISTER_ONLY=0 {params.op_ranges} {params.torch_trace}"
            " {params.nsys} profile"
            " --trace={params.trace} --sample=none --cpuctxsw=none --cuda-graph-trace=node"
            " {params.capture}"
            " --stats={params.stats} --export=sqlite --force-overwrite=true {params.extra}"
            " -o {params.prefix}.rank%q{{RANK}}"
            " {params.python} -m workloads {params.workload} --out {output.times}"
            " > {log} 2>&1;"
            " for ext in sqlite nsys-rep; do"
            " if [ -e {params.prefix}.rank0.$ext ]; then"
            " ln -f {params.prefix}.rank0.$ext {params.prefix}.$ext; fi; done;"
            " {params.python} -m pipeline.outcome placeholders {output.times}"
            " {output.sqlite} {output.rep} {output.ranks} {output.rank_reps} >> {log} 2>&1"

    workflow.ruleorder(f"time_run_{_n}ranks", "time_run")
    workflow.ruleorder(f"profile_{_n}ranks", "profile")


rule rank_stats:
    """The 7 nsys reports and the extras of one rank's capture (as run_stats for a run)."""
    input:
        image=IMAGE_INPUT,
        sqlite=f"{RESULTS}/{{run}}/profile.rank{{rank}}.sqlite",
        times=f"{RESULTS}/{{run}}/times.json",
    output:
        csvs=expand(f"{RESULTS}/{{{{run}}}}/stats/rank{{{{rank}}}}/{{name}}.csv", name=STATS_CSVS),
        metrics=f"{RESULTS}/{{run}}/stats/rank{{rank}}/metrics.json",
    log:
        f"{LOGS}/rank_stats/{{run}}.rank{{rank}}.log",
    wildcard_constraints:
        rank=r"\d+",
    params:
        python=PYTHON,
        outdir=lambda wc, output: os.path.dirname(output.metrics),
        reports=" ".join(STATS_CSVS),
    container:
        RULE_CONTAINER
    shell:
        "if {params.python} -m pipeline.outcome ok {input.times}; then"
        " {params.python} -m analysis all {input.sqlite} -o {params.outdir}"
        " --record {input.times} > {log} 2>&1;"
        " else {params.python} -m pipeline.outcome failed-stats {input.times} {params.outdir}"
        " {params.reports} > {log} 2>&1; fi"


rule rank_analysis:
    """Per rank and step: compute, communication, exposed communication, overlap, idle;
    stragglers across ranks; achieved bandwidth per collective and message size."""
    input:
        image=IMAGE_INPUT,
        times=f"{RESULTS}/{{run}}/times.json",
        ranks=lambda wc: expand(
            f"{RESULTS}/{wc.run}/profile.rank{{rank}}.sqlite", rank=range(DISTRIBUTED[wc.run])
        ),
        stats=lambda wc: expand(
            f"{RESULTS}/{wc.run}/stats/rank{{rank}}/metrics.json",
            rank=range(DISTRIBUTED[wc.run]),
        ),
    output:
        tables=expand(
            f"{RESULTS}/{{{{run}}}}/distributed/{{name}}.csv", name=DISTRIBUTED_TABLES
        ),
        metrics=f"{RESULTS}/{{run}}/distributed/metrics.json",
    log:
        f"{LOGS}/rank_analysis/{{run}}.log",
    params:
        python=PYTHON,
        outdir=lambda wc, output: os.path.dirname(output.metrics),
    container:
        RULE_CONTAINER
    shell:
        "{params.python} -m analysis ranks {input.ranks} --times {input.times}"
        " -o {params.outdir} > {log} 2>&1"


rule calibrate_allreduce:
    """This machine's all-reduce bus bandwidth per message size, on N ranks (nccl-tests'
    definitions; gloo on a CPU)."""
    input:
        image=IMAGE_INPUT,
    output:
        f"{RESULTS}/calibration_allreduce_{{ranks}}ranks.json",
    log:
        f"{LOGS}/calibrate_allreduce_{{ranks}}ranks.log",
    wildcard_constraints:
        ranks=r"\d+",
    params:
        guard=guard_command,
        python=PYTHON,
        device=lambda wc: next(
            (RUNS[r].get("device", "auto") for r, n in DISTRIBUTED.items() if n == int(wc.ranks)),
            "auto",
        ),
    threads: timing_threads()
    resources:
        gpu=lambda wc: int(wc.ranks),  # a whole GPU per rank
        nodes=1,
        mem_mb=gpu_job_mem_mb,
        runtime=gpu_job_runtime,
    container:
        RULE_CONTAINER
    shell:
        "{params.guard} --out {output} -- {params.python} -m pipeline.launch"
        " --ranks {wildcards.ranks} --device {params.device} --out {output} --"
        " {params.python} -m workloads.commbench --device {params.device} --out {output}"
        " > {log} 2>&1"


rule distributed_summary:
    """Across runs: scaling efficiency against the one-GPU run of the same per-GPU batch,
    exposed communication, overlap, straggler spread, all-reduce bus bandwidth against the
    calibrated peak; the per-rank timeline and bandwidth figures."""
    input:
        image=IMAGE_INPUT,
        summary=f"{RESULTS}/summary.csv",
        plan=f"{RESULTS}/plan.json",
        calibrations=COMM_CALIBRATIONS,
        analyses=expand(f"{RESULTS}/{{run}}/distributed/metrics.json", run=PROFILED_DISTRIBUTED),
    output:
        table=report(
            f"{RESULTS}/distributed.csv",
            caption="../report/distributed.rst",
            category="5. Distributed",
        ),
        plots=[
            report(
                f"{RESULTS}/plots/{name}.png",
                caption=f"../report/plot_{name}.rst",
                category="5. Distributed",
            )
            for name in DISTRIBUTED_PLOTS
        ],
    log:
        f"{LOGS}/distributed_summary.log",
    params:
        python=PYTHON,
        results=results_folder,
        plots=lambda wc, output: os.path.dirname(output.plots[0]),
    container:
        RULE_CONTAINER
    shell:
        "{params.python} -m analysis distributed --results {params.results}"
        " --summary {input.summary} -o {output.table} --plots {params.plots} > {log} 2>&1"
