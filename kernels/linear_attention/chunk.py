"""Placeholder: the chunked form lands with the kernel work."""
