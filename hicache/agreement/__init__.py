"""Who agrees on what, with which collective: the termination protocols, their helpers."""
