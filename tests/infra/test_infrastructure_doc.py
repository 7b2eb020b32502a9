"""Every number docs/infrastructure.md states about the synthesized templates is the
templates' own: its table "What the template holds" row by row, the reserved concurrency
per function, the usage stream mapping's settings, the cdk-nag findings per rule, and the
counts its sentences give (a review found it claiming 16 HTTP functions, a stream factor of
4 and the DynamoDB grants in the column of reserved concurrency).

A row or a sentence that drifts from the stack fails here; so does a row of the figures
table that nothing checks, or a checked figure the table lost."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest

from price_keeper import metric_names, routes
from price_keeper.store.tables import USAGE_AGG_SHARDED
from stacks import REPO_ROOT
from stacks.functions import reserved_concurrency
from stacks.settings import Settings

from .cfn import logical_id
from .conftest import OPTIONS

pytestmark = pytest.mark.infra

DOC = REPO_ROOT / "docs" / "infrastructure.md"
NAG_PACK = "AwsSolutions"
# The reserved concurrency table's column of an account with ``synth_options``' limit.
RESERVED_WITH_LIMIT = f"reserved with `accountConcurrency={OPTIONS['accountConcurrency']}`"


# --- reading the page -----------------------------------------------------------------------


def number(text: str) -> int:
    """``1,000`` -> 1000."""
    return int(text.strip().replace(",", ""))


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _header_line(first_cells: tuple[str, ...]) -> int:
    """Index of the one table header on the page that begins with ``first_cells``."""
    lines = DOC.read_text().splitlines()
    found = [
        i
        for i, line in enumerate(lines)
        if line.startswith("|") and tuple(cells(line)[: len(first_cells)]) == first_cells
    ]
    assert len(found) == 1, f"docs/infrastructure.md: {len(found)} tables headed {first_cells!r}"
    return found[0]


def header(*first_cells: str) -> list[str]:
    return cells(DOC.read_text().splitlines()[_header_line(first_cells)])


def table(*first_cells: str) -> list[list[str]]:
    """The body rows of the table whose header begins with ``first_cells``."""
    lines = DOC.read_text().splitlines()
    rows = []
    for line in lines[_header_line(first_cells) + 2 :]:  # past the header and its |---| line
        if not line.startswith("|"):
            break
        rows.append(cells(line))
    return rows


def page_text() -> str:
    """The page with line breaks as spaces (a phrase may wrap), tables included."""
    return " ".join(DOC.read_text().splitlines())


# --- reading the templates ------------------------------------------------------------------


def resources(synthesized, resource_type: str) -> dict[str, dict]:
    return synthesized.resources(resource_type)


def functions_of(synthesized, names: tuple[str, ...]) -> int:
    """How many of ``names`` are Lambda functions of the template."""
    present = resources(synthesized, "AWS::Lambda::Function")
    return sum(
        1 for name, function_id in synthesized.function_ids().items() if name in names and function_id in present
    )


def traced(synthesized) -> int:
    return sum(
        1
        for function in resources(synthesized, "AWS::Lambda::Function").values()
        if function["Properties"].get("TracingConfig", {}).get("Mode") == "Active"
    )


def alarm_metrics(alarm: dict) -> int:
    """Metrics an alarm reads, each billed: one, or each metric of its metric math."""
    properties = alarm["Properties"]
    if "Metrics" in properties:
        return sum(1 for query in properties["Metrics"] if "MetricStat" in query)
    return 1


def usage_stream_mapping(synthesized) -> dict:
    """The event source mapping of the usage table's stream (the stack's other one reads the
    repair queue)."""
    usage_table = synthesized.id_of(synthesized.stack.tables.by_spec[USAGE_AGG_SHARDED])
    (mapping,) = [
        m["Properties"]
        for m in resources(synthesized, "AWS::Lambda::EventSourceMapping").values()
        if logical_id(m["Properties"]["EventSourceArn"]) == usage_table
    ]
    return mapping


def nag_findings(synthesized) -> list[dict]:
    (report,) = json.loads((synthesized.outdir / "validation-report.json").read_text())["pluginReports"]
    assert report["pluginName"] == NAG_PACK
    return report["suppressedViolations"]


def nag_row(rule_name: str) -> str:
    """The cdk-nag table's row of a finding: its rule, and for IAM5 which wildcard."""
    rule = rule_name.removeprefix(f"{NAG_PACK}-")
    base = rule.split("[")[0]
    if base != "IAM5":
        return base
    if rule == "IAM5[Resource::*]":
        return "IAM5 `Resource::*`"
    assert ":bedrock:" in rule, rule  # a new kind of wildcard needs a row of its own
    return "IAM5 Bedrock ARNs"


