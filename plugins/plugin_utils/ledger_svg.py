# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ledger as a picture: one stacked bar per device, terms in a fixed colour order, the
capacity line and the free floor marked. Plain SVG text, no dependencies."""

from __future__ import annotations

from html import escape

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.ledger import BudgetResult
from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import GIB

PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"]
BAR_WIDTH = 90
GAP = 60
HEIGHT = 360
TOP = 40
LEFT = 70


def render_svg(result: BudgetResult, title: str = "") -> str:
    names: list[str] = []
    for device in result.devices:
        for term in device.terms:
            if term.name not in names:
                names.append(term.name)
    colours = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}
    scale_max = max(max(d.capacity, d.used) for d in result.devices)
    width = LEFT + len(result.devices) * (BAR_WIDTH + GAP) + 200
    total_height = TOP + HEIGHT + 60

    def y(value: float) -> float:
        return TOP + HEIGHT - HEIGHT * value / scale_max

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{total_height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{total_height}" fill="white"/>',
        f'<text x="{LEFT}" y="20" font-size="14" font-weight="bold">'
        f"{escape(title or f'{result.runtime} ledger')} - fits: {'yes' if result.fits else 'NO'}</text>",
        f'<line x1="{LEFT}" y1="{TOP + HEIGHT}" x2="{width - 200}" y2="{TOP + HEIGHT}" stroke="black"/>',
    ]
    for index, device in enumerate(result.devices):
        x = LEFT + GAP / 2 + index * (BAR_WIDTH + GAP)
        running = 0
        for term in device.terms:
            top, bottom = y(running + term.bytes), y(running)
            parts.append(
                f'<rect x="{x:.1f}" y="{top:.1f}" width="{BAR_WIDTH}" height="{bottom - top:.1f}" fill="{colours[term.name]}" stroke="white">'
                f"<title>{escape(term.name)}: {term.bytes / GIB:.2f} GiB</title></rect>"
            )
            running += term.bytes
        cap_y = y(device.capacity)
        parts.append(
            f'<line x1="{x - 8:.1f}" y1="{cap_y:.1f}" x2="{x + BAR_WIDTH + 8:.1f}" y2="{cap_y:.1f}" stroke="black" stroke-width="2" stroke-dasharray="4 2"/>'
        )
        colour = "#c00" if device.free < 0 else "black"
        parts.append(f'<text x="{x:.1f}" y="{TOP + HEIGHT + 16}">{escape(device.name)}</text>')
        parts.append(f'<text x="{x:.1f}" y="{TOP + HEIGHT + 32}" fill="{colour}">{device.used / GIB:.2f}/{device.capacity / GIB:.2f} GiB</text>')
    legend_x = width - 180
    for index, name in enumerate(names):
        legend_y = TOP + index * 20
        parts.append(f'<rect x="{legend_x}" y="{legend_y}" width="12" height="12" fill="{colours[name]}"/>')
        parts.append(f'<text x="{legend_x + 18}" y="{legend_y + 11}">{escape(name)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)
