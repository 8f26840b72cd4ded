"""The spec is built from the operations the views carry (api/openapi.py): every route of the
app has one, a route without one cannot be served a spec, and an operation naming an error
status or a parameter the spec does not know fails where it is declared.
(tests/integration/test_openapi.py checks the served document through HTTP and runs
schemathesis against it.)"""
from __future__ import annotations

import pytest
from flask import Flask
from openapi_spec_validator import validate

from api.openapi import UndocumentedRoute, app_routes, build_spec, operation, operation_of


def test_every_route_of_the_app_carries_an_operation_and_the_spec_is_valid(make):
    from api import create_app
    app = create_app(make().settings)
    routes = app_routes(app)
    spec = build_spec(app)
    validate(spec)
    documented = {(method.upper(), path) for path, item in spec["paths"].items()
                  for method in item}
    assert {(m, r.replace("<", "{").replace(">", "}")) for m, r in routes} == documented
    # the query parameters a route takes are those its operation names (api/limits.py)
    submit = operation_of(app.view_functions["jobs.submit_message"])
    assert submit is not None and submit.query_names() == {"wait"}
    # ... or the fields of the schema the view loads its query string with, each documented
    usage = operation_of(app.view_functions["admin.get_usage"])
    assert usage is not None and usage.query_names() == {"group_by", "since", "until"}
    documented_query = {p["name"] for p in spec["paths"]["/v1/usage"]["get"]["parameters"]
                        if p.get("in") == "query"}
    assert documented_query == {"group_by", "since", "until"}


def test_a_route_without_an_operation_is_named_when_the_spec_is_built():
    app = Flask("undocumented")
    app.add_url_rule("/v1/things/<thing_id>", "thing", lambda thing_id: "")
    with pytest.raises(UndocumentedRoute, match=r"GET /v1/things/<thing_id>"):
        build_spec(app)


def test_one_operation_cannot_describe_a_view_of_several_methods():
    app = Flask("two_methods")
    view = operation("thing", "A thing", tags=["t"],
                     responses={200: {"description": "The thing."}})(lambda: "")
    app.add_url_rule("/v1/thing", "thing", view, methods=["GET", "POST"])
    with pytest.raises(UndocumentedRoute, match=r"/v1/thing \(GET, POST\)"):
        build_spec(app)


def test_an_operation_naming_an_unknown_status_or_parameter_fails_where_it_is_declared():
    with pytest.raises(ValueError, match=r"error statuses \[418\]"):
        operation("teapot", "Tea", tags=["t"], responses={}, errors=(404, 418))
    with pytest.raises(ValueError, match=r"parameters \['page'\]"):
        operation("paged", "Pages", tags=["t"], responses={}, parameters=["page"])
