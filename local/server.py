"""``make run``: the whole service on one laptop.

An HTTP server on ``127.0.0.1:$PORT`` turns each request into an API Gateway proxy
event and calls the same Lambda handler ``cdk deploy`` ships; the usage table's stream
reaches the aggregator through a poller (``local/streams.py``) as the event source mapping
delivers it, and the aggregator's sweep and the pricing fetcher run on timers as
EventBridge would run them (the reconciler too). Requests signed for Bedrock go to the
stand-in (``local/bedrock.py``): inference profiles, which the functions reach through
``AWS_ENDPOINT_URL_BEDROCK``, and the runtime's Converse calls, which record the
``AWS/Bedrock`` metrics in the local CloudWatch.
moto has no Price List API: requests signed for ``pricing`` (``AWS_ENDPOINT_URL_PRICING``)
are refused at once, and config.yaml prices serve, as when the Price List is down in AWS.

It prints one plain line per log event, the functions' included, and stops cleanly on
SIGTERM or SIGINT, however many arrive.

Environment: PORT (8080), PROVISIONING_API_KEY (generated when unset),
AGGREGATOR_INTERVAL_SECONDS (60: the sweep), PRICING_REFRESH_INTERVAL_SECONDS (86400),
RECONCILE_INTERVAL_SECONDS (3600),
RATE_LIMITS (on|off), DYNAMODB_ENDPOINT_URL (external DynamoDB instead of the
embedded one), LOCAL_PERSIST (on|off, default on: state under .local/).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from aws_lambda_powertools.logging.formatter import LambdaPowertoolsFormatter

from price_keeper.errors import error_body
from price_keeper.observability import logger as function_logger
from price_keeper.store.tables import USAGE_AGG_SHARDED

from .bedrock import ACCOUNT, InferenceProfiles, Runtime, signed_for
from .gateway import LAMBDAS, invoke, invoke_job
from .stack import JWT_SECRET_NAME, PROVISIONING_SECRET_NAME, LocalAws
from .streams import RepairQueue, RepairTrigger, StreamReader, StreamTrigger

log = logging.getLogger("price_keeper.local")
MAX_BODY = 1_000_000
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
# What Powertools adds to every event of a function (Lambda context, trace), left out of the
# line. The functions share one logger here, so its function_name may be another's.
_CONTEXT_KEYS = frozenset(
    {
        "level",
        "location",
        "message",
        "timestamp",
        "name",
        "service",
        "sampling_rate",
        "cold_start",
        "function_name",
        "function_memory_size",
        "function_arn",
        "function_request_id",
        "correlation_id",
        "xray_trace_id",
        "exception",
        "exception_name",
    }
)
NO_PRICE_LIST = {
    "statusCode": 400,
    "headers": {"Content-Type": "application/x-amz-json-1.1"},
    "body": json.dumps(
        {
            "__type": "AccessDeniedException",
            "message": "The local stack has no Price List API; config.yaml prices serve",
        }
    ),
}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "PriceKeeperLocal/1.0"
    # Headers and body are two writes: with Nagle on, a keep-alive client's delayed ACK
    # held every response ~40 ms (measured: 48 ms -> 4 ms per Bedrock call, 51 -> 8 ms per API call).
    disable_nagle_algorithm = True

    def _serve(self) -> None:
        path, _, query = self.path.partition("?")
        length = self._body_length()
        if length is None:
            return
        body = self.rfile.read(length) if length else None
        service, region = signed_for(self.headers) or (None, None)
        try:
            if service == "bedrock" and self.server.runtime.serves(path):
                response = self.server.runtime.respond(self.command, path, region, body)
            elif service == "bedrock":
                response = self.server.bedrock.respond(self.command, path, region, body)
            elif service == "pricing":
                response = NO_PRICE_LIST
            else:
                response = invoke(
                    self.command,
                    path,
                    body=body,
                    headers=dict(self.headers.items()),
                    query=query,
                    source_ip=self.client_address[0],
                )
        except Exception:  # what API Gateway answers when a function crashes outside its resolver
            log.exception("function failed for %s %s", self.command, path)
            response = {
                "statusCode": 502,
                "headers": {"Content-Type": "application/json"},
                "body": json.dumps(error_body("INTERNAL_ERROR", "Function failed")),
            }
        payload = response.get("body") or b""
        payload = payload if isinstance(payload, bytes) else payload.encode()
        self.send_response(response["statusCode"])
        headers = {k: v for k, v in (response.get("headers") or {}).items()}
        for name, values in (response.get("multiValueHeaders") or {}).items():
            for value in values:
                if name not in headers:
                    self.send_header(name, value)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _body_length(self) -> int | None:
        """The body's length, or None once refused: a ``Content-Length`` that is not one
        decimal number (``-1`` read to the end of the stream: 150 MB held; ``abc`` raised and
        dropped the connection with no reply) is 400, a body past ``MAX_BODY`` 413, and a
        chunked body, which this server does not read, 411."""
        if self.headers.get("Transfer-Encoding"):
            self.send_error(411, "Send the body with a Content-Length")
            return None
        values = self.headers.get_all("Content-Length") or ["0"]
        if len(set(values)) > 1 or not values[0].strip().isdigit() or not values[0].strip().isascii():
            self.send_error(400, "Content-Length must be one number of bytes")
            return None
        length = int(values[0])
        if length > MAX_BODY:
            self.send_error(413, "Request body too large", details={"max_body_bytes": MAX_BODY})
            return None
        return length

    def send_error(self, code: int, message: str | None = None, explain: str | None = None, details=None) -> None:
        """The server's own refusals (a malformed request line or headers, an oversized body)
        in the error schema, as the deployed gateway's own responses are (``stacks/api.py``:
        4xx ``INVALID_REQUEST``, 5xx ``INTERNAL_ERROR``), instead of http.server's HTML page."""
        reason = self.responses.get(code, ("Error",))[0]
        body = error_body("INVALID_REQUEST" if code < 500 else "INTERNAL_ERROR", (message or reason)[:200], details)
        payload = json.dumps(body).encode()
        self.log_error("code %d, message %s", code, body["message"])
        # A request line it could not read leaves http.server at HTTP/0.9: a body with no
        # status line or headers, which no client today can read.
        self.request_version = "HTTP/1.0" if self.request_version == "HTTP/0.9" else self.request_version
        self.send_response(code, reason)
        self.send_header("Connection", "close")  # the rest of the request was not read
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def __getattr__(self, name: str):
        """Every method goes to the gateway (unknown ones get its 405/404 in the error schema)."""
        if name.startswith("do_"):
            return self._serve
        raise AttributeError(name)

    def log_message(self, fmt: str, *args) -> None:  # quieter than the default stderr line
        log.debug("%s %s", self.address_string(), fmt % args)


