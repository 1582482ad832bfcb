"""Issue 42: a tab's panels speak its language. Each view a tab shows (its first, a replay's,
a watched request's) is given the tab's language; the switch redraws them in the new one."""
from __future__ import annotations

from app.page.tabs import Tab, set_lang
from tests.trace_views import view


def test_every_view_a_tab_shows_speaks_the_tabs_language():
    set_lang("tab-zh", "zh_CN")
    tab = Tab(view())
    assert tab.view.lang == "en"  # no session yet: English
    tab.key = "tab-zh"  # Sessions.put gives the key
    assert tab.view.lang == "zh_CN" and "<div class=\"tt-title\">嵌入</div>" in tab.view.render("embedding")
    tab.view = view()  # a replay or a watched request: another view
    assert tab.view.lang == "zh_CN" and "形状" in tab.view.render("embedding")
    set_lang("tab-en", "en")
    other = Tab(view(), key="tab-en")
    assert other.view.lang == "en" and "shape <b>" in other.view.render("embedding")
