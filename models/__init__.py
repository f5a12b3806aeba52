"""k3c.models: the eager reference zoo."""
