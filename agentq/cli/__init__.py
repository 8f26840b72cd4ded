"""The `agentq` command: operate a deployment (db, keys, users, processes) and run the whole
loop on one machine with no servers (`agentq dev`, `agentq run`).

`core` holds the group, the exit codes and the output helpers every command shares; the
commands live by what they work on:

  operate   db, tenants, keys, modules, users, personas, usage: a deployment's database
  local     worker, beat, model, dev, run: the processes, and embedded mode
  remote    submit, jobs …: a running API over HTTP
  batches   batch, replay: batches over HTTP
"""
# the commands, by what they work on (each module adds its own to `main` on import)
from agentq.cli import batches, local, operate, remote  # noqa: F401
from agentq.cli.core import main  # noqa: F401  (the console script: agentq.cli:main)
from agentq.cli.local import _describe  # noqa: F401  (the progress lines' words)
