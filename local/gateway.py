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
from abc import ABCMeta
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs

from aws_lambda_powertools.event_handler.api_gateway import BaseRouter

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


_router_state = threading.local()


class _PerThread:
    """An attribute of the router state kept per thread (unset: AttributeError, as the class
    attribute is before a first request)."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, owner, kind=None):
        return getattr(_router_state, self.name)

    def __set__(self, owner, value) -> None:
        setattr(_router_state, self.name, value)


class _RouterStatePerThread(ABCMeta):
    """``BaseRouter``'s metaclass here: its data descriptors serve ``BaseRouter.current_event``
    and ``lambda_context`` read and written on the class."""

    current_event = _PerThread("current_event")
    lambda_context = _PerThread("lambda_context")


def _router_state_per_thread() -> None:
    """Powertools keeps the request a resolver serves in class attributes of ``BaseRouter``
    (``current_event``, ``lambda_context``), which every resolver of a process shares:
    deployed, a function is a process of its own. Here every function shares this process,
    and two functions resolving at once read each other's request (seen: a reservation
    validated against a usage report's body). So each thread keeps its own: the metaclass
    serves the class's reads and writes, a property the resolvers' ``self.current_event``."""
    if type(BaseRouter) is _RouterStatePerThread:
        return
    for name in ("current_event", "lambda_context"):
        type.__setattr__(BaseRouter, name, property(_PerThread(name).__get__, _PerThread(name).__set__))
    BaseRouter.__class__ = _RouterStatePerThread


_router_state_per_thread()
# One request at a time per function (its resolver's ``context`` is one dict), as one Lambda
# container serves them; different functions at once. Jobs (the aggregator, the pricing
# fetcher): one run at a time per function too.
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
    with _function_locks[function]:
        return handler(event, context)


def invoke_job(function: str, event: dict):
    """Call a job's handler (the aggregator, the pricing fetcher) as its trigger would: the
    schedule's event, a stream batch. One run at a time per function, and of a stream's
    batches one at a time per stream shard. Its reply comes back
    JSON-encoded and decoded, as the Lambda runtime marshals it (a reply it cannot encode
    fails the invocation there, and here)."""
    with _function_locks[f"{function}#{event.get('shardId', '')}"]:  # a stream's: one a shard
        reply = load_handler(function)(event, LambdaContext(function_name=function))
    return json.loads(json.dumps(reply))
