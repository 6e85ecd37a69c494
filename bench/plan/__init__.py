"""`bench run`'s plan: its options, presets and the one resolver that checks every value."""
