"""Reading a synthesized CloudFormation template: references, API paths, role policies."""

from __future__ import annotations

from dataclasses import dataclass


def logical_id(value) -> str | None:
    """The resource a ``Ref`` or ``Fn::GetAtt`` points at."""
    if isinstance(value, dict):
        if "Ref" in value:
            return value["Ref"]
        if "Fn::GetAtt" in value:
            return value["Fn::GetAtt"][0]
    return None


def referenced_ids(value) -> set[str]:
    """Every resource referenced anywhere inside ``value`` (pseudo parameters like
    ``AWS::Region`` are not resources)."""
    found: set[str] = set()
    if isinstance(value, dict):
        if (target := logical_id(value)) is not None and not target.startswith("AWS::"):
            found.add(target)
        for item in value.values():
            found |= referenced_ids(item)
    elif isinstance(value, list):
        for item in value:
            found |= referenced_ids(item)
    return found


def of_type(template: dict, resource_type: str) -> dict[str, dict]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == resource_type}


def api_paths(template: dict) -> dict[str, str]:
    """API Gateway resource (or ``RestApi`` root) logical id → its path."""
    resources = of_type(template, "AWS::ApiGateway::Resource")
    paths = {api_id: "/" for api_id in of_type(template, "AWS::ApiGateway::RestApi")}

    def path_of(resource_id: str) -> str:
        if resource_id not in paths:
            props = resources[resource_id]["Properties"]
            parent = path_of(logical_id(props["ParentId"]))
            paths[resource_id] = parent.rstrip("/") + "/" + props["PathPart"]
        return paths[resource_id]

    for resource_id in resources:
        path_of(resource_id)
    return paths


@dataclass(frozen=True)
class Statement:
    actions: tuple[str, ...]
    resources: tuple
    raw: dict

    @property
    def targets(self) -> set[str]:
        return referenced_ids(list(self.resources))

    @property
    def wildcard(self) -> bool:
        return "*" in self.resources


def statements(document: dict) -> list[Statement]:
    result = []
    for raw in document["Statement"]:
        actions = raw.get("Action", [])
        resources = raw.get("Resource", [])
        result.append(
            Statement(
                tuple(actions if isinstance(actions, list) else [actions]),
                tuple(resources if isinstance(resources, list) else [resources]),
                raw,
            )
        )
    return result


def role_statements(template: dict) -> dict[str, list[Statement]]:
    """Role logical id → the allow statements of every inline policy attached to it."""
    by_role: dict[str, list[Statement]] = {role: [] for role in of_type(template, "AWS::IAM::Role")}
    for policy in of_type(template, "AWS::IAM::Policy").values():
        for role in policy["Properties"].get("Roles", []):
            by_role[logical_id(role)] += statements(policy["Properties"]["PolicyDocument"])
    for role_id, role in of_type(template, "AWS::IAM::Role").items():
        for inline in role["Properties"].get("Policies", []):
            by_role[role_id] += statements(inline["PolicyDocument"])
    return by_role
