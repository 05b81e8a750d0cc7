"""Every Redis key and script: jobs, agents, leases and streams (jobs.py), price history, bubble profiles, ACL
users, the embedded server.
"""
