"""Every pass/fail rule: verdict words, thresholds, exact checks, a run's and a gate's verdict."""