class LocalHttpServer(ThreadingHTTPServer):
    """The API on ``127.0.0.1:port``, and Bedrock's inference-profile and runtime calls for ``bedrock``."""

    daemon_threads = True
    # listen() backlog: socketserver's default of 5 resets connections of a burst of
    # concurrent clients (a fleet of 64 reserving at once) before a thread can accept them.
    request_queue_size = 128

    def __init__(self, port: int, bedrock: InferenceProfiles, runtime: Runtime | None = None):
        super().__init__(("127.0.0.1", port), _Handler)
        self.bedrock = bedrock
        self.runtime = runtime or Runtime()


class Timer(threading.Thread):
    """Runs a scheduled function every ``interval`` seconds, like an EventBridge rule."""

    def __init__(self, function: str, interval: float, stop: threading.Event, run_first: bool = False):
        super().__init__(name=f"timer-{function}", daemon=True)
        self.function, self.interval, self.stop_event, self.run_first = function, interval, stop, run_first

    def run(self) -> None:
        if self.run_first:
            self._fire()
        while not self.stop_event.wait(self.interval):
            self._fire()

    def _fire(self) -> None:
        try:
            invoke_job(self.function, {"source": "local.timer", "detail-type": "Scheduled Event"})
        except Exception:  # a failed run is retried at the next tick, as EventBridge would
            log.exception("%s run failed", self.function)


