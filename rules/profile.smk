# Stage 1: run each workload. The untraced timing twin (rule time_run, `repeats` processes)
# gives the published step time; the nsys capture (rule profile) explains where it goes.
# Both run under pipeline/guard.py: a crash, an OOM or a timeout becomes the run's result
# record (status + message) instead of stopping the workflow. Timing and calibration
# processes are forked by the invocation's warm parents (launcher: fork, pipeline/warm.py);
# a capture starts its own process under nsys.


# The workloads wrap their measured steps in the NVTX range `profiled_region` and, on CUDA, in
# cudaProfilerStart/Stop; the warm-up steps come before both.
CAPTURE_ARGS = {
    "nvtx": "--capture-range=nvtx --nvtx-capture=profiled_region --capture-range-end=stop",
    "cudaProfilerApi": "--capture-range=cudaProfilerApi --capture-range-end=stop",
    "none": "",
}
# Every GPU job starts its workload through the guard (rules/common.smk: guard_command).


localrules:
    plan,


rule plan:
    """What this invocation runs (parameters, ladders, comparisons, git commit), for the
    summary and the report; rewritten when any of it changes."""
    output:
        f"{RESULTS}/plan.json",
    log:
        f"{LOGS}/plan.log",
    params:
        plan=plan_record(),
    run:
        Path(output[0]).write_text(json.dumps(params.plan, indent=2, default=str) + "\n")


rule install_nsys:
    """Nsight Systems from Debian's archive into the user cache, when no nsys is available."""
    output:
        str(NSYS_INSTALLED_MARKER),
    log:
        f"{LOGS}/install_nsys.log",
    run:
        # Runs on the host (never in the image, which has its own nsys).
        shell(f"{REPO}/scripts/install-nsys.sh {PROFBENCH_CACHE} > {log} 2>&1")


rule calibrate:
    """This device's measured peaks (matmul TFLOP/s per dtype, copy GB/s), cached per GPU."""
    input:
        image=IMAGE_INPUT,
    output:
        f"{RESULTS}/calibration.json",
    log:
        f"{LOGS}/calibrate.log",
    benchmark:
        f"{LOGS}/benchmark/calibrate.jsonl"
    params:
        guard=guard_command,
        python=PYTHON,
    resources:
        gpu=1,  # one whole GPU (rules/common.smk)
        mem_mb=gpu_job_mem_mb,
        runtime=gpu_job_runtime,
    container:
        RULE_CONTAINER
    shell:
        "{params.guard} --fork --out {output} --"
        " {params.python} -m workloads calibrate --out {output} > {log} 2>&1"


# `batch: max`: the run's search (rules/common.smk, MAX_BATCH), one guarded job of one GPU
# before its other jobs.
rule max_batch:
    """A `batch: max` run's search for the largest batch that fits: every batch tried (status,
    peak, step time), the batch found and the first one up that ran out of memory."""
    input:
        image=IMAGE_INPUT,
    output:
        f"{RESULTS}/{{run}}/maxbatch.json",
    log:
        f"{LOGS}/max_batch/{{run}}.log",
    benchmark:
        f"{LOGS}/benchmark/max_batch/{{run}}.jsonl"
    params:
        search=lambda wc: PLAN.max_batch_args(wc.run),
        guard=guard_command,
        python=PYTHON,
        timeout_s=max_batch_timeout_s,
    resources:
        gpu=1,
        mem_mb=gpu_job_mem_mb,
        runtime=max_batch_job_runtime,
    container:
        RULE_CONTAINER
    shell:
        # The guard's limit is the whole search's (a later --timeout-s wins over the one
        # guard_command gives); each process has the run's own (maxbatch --timeout-s).
        # --device-lock: each process waits for the GPU's memory of the one before it.
        "{params.guard} --timeout-s {params.timeout_s} --run {wildcards.run} --out {output}"
        " --device-lock -- {params.python} -m workloads.maxbatch --out {output}"
        " {params.search} > {log} 2>&1"


