"""GET /api/v1/orgs/{org_id}/reports/spend?from=&to=[&app_id=][&format=csv] (org token, or an
app token with its own app_id): per day x app x label totals, JSON rows or CSV."""

from typing import Annotated, Literal

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Query

from price_keeper import routes
from price_keeper.domain import reports
from price_keeper.http import replies
from price_keeper.http.api import Router, build_app, lambda_entry, reply

router = Router()


@router.get(
    routes.rule(routes.SPEND_REPORT),
    responses={
        200: {
            "description": "Rows per day x app x label (JSON, or CSV with format=csv)",
            "content": {"application/json": {"model": replies.SpendReport}, "text/csv": {"schema": {"type": "string"}}},
        }
    },
)
def spend_report(
    org_id: str,
    from_: Annotated[str | None, Query(alias="from", description="First org-local day, YYYY-MM-DD")] = None,
    to: Annotated[str | None, Query(description="Last org-local day, YYYY-MM-DD (at most 92 days in all)")] = None,
    app_id: Annotated[str | None, Query(description="Only this app; required with an app token")] = None,
    format: Annotated[Literal["json", "csv"], Query()] = "json",
):
    rows = reports.spend_rows(org_id, from_, to, app_id)
    if format == "csv":
        filename = f"spend-{org_id}-{from_}-{to}.csv"
        return Response(
            status_code=200,
            content_type="text/csv; charset=utf-8",
            body=reports.to_csv(rows),
            headers={"Content-Disposition": f'attachment; filename="{filename}"'},
        )
    return reply(200, replies.SpendReport, {"rows": rows})


app = build_app(router)
lambda_handler = lambda_entry(app)
