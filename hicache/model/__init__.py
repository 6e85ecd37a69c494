"""The forward stand-ins: a CUDA model shaped like the real one, and the CPU toy."""
