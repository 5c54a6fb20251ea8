"""Model loading and execution backends."""