rule time_run:
    """A run's untraced timing processes, one after another: same workload, warm-up and steps,
    no tracer. One job per run (not per process): Snakemake's job start and the gap between
    jobs are paid once per run (docs/timing.md)."""
    input:
        image=IMAGE_INPUT,
        max_batch=max_batch_input,
    output:
        expand(f"{RESULTS}/{{{{run}}}}/timing/r{{repeat}}.json", repeat=REPEATS),
    log:
        f"{LOGS}/time_run/{{run}}.log",
    benchmark:
        f"{LOGS}/benchmark/time_run/{{run}}.jsonl"
    params:
        workload=lambda wc: workload_args(wc.run),
        guard=guard_command,
        python=PYTHON,
        repeats=len(REPEATS),
        # each repeat's record: the guard puts the repeat's index in place of {repeat}
        out=lambda wc: f"{RESULTS}/{wc.run}/timing/r{{repeat}}.json",
    # its GPU's share of --cores (all of them with one GPU): nothing else runs beside a timing
    # job on its CPU share (timing_threads says why), nothing at all on its GPU
    threads: timing_threads()
    resources:
        gpu=1,
        mem_mb=gpu_job_mem_mb,
        runtime=timing_job_runtime,
    container:
        RULE_CONTAINER
    shell:
        # The cores keep other jobs away; the workload itself runs with one CPU thread, as in
        # its capture (Snakemake would set OMP_NUM_THREADS etc. to the job's threads). The
        # guard runs the repeats one after another, each its own process: with `launcher:
        # fork`, repeat i is forked by warm parent i (rules/common.smk), so the repeats of one
        # run come from different interpreters (each GPU has its own parents). A repeat that
        # ends oom, unsupported or timeout ends the run (the later ones are `skipped` records).
        "{params.guard} --run {wildcards.run} --repeats {params.repeats}"
        " --fork --out {params.out} --"
        " {params.python} -m workloads {params.workload} --out {params.out} > {log} 2>&1"


rule profile:
    """One run under nsys: warm-up outside the capture, measured steps inside it."""
    input:
        image=IMAGE_INPUT,
        nsys=NSYS_INPUT,
        max_batch=max_batch_input,
    output:
        # Captures are temp(): a results folder without them (dropped with keep_captures:
        # false, or left behind when the folder is copied elsewhere) resumes without redoing
        # them or the tables made from them (rules/common.smk: capture_output).
        sqlite=capture_output(f"{RESULTS}/{{run}}/profile.sqlite"),
        rep=capture_output(f"{RESULTS}/{{run}}/profile.nsys-rep"),
        times=f"{RESULTS}/{{run}}/times.json",
        # compiled runs: the TORCH_TRACE of the capture (empty otherwise); Snakemake removes
        # it before the job, so a rerun never keeps an older process's log. Part of the
        # capture: temp() like it (keep_captures)
        trace=capture_output(directory(f"{RESULTS}/{{run}}/torch_trace")),
    log:
        f"{LOGS}/profile/{{run}}.log",
    benchmark:
        f"{LOGS}/benchmark/profile/{{run}}.jsonl"
    params:
        workload=lambda wc: workload_args(wc.run),
        guard=guard_command,
        nsys=NSYS,
        python=PYTHON,
        trace=config["nsys"]["trace"],
        capture=CAPTURE_ARGS[config["nsys"]["capture"]],
        extra=config["nsys"]["extra_args"],
        stats="true" if config["nsys"]["console_stats"] else "false",
        prefix=lambda wc, output: output.sqlite.removesuffix(".sqlite"),
        torch_trace=torch_trace_env,
    resources:
        gpu=1,  # one whole GPU, as every one-GPU job: never beside another job's work
        mem_mb=gpu_job_mem_mb,
        runtime=gpu_job_runtime,
    container:
        RULE_CONTAINER
    shell:
        # The capture covers the measured steps only (see CAPTURE_ARGS). Kernels replayed
        # from CUDA graphs (compile: reduce-overhead) are recorded one by one (node trace:
        # nsys' default traces a graph as a whole and keeps none of its kernels).
        # Non-registered NVTX strings must count for the NVTX match. nsys.console_stats prints
        # nsys' own summary into the log, next to our CSVs (off by default: it costs a second
        # pass over big captures, and our reports match it value for value). A failed run
        # leaves empty capture files: its times.json status says why, and run_stats never
        # reads them. A compiled run's process writes its TORCH_TRACE (params.torch_trace).
        # PROFBENCH_CAPTURE=1: the workload is captured (a model workload adds module ranges).
        # --device-lock: its GPU's device lock, taken before the first CUDA call.
        "mkdir -p {output.trace};"
        " {params.guard} --run {wildcards.run} --out {output.times} --device-lock"
        " --expect {output.sqlite} {output.rep} --"
        " env NSYS_NVTX_PROFILER_REGISTER_ONLY=0 PROFBENCH_CAPTURE=1 {params.torch_trace}"
        " {params.nsys} profile"
        " --trace={params.trace} --sample=none --cpuctxsw=none --cuda-graph-trace=node"
        " {params.capture}"
        " --stats={params.stats} --export=sqlite --force-overwrite=true {params.extra}"
        " -o {params.prefix}"
        " {params.python} -m workloads {params.workload} --out {output.times}"
        " > {log} 2>&1;"
        " {params.python} -m pipeline.outcome placeholders {output.times}"
        " {output.sqlite} {output.rep} >> {log} 2>&1"


