"""Webhooks: signed event deliveries (Standard Webhooks), their retries and SSRF checks.

- `signing`: the `webhook-*` headers, signed by the `standardwebhooks` library.
- `urls`: which callback URLs may be called (http/https, public addresses unless allowed).
- `delivery`: the delivery rows, one attempt over HTTP, and the retry schedule.
"""
