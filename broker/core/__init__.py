"""The broker itself: submit and quote (broker.py), the control loop that folds reports, reclaims lost agents,
dispatches and guards deadlines (server.py), clocks.
"""
