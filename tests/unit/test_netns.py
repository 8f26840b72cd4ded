"""benchmarks/netns.py's settings for a node: the lab's URLs re-pointed from loopback to the
host's address on the nodes' network, the rest of the lab's settings kept, its home not."""
from __future__ import annotations

from benchmarks.netns import node_env


def test_a_node_reaches_the_shared_tier_at_the_hosts_address():
    lab = {"AGENTQ_DATABASE_URL": "postgresql://postgres@127.0.0.1:5555/agentq_faults",
           "AGENTQ_BROKER_URL": "amqp://guest:guest@127.0.0.1:5673//",
           "AGENTQ_RESULT_BACKEND_URL": "redis://127.0.0.1:6380/0",
           "OPENAI_BASE_URL": "http://10.213.0.1:4000/v1",
           "AGENTQ_STEP_DEADLINE_S": "8", "AGENTQ_HOME": "/tmp/lab",
           "AGENTQ_TEST_SCRATCH": "/tmp/lab", "PATH": "/usr/bin"}
    env = node_env(lab, "10.213.0.1")
    assert env == {"AGENTQ_DATABASE_URL": "postgresql://postgres@10.213.0.1:5555/agentq_faults",
                   "AGENTQ_BROKER_URL": "amqp://guest:guest@10.213.0.1:5673//",
                   "AGENTQ_RESULT_BACKEND_URL": "redis://10.213.0.1:6380/0",
                   "OPENAI_BASE_URL": "http://10.213.0.1:4000/v1",
                   "AGENTQ_STEP_DEADLINE_S": "8"}


def test_only_the_host_part_of_a_url_is_rewritten():
    lab = {"AGENTQ_DATABASE_URL": "postgresql://u:127.0.0.1x@db.example:5432/127.0.0.1"}
    assert node_env(lab, "10.0.0.1") == lab
