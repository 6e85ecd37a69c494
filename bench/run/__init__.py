"""The online half: a run's plan, workload, launch, the rank worker and the result sink."""
