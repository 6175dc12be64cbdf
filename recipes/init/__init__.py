"""Model initialisation: Llama-architecture presets with seeded, reproducible weights."""
