"""Process groups, the counting wrapper every collective goes through, and its records."""
