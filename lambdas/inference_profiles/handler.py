"""POST /api/v1/orgs/{org_id}/apps/{app_id}/inference-profiles (Bearer): register a
Bedrock inference profile under a label of the app (201; 409 when the label is taken)."""

from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Body

from price_keeper import routes
from price_keeper.domain import orgs, profiles
from price_keeper.domain.models import InferenceProfileRequest
from price_keeper.http.api import Router, build_app, json_response, lambda_entry

router = Router()


@router.post(routes.rule(routes.INFERENCE_PROFILES), responses={201: {"description": "Profile registered"}})
def register_profile(org_id: str, app_id: str, body: Annotated[InferenceProfileRequest, Body()]):
    config = orgs.effective_config(org_id, app_id)
    return json_response(
        201, profiles.register(config, body.profile_label, body.inference_profile_arn, body.description)
    )


app = build_app(router)
lambda_handler = lambda_entry(app)
