"""Prices and preemption risk: the clouds' catalogs, recorded price points, spot traces, the hazard model."""
