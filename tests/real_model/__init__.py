"""The real-model suite: a real local model behind llama.cpp's server (marker real_model)."""
