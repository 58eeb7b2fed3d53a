"""labkit.base."""
