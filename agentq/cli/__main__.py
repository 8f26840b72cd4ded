"""`python -m agentq.cli …`: the `agentq` command."""
from agentq.cli import main

main()
