"""The controller path: SGLang's controller threads, as a rig and as a run's data path."""
