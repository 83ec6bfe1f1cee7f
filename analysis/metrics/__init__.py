"""Metrics beyond nsys: GPU metrics of a capture, phase attribution, timing statistics."""
