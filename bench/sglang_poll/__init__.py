"""`python -m bench sglang-poll`: SGLang's own poll and controller against the project's model."""
