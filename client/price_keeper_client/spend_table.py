"""The ``price-keeper spend`` table: spend vs quota per label, with a bar per row."""

from __future__ import annotations

from .models import DailySpend

BAR_WIDTH = 20


def usd(micros: int) -> str:
    """Micro-USD as dollars: cents from $1 up, four decimals below so small spend stays visible."""
    dollars = micros / 1_000_000
    return f"${dollars:,.2f}" if micros == 0 or abs(dollars) >= 1 else f"${dollars:.4f}"


def bar(pct: float, width: int = BAR_WIDTH) -> str:
    filled = min(width, max(0, round(pct / 100 * width)))
    return "[" + "#" * filled + "." * (width - filled) + "]" + ("!" if pct > 100 else " ")


def render(spend: DailySpend) -> str:
    scope = f"org {spend.org_id}" + (f" · app {spend.app_id}" if spend.app_id else "")
    lines = [
        f"Spend on {spend.date}" + (f" ({spend.timezone})" if spend.timezone else "") + f" · {scope}",
        f"Mode {spend.mode} · active model {spend.current_active_model or '-'}"
        f" · sticky fallback {'on' if spend.sticky_fallback_active else 'off'}",
        "",
    ]
    rows = [
        (
            label.label,
            usd(label.cost_usd_micros),
            usd(label.quota_usd_micros),
            bar(label.quota_pct),
            f"{label.quota_pct:.1f}%",
            str(label.requests),
            label.quota_status,
        )
        for label in spend.labels
    ]
    rows.append(
        (
            "TOTAL",
            usd(spend.total_cost_usd_micros),
            usd(spend.total_quota_usd_micros),
            "",
            f"{spend.total_quota_pct:.1f}%",
            str(spend.total_requests),
            "",
        )
    )
    header = ("LABEL", "SPEND", "QUOTA", "USED", "", "REQUESTS", "STATUS")
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    right_aligned = {1, 2, 4, 5}
    for row in (header, *rows):
        cells = [cell.rjust(widths[i]) if i in right_aligned else cell.ljust(widths[i]) for i, cell in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
    if not spend.labels:
        lines.append("(no labels configured)")
    return "\n".join(lines)
