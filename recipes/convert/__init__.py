"""GGUF conversion: a llama.cpp GGUF file as a Hugging Face checkpoint."""
