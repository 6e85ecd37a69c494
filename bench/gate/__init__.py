"""The CI gate: exact counts, self-checks, timings against the baseline revision's A/B."""
