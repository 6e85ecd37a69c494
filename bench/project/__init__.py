"""The overhead projected to larger TP x PP layouts: the projection, its grid, its plot."""
