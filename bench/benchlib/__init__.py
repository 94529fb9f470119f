"""Helpers shared by the scripts in bench/ (standard library only)."""
