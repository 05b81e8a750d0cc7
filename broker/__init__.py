"""broker: run GPU jobs on the cheapest capacity (bubbles, spot, on-demand) that meets their deadline and budget."""

__version__ = "0.1.0"
