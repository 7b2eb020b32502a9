"""API Gateway (Lambda proxy integration) in a few functions: the local server and the
handler tests turn HTTP requests into the exact events API Gateway sends to Lambda and
call the same ``lambda_handler`` the stack deploys.

``kind`` is the gateway of ``-c apiKind``: ``http`` (an HTTP API's payload format 2.0 on its
``$default`` stage, the stack's default) or ``rest`` (a REST API's proxy event)."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs

from price_keeper import routes
from price_keeper.errors import error_body  # the package put the layer on sys.path
from price_keeper.http.modules import load_handler_module

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("http", "rest")
DEFAULT_KIND = "http"  # stacks.settings.Settings.api_kind
LAMBDAS = ROOT / "lambdas"


@dataclass
class LambdaContext:
    """The attributes Powertools reads from a Lambda context."""

    function_name: str
    memory_limit_in_mb: int = 256
    aws_request_id: str = ""
    log_group_name: str = "/aws/lambda/local"
    log_stream_name: str = "local"

    @property
    def invoked_function_arn(self) -> str:
        return f"arn:aws:lambda:us-east-1:000000000000:function:{self.function_name}"

    def get_remaining_time_in_millis(self) -> int:
        return 30_000


def load_handler(function: str):
    """``lambdas/<function>/handler.py``'s ``lambda_handler``, imported once."""
    return load_handler_module(LAMBDAS, function).lambda_handler


def api_event(
    method: str,
    path: str,
    *,
    body: str | bytes | dict | None = None,
    headers: dict | None = None,
    query: str = "",
    source_ip: str = "127.0.0.1",
    kind: str = DEFAULT_KIND,
) -> tuple[dict, str] | None:
    """The proxy event for a request and the function that serves it (``None``: no route)."""
    found = routes.match(method, path)
    if found is None:
        return None
    route, params = found
    if isinstance(body, dict):
        body = json.dumps(body)
    if isinstance(body, bytes):
        body = body.decode("utf-8", errors="replace")
    headers = dict(headers or {})
    multi_query = parse_qs(query, keep_blank_values=True) if query else {}
    request_id = str(uuid.uuid4())
    if kind == "http":
        return _http_api_event(route, method, path, params, body, headers, query, source_ip, request_id), route.function
    event = {
        "resource": route.path,
        "path": path,
        "httpMethod": method,
        "headers": headers,
        "multiValueHeaders": {k: [v] for k, v in headers.items()},
        "queryStringParameters": {k: v[-1] for k, v in multi_query.items()} or None,
        "multiValueQueryStringParameters": multi_query or None,
        "pathParameters": params or None,
        "stageVariables": None,
        "requestContext": {
            "resourcePath": route.path,
            "httpMethod": method,
            "path": path,
            "stage": "local",
            "requestId": request_id,
            "requestTimeEpoch": int(time.time() * 1000),
            "identity": {"sourceIp": source_ip},
        },
        "body": body if body else None,
        "isBase64Encoded": False,
    }
    return event, route.function


def _http_api_event(route, method, path, params, body, headers, query, source_ip, request_id) -> dict:
    """An HTTP API's event (payload format 2.0): header names in lower case, repeated values
    joined by commas, cookies apart, the route as its ``routeKey``."""
    joined: dict[str, list[str]] = defaultdict(list)
    for name, value in headers.items():
        joined[name.lower()].append(value)
    cookies = joined.pop("cookie", [])
    now = time.time()
    route_key = f"{method} {route.path}"
    return {
        "version": "2.0",
        "routeKey": route_key,
        "rawPath": path,
        "rawQueryString": query,
        **({"cookies": [c.strip() for line in cookies for c in line.split(";")]} if cookies else {}),
        "headers": {name: ",".join(values) for name, values in joined.items()},
        **(
            {"queryStringParameters": {k: ",".join(v) for k, v in parse_qs(query, keep_blank_values=True).items()}}
            if query
            else {}
        ),
        **({"pathParameters": params} if params else {}),
        "requestContext": {
            "accountId": "000000000000",
            "apiId": "local",
            "domainName": "localhost",
            "domainPrefix": "localhost",
            "http": {
                "method": method,
                "path": path,
                "protocol": "HTTP/1.1",
                "sourceIp": source_ip,
                "userAgent": joined.get("user-agent", [""])[-1],
            },
            "requestId": request_id,
            "routeKey": route_key,
            "stage": "$default",
            "time": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(now)),
            "timeEpoch": int(now * 1000),
        },
        **({"body": body} if body else {}),
        "isBase64Encoded": False,
    }


# One API request at a time in this process: a Powertools resolver keeps the current event in
# a class attribute (``BaseRouter.current_event``) that every resolver of the process shares.
# Deployed, each function is a process of its own; here, two functions resolving at once could
# read each other's request (seen: a reservation validated against a usage report's body).
_resolver_lock = threading.Lock()
# Jobs (the aggregator, the pricing fetcher): one run at a time per function, as one Lambda
# container serves them.
_function_locks: dict[str, threading.Lock] = defaultdict(threading.Lock)


def _preflight(path: str, **kwargs) -> tuple[dict, str] | None:
    """A CORS preflight (``OPTIONS``) to a route's path, given to a function of that path,
    whose Powertools CORS configuration answers it (deployed, the gateway's CORS does)."""
    allowed = routes.allowed_methods(path)
    if not allowed:
        return None
    event, function = api_event(allowed[0], path, **kwargs)
    if "version" in event:
        event["routeKey"] = event["requestContext"]["routeKey"] = f"OPTIONS {event['routeKey'].partition(' ')[2]}"
        event["requestContext"]["http"]["method"] = "OPTIONS"
    else:
        event["httpMethod"] = event["requestContext"]["httpMethod"] = "OPTIONS"
    return event, function


def invoke(method: str, path: str, **kwargs) -> dict:
    """Call the function behind ``method path`` and return its proxy response."""
    built = api_event(method, path, **kwargs)
    if built is None and method == "OPTIONS" and os.environ.get("CORS_ORIGINS"):
        built = _preflight(path, **kwargs)
    if built is None:
        status, error = (405, "METHOD_NOT_ALLOWED") if routes.allowed_methods(path) else (404, "NOT_FOUND")
        return {
            "statusCode": status,
            "headers": {"Content-Type": "application/json"},
            "body": json.dumps(error_body(error, "No such route" if status == 404 else f"{method} not allowed")),
        }
    event, function = built
    context = LambdaContext(function_name=function, aws_request_id=event["requestContext"]["requestId"])
    handler = load_handler(function)
    with _resolver_lock:
        return handler(event, context)


def invoke_job(function: str, event: dict):
    """Call a job's handler (the aggregator, the pricing fetcher) as its trigger would: the
    schedule's event, a stream batch. One run at a time per function. Its reply comes back
    JSON-encoded and decoded, as the Lambda runtime marshals it (a reply it cannot encode
    fails the invocation there, and here)."""
    with _function_locks[function]:
        reply = load_handler(function)(event, LambdaContext(function_name=function))
    return json.loads(json.dumps(reply))
