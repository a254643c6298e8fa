"""Model shapes, and model directories made here (no hub download)."""
