"""The offline half: summary, serving metrics, the overhead model's band, verdict, report, plots."""
