"""k3c.frontend."""
