"""The pure math: cost and risk under preemption, a transformer's memory and time per layout, pipeline schedules
and their bubbles, spend accounting.
"""
