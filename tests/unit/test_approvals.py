"""Deciding a tool call held for a person (agentq.loop.approvals), without servers."""
from __future__ import annotations

import uuid

import pytest

from agentq.errors import NotFound
from agentq.loop.approvals import approve, deny
from agentq.loop.uow import UnitOfWork


def test_deciding_a_call_of_a_job_that_is_gone_is_not_found(make):
    # given a job id no row has (deleted after the caller read it)
    h = make()
    gone = uuid.uuid4()
    for decide in (lambda uow: approve(uow, gone, "toolu_1", None, h.registry),
                   lambda uow: deny(uow, gone, "toolu_1", None)):
        # when a person approves or denies one of its calls
        with pytest.raises(NotFound) as raised:
            with UnitOfWork(h.sessions) as uow:
                decide(uow)
        # then it is a 404 naming the job, not an AttributeError on None
        assert raised.value.status == 404
        assert str(gone) in str(raised.value)
