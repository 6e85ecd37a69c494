"""One rank's system: its scheduler loop and the seam a cache under test plugs into."""
