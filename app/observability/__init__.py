"""Prometheus metrics and the HTTP health endpoints of workers and nodes."""
