"""Exact rewrites of keywords no backend enforces into equivalents it does."""
