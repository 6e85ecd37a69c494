"""The run directory: its file names, columns, atomic writers and the environment record."""
