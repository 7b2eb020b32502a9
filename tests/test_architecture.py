"""The seams of the layer hold: DynamoDB and its keys only behind ``store/``, the other AWS
services behind ``aws/``, and one reset
for all process state (that handlers leave authentication to the request pipeline is
``tests/test_pipeline.py``'s)."""

import ast
from pathlib import Path

import price_keeper
from price_keeper import aws, ratelimit, state
from price_keeper.aws import secrets as secrets_store
from price_keeper.store import dynamo
from tests.usage_support import new_tenant, usage_body

PACKAGE = Path(next(iter(price_keeper.__path__)))
DYNAMODB_CALLS = {
    "get_item",
    "put_item",
    "update_item",
    "delete_item",
    "query",
    "scan",
    "batch_get_item",
    "batch_write_item",
    "transact_write_items",
    "transact_get_items",
    "Table",
}
CONNECTION = {"dynamodb", "ddb_client", "table", "query_all", "conditional", "written", "transact"}


def _modules(root: Path):
    for path in sorted(root.rglob("*.py")):
        yield path, ast.parse(path.read_text(), filename=str(path))


def _outside_store():
    return [(path, tree) for path, tree in _modules(PACKAGE) if "store" not in path.relative_to(PACKAGE).parts]


def test_nothing_outside_store_calls_dynamodb():
    offences = []
    for path, tree in _outside_store():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in DYNAMODB_CALLS:
                offences.append(f"{path.name}:{node.lineno} .{node.func.attr}(...)")
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and (node.module.startswith("boto3.dynamodb") or node.module.endswith("store.dynamo"))
            ):
                used = {alias.name for alias in node.names} & CONNECTION
                if node.module.startswith("boto3.dynamodb") or used:
                    offences.append(f"{path.name}:{node.lineno} imports {node.module} {sorted(used)}")
    assert offences == []


def test_only_store_and_aws_reach_aws():
    """DynamoDB behind ``store/``, every other AWS service behind ``aws/``: no other module
    imports boto3 or makes a client."""
    offences = []
    for path, tree in _modules(PACKAGE):
        if path.relative_to(PACKAGE).parts[0] in ("store", "aws"):
            continue
        for node in ast.walk(tree):
            imported = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                imported = [node.module]
            if any(name.split(".")[0] == "boto3" for name in imported):
                offences.append(f"{path.name}:{node.lineno} imports boto3")
            called = node.func if isinstance(node, ast.Call) else None
            if getattr(called, "attr", getattr(called, "id", None)) in ("client", "resource"):
                offences.append(f"{path.name}:{node.lineno} makes a client")
    assert offences == []


def test_keys_are_built_and_parsed_only_in_store():
    offences = []
    for path, tree in _outside_store():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and any(
                    node.value.startswith(prefix)
                    for prefix in (
                        "DAY#",
                        "#LABEL#",
                        "ALERT#",
                        "RATE#",
                        "BOOST#",
                        "CLIENT#",
                        "ORG#",
                        "APP#",
                        "PROFILE#",
                    )
                )
            ):
                offences.append(f"{path.name}:{node.lineno} {node.value!r}")
    assert offences == []


def test_one_reset_forgets_all_process_state(api):
    tenant = new_tenant()
    assert api.post(f"{tenant.app_path}/usage", usage_body(), token=tenant.token).status == 202
    aws.client("events")
    ratelimit._local[("client", "usage", 0)] = (1, 1)
    clients = [dynamo.dynamodb, aws.client, secrets_store._secrets]
    assert [kept.cache_info().currsize for kept in clients] == [1, 2, 1]  # secretsmanager and events
    state.reset()
    assert [kept.cache_info().currsize for kept in clients] == [0, 0, 0]
    assert ratelimit._local == {} and ratelimit.response_headers() in (None, {})
    assert all(not cache._data for cache in _ttl_caches())


def _ttl_caches():
    import gc

    from price_keeper.cache import TTLCache

    return [obj for obj in gc.get_objects() if isinstance(obj, TTLCache)]


def _imported_packages(path: Path, tree: ast.AST) -> set[str]:
    """The ``price_keeper`` subpackages a module imports (``http``, ``domain``, ``store``),
    relative and absolute imports alike."""
    package = path.relative_to(PACKAGE).parts[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[: len(package) - node.level + 1])
                parts = [*base, *(node.module.split(".") if node.module else [])]
            elif node.module and node.module.startswith("price_keeper"):
                parts = node.module.split(".")[1:]
            else:
                continue
            names = parts[:1] or [alias.name for alias in node.names]
            found.update(names)
    return found


def test_layers_only_look_down():
    """http above domain above store and aws (which know nothing of each other); the shared
    modules at the top below http and domain (``ratelimit`` keeps its counters through ``store``)."""
    below = {
        "store": {"aws"},  # its connection's retry settings
        "aws": set(),
        "domain": {"store", "aws"},
        "http": {"domain", "store", "aws"},
        None: {"store", "aws"},
    }
    upper = {"http", "domain", "store", "aws"}
    offences = []
    for path, tree in _modules(PACKAGE):
        parts = path.relative_to(PACKAGE).parts
        layer = parts[0] if len(parts) > 1 else None
        allowed = below[layer] | {layer}
        for name in _imported_packages(path, tree) & upper:
            if name not in allowed:
                offences.append(f"{'/'.join(parts)} imports {name}")
    assert offences == []
