"""Integrations with optional third-party packages; each module imports its package."""
