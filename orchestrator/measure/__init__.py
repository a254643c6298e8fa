"""Measurement: from request records and the engine's own metrics to a trial's numbers."""