def custom_metrics() -> set[str]:
    """Names of the EMF metrics the functions publish (each name with the one dimension
    ``service``: a custom metric each), read from the source: ``add_metric(name=...)`` with a
    literal or a ``metric_names`` constant, and ``count(CONSTANT)``."""
    sources = [
        path
        for root in (REPO_ROOT / "lambdas", REPO_ROOT / "layers" / "common" / "python" / "price_keeper")
        for path in root.rglob("*.py")
        if "tests" not in path.parts
    ]
    names: set[str] = set()
    for path in sources:
        text = path.read_text()
        for literal, constant in re.findall(r"add_metric\(\s*name=(?:\"(\w+)\"|(\w+))", text):
            if literal:
                names.add(literal)
            elif hasattr(metric_names, constant):
                names.add(getattr(metric_names, constant))
        names |= {
            getattr(metric_names, c) for c in re.findall(r"\bcount\(([A-Z_]+)\)", text) if hasattr(metric_names, c)
        }
    return names


def smallest_account_that_reserves() -> int:
    return next(limit for limit in range(1, 100_000) if reserved_concurrency(Settings(account_concurrency=limit)))


# --- the figures table ----------------------------------------------------------------------

# Each row of "What the template holds" and how to count it: (default synth, REST synth) -> int.
FIGURES: dict[str, Callable] = {
    "resources, HTTP API": lambda s, r: len(s.json["Resources"]),
    "resources, REST API (`apiKind=rest`)": lambda s, r: len(r.json["Resources"]),
    "outputs, HTTP API": lambda s, r: len(s.json["Outputs"]),
    "outputs, REST API": lambda s, r: len(r.json["Outputs"]),
    "HTTP functions (`routes.HTTP_FUNCTIONS`)": lambda s, r: functions_of(s, routes.HTTP_FUNCTIONS),
    "jobs (`routes.JOBS`)": lambda s, r: functions_of(s, routes.JOBS),
    "Lambda functions (with the deploy trigger's own)": lambda s, r: len(resources(s, "AWS::Lambda::Function")),
    "functions with active tracing (`tracing=jobs`)": lambda s, r: traced(s),
    "HTTP API routes (`$default` included)": lambda s, r: len(resources(s, "AWS::ApiGatewayV2::Route")),
    "tables": lambda s, r: len(resources(s, "AWS::DynamoDB::Table")),
    "secrets": lambda s, r: len(resources(s, "AWS::SecretsManager::Secret")),
    "SQS queues (a dead-letter queue per job, the repair queue)": lambda s, r: len(resources(s, "AWS::SQS::Queue")),
    "customer-managed KMS keys": lambda s, r: len(resources(s, "AWS::KMS::Key")),
    "CloudWatch alarms": lambda s, r: len(resources(s, "AWS::CloudWatch::Alarm")),
    "metrics the alarms read (each billed)": lambda s, r: sum(
        alarm_metrics(alarm) for alarm in resources(s, "AWS::CloudWatch::Alarm").values()
    ),
    "dashboards": lambda s, r: len(resources(s, "AWS::CloudWatch::Dashboard")),
    "custom metrics the code publishes (EMF lines, not template resources)": lambda s, r: len(custom_metrics()),
    "usage stream mapping: batch size": lambda s, r: usage_stream_mapping(s)["BatchSize"],
    "usage stream mapping: batching window, seconds": lambda s, r: usage_stream_mapping(s)[
        "MaximumBatchingWindowInSeconds"
    ],
    "usage stream mapping: tumbling window, seconds": lambda s, r: usage_stream_mapping(s)["TumblingWindowInSeconds"],
    # CloudFormation's default when the property is left out is 1
    "usage stream mapping: parallelization factor": lambda s, r: usage_stream_mapping(s).get(
        "ParallelizationFactor", 1
    ),
    "cdk-nag findings acknowledged, HTTP API": lambda s, r: len(nag_findings(s)),
    "cdk-nag findings acknowledged, REST API": lambda s, r: len(nag_findings(r)),
    "smallest `accountConcurrency` that reserves (`reserveConcurrency=auto`)": lambda s, r: (
        smallest_account_that_reserves()
    ),
}


