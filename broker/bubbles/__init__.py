"""Bubbles as capacity: the idle windows of pipeline-parallel training jobs (PipeFill, FreeRide)."""
