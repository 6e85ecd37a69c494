"""Column sets of the result files. The human table, CSV and JSON are built from these rows."""

# Version of the result files' columns, recorded in env.json as "schema_version". Bump it
# when a column changes meaning or units; `bench compare` refuses runs of different versions.
# Runs whose env.json has no schema_version are version 2.
SCHEMA_VERSION = 3

# Configuration echoed in every result row.
CONFIG_COLUMNS = [
    "preset", "protocol", "policy", "tp", "pp", "world_size", "device", "backend",
    "storage", "rate_rps", "seed", "page_size", "extra_pool", "race_guard",
]

REQUEST_COLUMNS = CONFIG_COLUMNS + [
    "repeat", "rid", "arrival_s", "ttft_ms", "queue_ms", "prefetch_io_ms", "sched_lag_ms",
    "sync_ms", "load_back_ms", "prefill_ms", "polls", "decision_collectives",
    "completion_collectives", "hit_query_collectives", "ack_collectives", "pp_hops",
    "terminated_by", "op_issued", "io_issued", "prefetch_requested_tokens", "hit_tokens",
    "prefetched_tokens", "ranks_agree", "data_ok",
]

STEP_COLUMNS = CONFIG_COLUMNS + [
    "repeat", "step", "t_s", "waiting", "polled", "scheduled", "request_broadcast",
    "per_step_min", "model_allreduce", "decision", "completion", "pp_hop", "sync_ms",
]

# Per-rank counts: every rank's collectives by call site, per configuration and repeat.
RANK_COLUMNS = CONFIG_COLUMNS + [
    "repeat", "rank", "tp_rank", "pp_rank", "decision", "completion", "pp_hop", "hit_query",
    "ack", "request_broadcast", "per_step_min", "model_allreduce", "consensus",
    "crosscheck_ok",
]

SUMMARY_COLUMNS = [
    "protocol", "policy", "tp", "pp", "world_size", "device", "backend", "storage",
    "rate_rps", "extra_pool", "race_guard", "requests", "repeats", "polls_per_req",
    "decision_collectives_per_req", "decision_collectives_per_poll",
    "expected_decision_collectives_per_req", "critical_collectives_per_req",
    "background_collectives_per_req", "expected_background_collectives_per_req",
    "step_collectives_per_step", "step_collectives_per_req", "sync_ms_per_step",
    "sched_lag_p50_ms", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "ttft_mean_ms",
    "ttft_p50_ratio_vs_pr27010", "ttft_p50_ratio_ci_low", "ttft_p50_ratio_ci_high",
    "ttft_p50_ratio_per_repeat", "ranks_agree", "data_errors", "percentile_method",
]
