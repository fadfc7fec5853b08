"""What the app layers (trainer, eval, experiments, tasks, the command line) share and the core does not need:
configuration files and `--set` (configio), the progress display (console), experiment trackers (tracking), data
sets (data), model locations (models) and the provenance of a run (provenance). Needs the `app` extra."""
