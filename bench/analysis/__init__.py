"""The offline half: summary, serving metrics, intervals (estimate), the overhead model's band,
report, plots."""
