"""The control project's one app."""
