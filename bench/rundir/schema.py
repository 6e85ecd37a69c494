"""Column sets of the result files. The human table, CSV and JSON are built from these rows."""

# Version of the result files' columns, recorded in env.json as "schema_version". Bump it
# when a column changes meaning or units; `bench compare` refuses runs of different versions.
# Runs whose env.json has no schema_version are version 2.
SCHEMA_VERSION = 3

REFERENCE_PROTOCOL = "pr27010"  # "before": every ratio is taken against it
# One summary row per configuration group: a protocol x policy cell of one layout, storage,
# rate and extra-pool setting, pooled over repeats.
GROUP_KEYS = ["protocol", "policy", "tp", "pp", "storage", "rate_rps", "extra_pool", "race_guard"]
# Per-request collective counts by call site (rank 0), compared exactly.
COUNT_COLUMNS = ["polls", "decision_collectives", "completion_collectives", "pp_hops",
                 "hit_query_collectives", "ack_collectives"]
STEP_SITES = ["request_broadcast", "per_step_min", "model_allreduce"]  # per-step collectives

# Configuration echoed in every result row. host_memory is one value per run (a plan
# field), so it is not a group key; runs before it are "cache".
CONFIG_COLUMNS = [
    "preset", "protocol", "policy", "tp", "pp", "world_size", "device", "backend", "model",
    "forward", "storage", "rate_rps", "seed", "page_size", "extra_pool", "race_guard",
    "host_memory", "workload", "time_scale", "write_policy", "schedule", "collective_delay_ms",
]

# Where each request's prompt tokens came from, at scheduling (they sum to prompt_tokens),
# and the trace's own bound on the reused ones (trace workloads only; bench.run.trace).
TOKEN_COLUMNS = ["prompt_tokens", "device_hit_tokens", "host_hit_tokens", "storage_hit_tokens",
                 "computed_tokens", "reuse_bound_tokens"]
# Per-tier hit ratios in summary.csv: each source's share of all prompt tokens.
TIER_COLUMNS = ["device_hit_ratio", "host_hit_ratio", "storage_hit_ratio", "computed_ratio",
                "reuse_bound_ratio"]
# The write path's pages per rank (hicache.cache.tiers), empty when the device tier is off.
WRITE_PATH_COLUMNS = ["host_copy_pages", "storage_write_pages", "device_evicted_pages",
                      "dropped_host_pages", "device_slots_unaccounted"]

# Columns added with trace replays: absent in older run directories, which stay readable.
OPTIONAL_COLUMNS = ["workload", "time_scale", "write_policy", *TOKEN_COLUMNS,
                    *WRITE_PATH_COLUMNS, "absent_polls", "schedule", "schedule_digest",
                    "vt_s", "pin_wait_ms", "forward_late_ms", "poll_ms", "twin_protocol",
                    "twin_poll_ms", "twin_first", "call_sites", "collective_delay_ms"]

REQUEST_COLUMNS = CONFIG_COLUMNS + [
    "repeat", "rid", "request_class", "arrival_s", "ttft_ms", "queue_ms", "prefetch_io_ms",
    "sched_lag_ms",
    "sync_ms", "load_back_ms", "load_back_bytes", "load_back_gbps", "prefill_ms", "polls",
    "absent_polls", "decision_collectives",
    "completion_collectives", "hit_query_collectives", "ack_collectives",
    "ticket_collectives", "pp_hops", "call_sites", "terminated_by", "op_issued",
    "prefetch_ops", "retries", "io_issued", "prefetch_requested_tokens", "hit_tokens",
    "prefetched_tokens", *TOKEN_COLUMNS,
    "output_tokens", "e2e_ms", "itl_mean_ms", "itl_p50_ms", "itl_p90_ms",
    "itl_p99_ms", "itl_ms", "ranks_agree", "disagreement", "data_ok", "schedule_digest",
]

STEP_COLUMNS = CONFIG_COLUMNS + [
    "repeat", "step", "t_s", "kind", "step_ms", "forward_ms", "waiting", "prefetching",
    "polled", "scheduled", "running", "prefill_tokens", "context_tokens", "request_broadcast",
    "per_step_min", "model_allreduce", "decision", "completion", "pp_hop", "sync_ms",
    "decision_sync_ms", "vt_s", "pin_wait_ms", "forward_late_ms", "schedule_digest",
    "poll_ms", "twin_protocol", "twin_poll_ms", "twin_first",
]

