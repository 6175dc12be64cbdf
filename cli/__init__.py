"""nscas command-line interface (typer)."""
