"""benchmarks/netns.py: a node's settings (the lab's URLs re-pointed from loopback to the
host's address on the nodes' network, the rest of the lab's settings kept, its home not), and
a network taken down whole even when a part of it resists."""
from __future__ import annotations

import ipaddress

import pytest

from benchmarks import netns
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


def test_a_cgroup_that_cannot_be_removed_leaves_no_link_namespace_or_bridge(monkeypatch):
    # given a network of two nodes whose first node's cgroup will not go
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(netns, "ip", lambda *args, check=True: calls.append(args))
    network = netns.Network()
    network.subnet, network._created = ipaddress.ip_network("10.213.7.0/24"), True
    nodes = [netns.Node(network, i, None) for i in (1, 2)]
    network.nodes = list(nodes)
    removed = []

    def stuck():
        raise OSError(16, "Device or resource busy")
    monkeypatch.setattr(nodes[0].cpu, "remove", stuck)
    monkeypatch.setattr(nodes[1].cpu, "remove", lambda: removed.append(nodes[1].name))

    # when the network is taken down, then the error is raised after every part was tried
    with pytest.raises(OSError, match="busy"):
        network.destroy()
    assert removed == [nodes[1].name]
    for node in nodes:
        assert ("link", "del", node.host_end) in calls
        assert ("netns", "del", node.name) in calls
    assert calls[-1] == ("link", "del", network.bridge)
    assert network.nodes == [] and not network._created
