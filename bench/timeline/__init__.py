"""The timeline of a run (`python -m bench timeline`): what every rank's threads did when,
as a Perfetto trace and a figure, built offline from the events a run recorded."""
