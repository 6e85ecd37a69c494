"""The judge: SGLang's own rank-consensus checker, switched on in a rank and read back."""