def documented_figures() -> dict[str, int]:
    rows = table("what")
    assert all(len(row) == 2 for row in rows), rows
    return {what: number(value) for what, value in rows}


def test_every_figure_of_the_page_has_a_check_and_every_check_a_figure():
    assert set(documented_figures()) == set(FIGURES)


@pytest.mark.parametrize("what", list(FIGURES))
def test_each_figure_is_the_templates(what, synth, synth_rest):
    documented = documented_figures()
    assert what in documented, f"docs/infrastructure.md, 'What the template holds', has no row {what!r}"
    assert documented[what] == FIGURES[what](synth, synth_rest), what


# --- reserved concurrency -------------------------------------------------------------------


def reserved(synthesized) -> dict[str, int]:
    functions = resources(synthesized, "AWS::Lambda::Function")
    return {
        name: functions[function_id]["Properties"]["ReservedConcurrentExecutions"]
        for name, function_id in synthesized.function_ids().items()
        if "ReservedConcurrentExecutions" in functions[function_id]["Properties"]
    }


def test_the_reserved_concurrency_table_is_what_each_synth_reserves(synth, synth_options):
    """Its columns: what an account of ``synth_options``' limit reserves, and what a plain
    synth (no ``accountConcurrency``) reserves."""
    columns = header("function", RESERVED_WITH_LIMIT)
    assert columns[2] == "reserved by a plain synth", columns
    documented_with_limit, documented_plain = {}, {}
    for row in table("function", RESERVED_WITH_LIMIT):
        (name,) = re.fullmatch(r"`([a-z_]+)`", row[0]).groups()
        documented_with_limit[name] = number(row[1])
        assert re.fullmatch(r"none|[\d,]+", row[2]), row
        if row[2] != "none":
            documented_plain[name] = number(row[2])
    assert documented_with_limit == reserved(synth_options)
    assert documented_plain == reserved(synth)


# --- the usage stream mapping's settings table -----------------------------------------------


def test_the_stream_settings_table_is_the_mapping(synth):
    mapping = usage_stream_mapping(synth)
    values = {row[0]: row[1] for row in table("setting")}
    batch, window = re.fullmatch(r"([\d,]+) / (\d+) s", values["batch size / batching window"]).groups()
    assert (number(batch), number(window)) == (mapping["BatchSize"], mapping["MaximumBatchingWindowInSeconds"])
    assert number(values["tumbling window"].removesuffix(" s")) == mapping["TumblingWindowInSeconds"]
    assert number(values["parallelization factor"]) == mapping.get("ParallelizationFactor", 1)
    assert values["starting position"] == f"`{mapping['StartingPosition']}`"
    assert values["bisect on error"] == ("on" if mapping["BisectBatchOnFunctionError"] else "off")
    assert "MaximumRetryAttempts" not in mapping and "MaximumRecordAgeInSeconds" not in mapping  # "none"


# --- cdk-nag --------------------------------------------------------------------------------

NAG_CELL = re.compile(r"(?P<row>[A-Z]+\d+(?: `Resource::\*`| Bedrock ARNs)?) \((?P<http>\d+) / (?P<rest>\d+)\)")


def test_the_cdk_nag_table_counts_each_rules_findings(synth, synth_rest):
    documented = {}
    for row in table("rule (findings: HTTP API / REST API)"):
        match = NAG_CELL.fullmatch(row[0])
        assert match, f"a cdk-nag row without its counts: {row[0]!r}"
        documented[match["row"]] = (int(match["http"]), int(match["rest"]))
    counted: dict[str, list[int]] = {}
    for column, synthesized in enumerate((synth, synth_rest)):
        for finding in nag_findings(synthesized):
            counted.setdefault(nag_row(finding["ruleName"]), [0, 0])[column] += 1
    assert set(counted) <= set(documented), "acknowledged rules the table does not list"
    assert documented == {row: tuple(counted.get(row, (0, 0))) for row in documented}


# --- numbers in the text --------------------------------------------------------------------


