"""k3c.backends."""
