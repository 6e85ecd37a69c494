"""The tree, the host and device pools, the storage tier, page hashes and load-back."""