def phrase_checks(synth, synth_rest, synth_options) -> list[tuple[str, Callable[[], tuple]]]:
    """(pattern, what its groups must read): every match of each pattern on the page."""
    figures = {what: lambda what=what: FIGURES[what](synth, synth_rest) for what in FIGURES}
    table_alarms = [
        a for a in resources(synth, "AWS::CloudWatch::Alarm").values() if "-table-" in a["Properties"]["AlarmName"]
    ]
    reserved_sum = sum(reserved(synth_options).values())
    return [
        (r"(\d[\d,]*) HTTP functions", lambda: (figures["HTTP functions (`routes.HTTP_FUNCTIONS`)"](),)),
        (r"(\d[\d,]*) jobs\b", lambda: (figures["jobs (`routes.JOBS`)"](),)),
        (r"(\d[\d,]*) resources\b", lambda: (figures["resources, HTTP API"](),)),
        (r"(\d[\d,]*) outputs\b", lambda: (figures["outputs, HTTP API"](),)),
        (r"\b[Aa]t factor (\d+)", lambda: (figures["usage stream mapping: parallelization factor"](),)),
        (r"\b[Tt]he factor is (\d+)", lambda: (figures["usage stream mapping: parallelization factor"](),)),
        (r"(\d+) metrics for the six tables", lambda: (sum(alarm_metrics(a) for a in table_alarms),)),
        (
            r"(\d+) for all (\d+) alarms",
            lambda: (figures["metrics the alarms read (each billed)"](), figures["CloudWatch alarms"]()),
        ),
        (r"(\d+) findings behind the HTTP API", lambda: (figures["cdk-nag findings acknowledged, HTTP API"](),)),
        (r"(\d+) findings behind the REST API", lambda: (figures["cdk-nag findings acknowledged, REST API"](),)),
        (
            r"(\d+) custom metrics\b",
            lambda: (figures["custom metrics the code publishes (EMF lines, not template resources)"](),),
        ),
        (r"the unreserved ([\d,]+)", lambda: (number(OPTIONS["accountConcurrency"]) - reserved_sum,)),
        (r"`accountConcurrency` is ([\d,]+) or more", lambda: (smallest_account_that_reserves(),)),
    ]


def test_the_counts_in_the_text_are_the_templates(synth, synth_rest, synth_options):
    text = page_text()
    for pattern, expected in phrase_checks(synth, synth_rest, synth_options):
        found = re.findall(pattern, text)
        assert found, f"docs/infrastructure.md no longer says {pattern!r}: move the check with the sentence"
        for groups in found:
            groups = groups if isinstance(groups, tuple) else (groups,)
            assert tuple(number(g) for g in groups) == expected(), (pattern, groups)


# --- the monthly bill of docs/performance.md --------------------------------------------------

PERFORMANCE = REPO_ROOT / "docs" / "performance.md"
# The bill's lines priced per count of something the template (or the code) holds: the line,
# and the figures row of docs/infrastructure.md its count is.
BILL_COUNTS = {
    "CloudWatch alarms": "metrics the alarms read (each billed)",
    "custom metrics": "custom metrics the code publishes (EMF lines, not template resources)",
    "dashboard": "dashboards",
    "Secrets Manager": "secrets",
    "KMS": "customer-managed KMS keys",
}


def bill() -> dict[str, list[str]]:
    lines = PERFORMANCE.read_text().splitlines()
    (start,) = [i for i, line in enumerate(lines) if line.startswith("| line | source: count × AWS price |")]
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        row = cells(line)
        rows[row[0]] = row[1:]
    return rows


def dollars(cell: str) -> float:
    return float(cell.strip("*").removeprefix("$").replace(",", ""))


def test_the_bills_counts_of_the_template_are_the_templates(synth, synth_rest):
    """Each such line's source cell starts with its count (KMS: "no customer-managed key
    (template: 0)")."""
    rows = bill()
    for line, what in BILL_COUNTS.items():
        source = rows[line][0]
        found = re.match(r"(\d+) ", source) or re.search(r"\(template: (\d+)\)", source)
        assert found, (line, source)
        assert int(found.group(1)) == FIGURES[what](synth, synth_rest), (line, source)


def test_the_bills_totals_are_the_sum_of_its_lines():
    rows = bill()
    total = rows.pop("**total**")
    for column in (1, 2):
        assert round(sum(dollars(row[column]) for row in rows.values()), 2) == dollars(total[column])
