"""What people and programs touch: the CLI, the wiring of the parts, rendering, settings, metrics, the demos."""