# The op capture (run key `ops: true | shapes`): the same guarded nsys capture of the same
# run, with PyTorch's op ranges around the measured steps (--op_ranges on|shapes) for the
# run's operator table (rule op_stats). The ranges slow the step (+21% on the H100 eager GPT
# small, +80% with shapes), so the lean capture above stays the run's capture and this one
# is opt-in. nsys' console stats stay off here (they would summarize every op range).
use rule profile as profile_ops with:
    output:
        sqlite=capture_output(f"{RESULTS}/{{run}}/ops.sqlite"),
        rep=capture_output(f"{RESULTS}/{{run}}/ops.nsys-rep"),
        times=f"{RESULTS}/{{run}}/ops_times.json",
        trace=capture_output(directory(f"{RESULTS}/{{run}}/ops_torch_trace")),
    log:
        f"{LOGS}/profile_ops/{{run}}.log",
    benchmark:
        f"{LOGS}/benchmark/profile_ops/{{run}}.jsonl"
    params:
        workload=lambda wc: op_capture_args(wc.run),
        stats="false",


# The memory capture (run key `memory: auto | true | false`; auto: every captured
# single-process GPU run, pipeline/config.py): its own process, neither timed nor under
# nsys, so the timing and the capture above stay as they are. After the run's warm-up and
# measured steps it runs three more, under the allocator's history, MemTracker and the
# profiler's memory events (workloads/memory_capture.py); rule memory_stats makes its tables.
MEMORY_CAPTURED = PLAN.memory_captured


rule profile_memory:
    """One run's memory capture: memory.json (and its record, memory_times.json)."""
    input:
        image=IMAGE_INPUT,
        max_batch=max_batch_input,
    output:
        memory=f"{RESULTS}/{{run}}/memory.json",
        times=f"{RESULTS}/{{run}}/memory_times.json",
    log:
        f"{LOGS}/profile_memory/{{run}}.log",
    benchmark:
        f"{LOGS}/benchmark/profile_memory/{{run}}.jsonl"
    params:
        # the run's command line with one measured step: its warm-up (compilation) as the
        # run's, the capture's steps after it (their times are no result)
        workload=lambda wc: f"{workload_args(wc.run)} --steps 1",
        guard=guard_command,
        python=PYTHON,
    resources:
        gpu=1,
        mem_mb=gpu_job_mem_mb,
        runtime=gpu_job_runtime,
    container:
        RULE_CONTAINER
    shell:
        # A failed run leaves an empty memory.json: its memory_times.json says why.
        "{params.guard} --run {wildcards.run} --out {output.times} --device-lock"
        " --expect {output.memory} --"
        " {params.python} -m workloads {params.workload} --out {output.times}"
        " --memory_out {output.memory} > {log} 2>&1;"
        " {params.python} -m pipeline.outcome placeholders {output.times}"
        " {output.memory} >> {log} 2>&1"
