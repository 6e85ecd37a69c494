"""The offline half: summary, serving metrics, the overhead model's band, report, plots."""
