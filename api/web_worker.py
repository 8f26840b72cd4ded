"""The web process's gunicorn worker (gunicorn.conf.py): gevent's, with the request head's
deadline spread out.

gunicorn's gevent worker reads each request head under `gevent.Timeout(keepalive)`
(`AsyncWorker.handle`, `GeventWorker.timeout_ctx`): that is the header timeout
(AGENTQ_HEADER_TIMEOUT_S). Connections opened together by a slow client all reach it
together, and an attacker that opens them again as soon as they are closed keeps them in
step: every few seconds the worker would close and accept thousands at once, and a request
arriving then waits behind them. Here each head gets the timeout plus up to half of it
again, at random, so those waves spread out; no head is given less than the setting.
"""
from __future__ import annotations

import random

import gevent
from gunicorn.workers.ggevent import GeventWorker

SPREAD = 0.5


class Worker(GeventWorker):
    def timeout_ctx(self):
        return gevent.Timeout(self.cfg.keepalive * (1 + SPREAD * random.random()), False)
