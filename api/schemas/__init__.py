"""Marshmallow schemas per request and response (API.md, to the letter), a module per
resource: `common` (the strict request base, shared validators and limits, the error
shape), `jobs`, `batches` (and replays), `conversations`, `schedules`, `admin` (tenants,
keys, personas, users, usage), `modules`, `deliveries`, `embed`, `health`. The OpenAPI
spec (api/openapi.py) names each component by its class, less `Schema`."""