# Per-rank counts: every rank's collectives by call site, per configuration and repeat.
RANK_COLUMNS = CONFIG_COLUMNS + [
    "repeat", "rank", "tp_rank", "pp_rank", "decision", "completion", "pp_hop", "hit_query",
    "ack", "ticket", "request_broadcast", "per_step_min", "model_allreduce", "consensus",
    "crosscheck_ok", "host_slots_unaccounted", *WRITE_PATH_COLUMNS, "cpu_s", "wall_s",
    "attempts", "steal_s", "other_cpu_s", "cpu_lost", "threads",
    # bench.run.host_profile: the timed serve's steps, polls and scheduler-thread CPU seconds;
    # with --host-work the counted serve's mode, steps, polls, Python events (all, polls')
    # and whether it ran the timed serve's schedule (its last digest)
    "sched_steps", "sched_polls", "sched_cpu_s", "host_work", "host_steps", "host_polls",
    "host_events", "host_poll_events", "host_same_schedule",
]

# A serve is disturbed when the machine lost more than this of its cores x wall time to
# steal or to other processes while it ran (bench.run.machine; ranks.csv cpu_lost).
DISTURBED_LIMIT = 0.05

# A cell that failed: its configuration and the first line of its error (failures.csv).
FAILURE_COLUMNS = ["protocol", "policy", "repeat", "error"]

# What the rows cannot say: how ranks disagreed, which group's count differed from torch's.
DIVERGENCE_COLUMNS = ["protocol", "policy", "repeat", "kind", "what"]

# Serving-regime metrics reported as a ratio to pr27010 with a 95% between-repeat interval
# (analysis.serving_metrics, stats): the point, the interval, its half-width as a fraction
# (`_mdd`: the smallest difference the run can resolve), the paired repeats behind it and the
# per-repeat ratios.
RATIO_METRICS = ["step_mean", "itl_p50", "itl_p99", "prefetch_ttft_p50", "prefetch_ttft_p99",
                 "bystander_ttft_p50", "bystander_ttft_p99", "e2e_p50"]
QUIET_METRICS = ["step_mean", "itl_p50"]  # gated in every row (bench.gate.timing)
CLASS_TTFT_METRICS = ["prefetch_ttft_p50", "bystander_ttft_p50"]  # gated with the TTFT one
GATED_METRICS = QUIET_METRICS + CLASS_TTFT_METRICS
INTERVAL_SUFFIXES = ("", "_ci_low", "_ci_high", "_mdd", "_repeats")

SERVING_COLUMNS = [
    "prefetch_requests", "prefetch_ttft_p50_ms", "prefetch_ttft_p90_ms", "prefetch_ttft_p99_ms",
    "bystander_requests", "bystander_ttft_p50_ms", "bystander_ttft_p90_ms",
    "bystander_ttft_p99_ms", "itl_p50_ms", "itl_p90_ms", "itl_p99_ms", "itl_mean_ms",
    "step_mean_ms", "step_p50_ms", "step_p99_ms", "decode_step_p50_ms", "decode_step_p99_ms",
    "host_ms_per_step", "polls_per_step", "critical_collectives_per_step",
    "decision_sync_ms_per_step", "waiting_p50", "waiting_max", "prefetching_p50",
    "prefetching_max", "output_tok_per_s", "cores_busy",
] + [f"{m}_ratio{s}" for m in RATIO_METRICS for s in INTERVAL_SUFFIXES] + [
    f"{m}_ratio_per_repeat" for m in RATIO_METRICS]

OVERHEAD_COLUMNS = [
    "c_ms", "c_p50_ms", "c_insitu_ms", "predicted_extra_step_ms", "predicted_extra_step_low_ms",
    "predicted_extra_step_high_ms", "measured_extra_step_ms", "measured_extra_step_ci_low_ms",
    "measured_extra_step_ci_high_ms", "measured_extra_step_repeats", "predicted_itl_inflation",
    "measured_itl_inflation", "overhead_reference", "overhead_model_agrees", "overhead_model_note",
]

SUMMARY_COLUMNS = [
    "protocol", "policy", "tp", "pp", "world_size", "device", "backend", "model", "forward",
    "storage", "rate_rps", "extra_pool", "race_guard", "host_memory", "schedule",
    "schedule_digest", "requests", "rejected_requests", "repeats",
    "polls_per_req",
    "decision_collectives_per_req", "decision_collectives_per_poll",
    "expected_decision_collectives_per_req", "critical_collectives_per_req",
    "background_collectives_per_req", "expected_background_collectives_per_req",
    "step_collectives_per_step", "step_collectives_per_req", "sync_ms_per_step",
    "sched_lag_p50_ms", "prefetch_sched_lag_p50_ms", "prefetch_sched_lag_p95_ms",
    "prefetch_sched_lag_p99_ms", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "ttft_mean_ms",
    "ttft_p50_ratio_vs_pr27010", "ttft_p50_ratio_ci_low", "ttft_p50_ratio_ci_high",
    "ttft_p50_ratio_mdd", "ttft_p50_ratio_repeats", "ttft_p50_ratio_per_repeat",
    *TIER_COLUMNS, *SERVING_COLUMNS, *OVERHEAD_COLUMNS, "interval_note", "interval_method",
    "ranks_agree",
    "known_disagreements", "unexplained_disagreements",
    "data_errors", "percentile_method",
]
