"""`python -m bench hazards`: the protocols x hazard scenarios matrix (docs/hazards.md)."""
