"""k3c.passes."""
