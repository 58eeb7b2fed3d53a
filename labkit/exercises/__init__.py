"""labkit.exercises."""
