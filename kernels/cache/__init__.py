"""Fixed-capacity caches: the row write and attention over the valid rows of each sequence."""

from .naive import cache_write, cached_attention, mla_cached_attention, mla_cached_attention_absorbed

__all__ = ["cache_write", "cached_attention", "mla_cached_attention", "mla_cached_attention_absorbed"]
