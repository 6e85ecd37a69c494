"""The decisions path: SGLang's own poll, and its decisions behind the harness's seam."""
