"""Pieces shared by the per-op kernel folders (see triton/ for the Triton templates' helpers)."""
