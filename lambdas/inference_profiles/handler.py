"""POST /api/v1/orgs/{org_id}/apps/{app_id}/inference-profiles (Bearer): register a
Bedrock inference profile under a label of the app (201; 409 when the label is taken)."""

from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Body

from price_keeper import routes
from price_keeper.bodies import InferenceProfileRequest
from price_keeper.domain import orgs, profiles
from price_keeper.http import replies
from price_keeper.http.api import Router, build_app, documented, lambda_entry, reply

router = Router()


@router.post(
    routes.rule(routes.INFERENCE_PROFILES), responses=documented(201, replies.ProfileRegistered, "Profile registered")
)
def register_profile(org_id: str, app_id: str, body: Annotated[InferenceProfileRequest, Body()]):
    config = orgs.effective_config(org_id, app_id)
    registered = profiles.register(config, body.profile_label, body.inference_profile_arn, body.description)
    return reply(201, replies.ProfileRegistered, registered)


app = build_app(router)
lambda_handler = lambda_entry(app)
