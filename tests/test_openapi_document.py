"""The served OpenAPI document is valid OpenAPI, declares the replies of the main endpoints
from the models the handlers answer through, and a client generated from it has typed
replies that read the service's real answers."""

import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from openapi_spec_validator import validate

from tests.usage_support import new_tenant, usage_body

MAIN_REPLIES = {
    ("post", "/api/v1/orgs/{org_id}/apps/{app_id}/usage"): ("202", "UsageReceipt"),
    ("post", "/api/v1/orgs/{org_id}/apps/{app_id}/usage/batch"): ("207", "BatchReceipt"),
    ("get", "/api/v1/orgs/{org_id}/apps/{app_id}/model-selection"): ("200", "ModelSelection"),
    ("get", "/api/v1/orgs/{org_id}/aggregates/today"): ("200", "Aggregates"),
    ("get", "/api/v1/orgs/{org_id}/apps/{app_id}/aggregates/{date}"): ("200", "Aggregates"),
    ("post", "/auth/token"): ("200", "Tokens"),
    ("post", "/auth/refresh"): ("200", "RefreshedToken"),
}


@pytest.fixture
def document(api) -> dict:
    reply = api.get("/openapi.json")
    assert reply.status == 200, reply
    return reply.json()


def test_the_served_document_is_valid_openapi(document):
    validate(document)  # raises on any violation, e.g. a $ref to a schema the document lacks


def test_the_main_endpoints_declare_their_reply_schemas(document):
    schemas = document["components"]["schemas"]
    for (method, path), (status, name) in MAIN_REPLIES.items():
        content = document["paths"][path][method]["responses"][status]["content"]["application/json"]
        assert content["schema"] == {"$ref": f"#/components/schemas/{name}"}, (method, path)
        assert schemas[name]["properties"], name


def test_a_generated_client_has_typed_replies(document, api, tmp_path):
    generator = shutil.which("openapi-python-client", path=str(Path(sys.executable).parent))
    spec = tmp_path / "openapi.json"
    spec.write_text(json.dumps(document))
    subprocess.run(
        [generator, "generate", "--path", str(spec), "--output-path", str(tmp_path / "generated"), "--meta", "none"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    sys.path.insert(0, str(tmp_path))
    try:
        models = importlib.import_module("generated.models")
        tenant = new_tenant()
        answer = api.post(f"{tenant.app_path}/usage", usage_body(), token=tenant.token)
        assert answer.status == 202, answer
        receipt = models.UsageReceipt.from_dict(answer.json())
        assert isinstance(receipt.processing, models.Processing)
        assert receipt.processing.cost_usd_micros == answer.json()["processing"]["cost_usd_micros"] == 3760
        assert receipt.daily_total.label == "premium" and receipt.duplicate is False
        selection = api.get(f"{tenant.app_path}/model-selection", token=tenant.token)
        chosen = models.ModelSelection.from_dict(selection.json())
        assert chosen.recommended_model.label == selection.json()["recommended_model"]["label"]
        assert isinstance(chosen.quota_status.total, models.TotalStatus)
    finally:
        sys.path.remove(str(tmp_path))
        for name in [name for name in sys.modules if name == "generated" or name.startswith("generated.")]:
            del sys.modules[name]
