"""Shared measuring helpers for the fast-diffusion notebooks."""
