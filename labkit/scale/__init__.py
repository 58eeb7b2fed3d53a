"""labkit.scale."""
