"""What broker talks about, with no behaviour beyond checking itself: job specs, jobs and runs, offers, quotes
and plans, bubble profiles, GPUs, user errors.
"""
