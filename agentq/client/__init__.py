"""A Python client for agentq's HTTP API (API.md), sync and async, on httpx.

    from agentq.client import AgentQ

    with AgentQ("http://127.0.0.1:5000", api_key=KEY) as aq:
        job = aq.submit("What is 6*7?", user="me", channel="c1", idempotency_key="q-1")
        job = aq.wait(job.id)
        print(job.status, job.content)
"""
from agentq.client._clients import AgentQ, AsyncAgentQ, verify_webhook
from agentq.client._core import (
                                 AgentQError,
                                 ApiError,
                                 Batch,
                                 BatchCounts,
                                 BatchResult,
                                 Conflict,
                                 Delivery,
                                 Event,
                                 File,
                                 Job,
                                 NotFound,
                                 Response,
                                 Timeout,
                                 ToolCall,
                                 TransportError,
                                 Unavailable,
                                 Usage,
                                 WebhookEvent,
                                 WebhookVerificationError,
)

__all__ = ["AgentQ", "AsyncAgentQ", "verify_webhook", "AgentQError", "ApiError", "Batch",
           "BatchCounts", "BatchResult", "Conflict", "Delivery", "Event", "File", "Job",
           "NotFound", "Response", "Timeout", "ToolCall", "TransportError", "Unavailable",
           "Usage", "WebhookEvent", "WebhookVerificationError"]
