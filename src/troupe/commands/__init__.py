"""Subcommands of ``troupe`` other than ``serve``."""
