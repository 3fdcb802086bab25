"""``{% page_section "memory" %}...{% end_page_section %}``: one foldable section of the run,
compare and study pages (issue 34: pages as walls), a ``<details>`` titled and opened as the
series contract's SECTIONS say. static/js/sections.js remembers each user's folding."""

from __future__ import annotations

from typing import Any

from django import template
from django.template.base import FilterExpression, NodeList, Parser, Token
from django.utils.html import format_html

from dashboard.experiments.metrics.series_contract import CHART_SECTIONS, SECTIONS

register = template.Library()

_BY_ID = {section["id"]: section for section in SECTIONS}


class PageSectionNode(template.Node):
    def __init__(self, section: FilterExpression, nodelist: NodeList) -> None:
        self.section = section
        self.nodelist = nodelist

    def render(self, context: Any) -> str:
        section = _BY_ID[self.section.resolve(context)]
        head = format_html(
            '<details class="page-section" id="section-{0}" data-section="{0}"{1}>'
            '<summary class="section-head"><h2>{2}</h2></summary><div class="section-body">',
            section["id"],
            " open" if section["open"] else "",
            section["title"],
        )
        return head + self.nodelist.render(context) + "</div></details>"


@register.tag
def page_section(parser: Parser, token: Token) -> PageSectionNode:
    """A section by its id in SECTIONS (an unknown id fails when the page renders)."""
    bits = token.split_contents()
    if len(bits) != 2:
        raise template.TemplateSyntaxError("page_section takes one section id")
    nodelist = parser.parse(("end_page_section",))
    parser.delete_first_token()
    return PageSectionNode(parser.compile_filter(bits[1]), nodelist)


@register.simple_tag
def chart_sections() -> tuple[str, ...]:
    """The ids of the sections that hold charts, in page order (compare and study pages)."""
    return CHART_SECTIONS
