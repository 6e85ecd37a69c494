"""Two runs side by side, paired by repeat: rows, metrics, rules, the report."""
