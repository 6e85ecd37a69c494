"""Two revisions interleaved on this machine: blocks, bisect, revisions, the A/A noise check."""