class LocalStack:
    """Embedded AWS + HTTP server + timers; ``start()`` returns once it serves."""

    def __init__(self, port: int | None = None, provisioning_key: str | None = None, persist: bool | None = None):
        self.port = int(port if port is not None else os.environ.get("PORT", "8080"))
        self.requested_key = provisioning_key or os.environ.get("PROVISIONING_API_KEY") or None
        if persist is None:
            persist = os.environ.get("LOCAL_PERSIST", "on") != "off"
        self.aws = LocalAws(persist=persist, dynamodb_endpoint=os.environ.get("DYNAMODB_ENDPOINT_URL"))
        self.stop_event = threading.Event()
        self.httpd: LocalHttpServer | None = None
        self.provisioning_key = ""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LocalStack:
        os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")
        os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
        os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
        os.environ["JWT_SECRET_NAME"] = JWT_SECRET_NAME
        os.environ["PROVISIONING_SECRET_NAME"] = PROVISIONING_SECRET_NAME
        self.aws.start()
        self.aws.ensure_secret(JWT_SECRET_NAME)
        self.provisioning_key = self.aws.ensure_secret(PROVISIONING_SECRET_NAME, self.requested_key)
        self.httpd = LocalHttpServer(self.port, self.aws.bedrock)
        self.port = self.httpd.server_address[1]
        os.environ["AWS_ENDPOINT_URL_BEDROCK"] = self.base_url
        os.environ["AWS_ENDPOINT_URL_BEDROCK_RUNTIME"] = self.base_url
        os.environ["AWS_ENDPOINT_URL_PRICING"] = self.base_url
        threading.Thread(target=self.httpd.serve_forever, name="http", daemon=True).start()
        repair = RepairQueue()
        StreamTrigger("aggregator", StreamReader(USAGE_AGG_SHARDED), self.stop_event).start()
        RepairTrigger("aggregator", repair, self.stop_event).start()
        for function, env, default, run_first in (
            ("aggregator", "AGGREGATOR_INTERVAL_SECONDS", 60, False),
            ("pricing_fetcher", "PRICING_REFRESH_INTERVAL_SECONDS", 86400, True),
            ("reconciler", "RECONCILE_INTERVAL_SECONDS", 3600, False),
        ):
            interval = float(os.environ.get(env, default))
            if interval > 0 and (LAMBDAS / function / "handler.py").exists():
                Timer(function, interval, self.stop_event, run_first).start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        if self.httpd:
            self.httpd.shutdown()
            self.httpd.server_close()
        self.aws.stop()


def _event_line(event: dict) -> str:
    """A function's log event as one line of ``LOG_FORMAT``, its own keys (``extra=``) at the
    end; a traceback, if any, follows."""
    message = event["message"] if isinstance(event["message"], str) else json.dumps(event["message"], default=str)
    keys = " ".join(
        f"{key}={json.dumps(value, default=str)}" for key, value in event.items() if key not in _CONTEXT_KEYS
    )
    line = f"{event['timestamp']} {event['level']} {event['name']} {message}"
    return "\n".join(filter(None, (f"{line} {keys}".rstrip(), event.get("exception"))))


def _log_plainly() -> None:
    """The server's own logging in ``LOG_FORMAT``. The functions' Powertools logger writes JSON
    for CloudWatch and also hands each event on to the root logger: here it writes
    ``_event_line`` instead, and alone."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    for noisy in ("botocore", "urllib3", "werkzeug"):  # werkzeug: a line per request moto serves
        logging.getLogger(noisy).setLevel(logging.WARNING)
    function_logger.registered_handler.setFormatter(
        LambdaPowertoolsFormatter(
            json_serializer=_event_line,
            datefmt="%Y-%m-%d %H:%M:%S,%F",
            serialize_stacktrace=False,
            service=function_logger.service,
            name="%(name)s",
        )
    )
    logging.getLogger(function_logger.name).propagate = False


def main() -> int:
    # Blocked before any thread starts (threads inherit the mask): the signals then wait for
    # sigwait below, instead of running a handler in the middle of whatever the main thread does.
    stop_signals = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    _log_plainly()
    warnings.filterwarnings("ignore", "No application metrics to publish")  # metrics are off locally
    stack = LocalStack().start()
    print(f"Bedrock Price Keeper is running at {stack.base_url}", flush=True)
    print(f"  API docs:          {stack.base_url}/docs", flush=True)
    print(f"  Spend console:     {stack.base_url}/console", flush=True)
    print(f"  Provisioning key:  {stack.provisioning_key}", flush=True)
    print(f"  Bedrock:           {stack.base_url} as endpoint URL (account {ACCOUNT}; see README)", flush=True)
    print("  Stop with Ctrl-C.", flush=True)
    received = signal.sigwait(stop_signals)  # more of them, while stopping, stay blocked and pending
    print(f"{signal.Signals(received).name}: stopping", flush=True)
    stack.stop()
    print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
