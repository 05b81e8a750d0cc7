"""The agent side: the job contract (runner), checkpoints, preemption notices, the agent loop."""
