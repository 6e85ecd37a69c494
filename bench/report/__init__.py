"""The printer: console lines within 120 columns, markdown and fixed-width tables (printer)."""
