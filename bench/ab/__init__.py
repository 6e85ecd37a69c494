"""The A/B engine: two revisions served as sides (served, with blocks where a revision cannot
be one), several SGLangs as sides (sides), the protocols of one run staged (protocols), one
stage loop and sizing rule (sequential); bisect and the A/A noise check."""

# What may size an A/B's serves, with each one's least value: passed to both sides' `bench
# run` alike (`bench ab` / `bench bisect` flags, gate.json's `ab` keys); the preset's figures
# when absent. Kept free of imports: the CLI's option parsing reads it.
RUN_SIZES = {"requests": 1, "bystanders": 0}


def size_args(size: dict[str, int]) -> list[str]:
    """`bench run` flags for the sizes given (keys of RUN_SIZES)."""
    return [x for key, n in size.items() for x in (f"--{key}", str(n))]
