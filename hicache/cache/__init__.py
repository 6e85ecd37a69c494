"""HiCache: the scheduler side (poll, per-step events, load-back) and the controller's threads."""
