"""The fair comparison's peers (benchmarks/fair.py): the services a user would build instead
of agentq, and the library peers driven phase by phase from stdin."""
