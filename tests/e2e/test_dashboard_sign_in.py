"""The dashboard in Chromium now that the API asks for a token on loopback too (issue 37): the sign-in link
`agentpost up` prints signs a browser in with a cookie, without it the page asks for the token, and a page of
another site cannot use the cookie. Against ``agentpost run web`` as its own process."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.settings.api_token import cookie_name
from tests.e2e.test_tinyoffice_browser import office_origin
from tests.web_support import (
    CHROMIUM,
    CHROMIUM_ARGS,
    free_port,
    home_token,
    make_home,
    need_chromium,
    runtime_for,
    sign_in,
    web_process,
)

pytestmark = pytest.mark.e2e

#: What a foreign page tries with the operator's signed-in browser: a request the browser sends without a
#: preflight (a "simple" one, like a form post), with credentials, and one with a JSON body.
FORGE = """async ([api]) => {
  const out = [];
  try {
    const r = await fetch(api + "/api/message", {method: "POST", mode: "no-cors", credentials: "include",
      headers: {"Content-Type": "text/plain"}, body: JSON.stringify({message: "forged"})});
    out.push(r.type);
  } catch (e) { out.push("blocked"); }
  try {
    const r = await fetch(api + "/api/settings", {method: "PUT", credentials: "include",
      headers: {"Content-Type": "application/json"}, body: JSON.stringify({processor: {sandbox: "none"}})});
    out.push(String(r.status));
  } catch (e) { out.push("blocked"); }
  return out;
}"""


def test_the_sign_in_link_opens_the_dashboard_and_nothing_else_does(tmp_path: Path) -> None:
    need_chromium()
    from playwright.sync_api import expect, sync_playwright

    home = make_home(tmp_path)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with office_origin() as office, web_process(home, port), sync_playwright() as pw:
        token = home_token(home)
        settings_before = (home / "settings.toml").read_text()
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            # Without the link: the page asks for the token and shows nothing of the queue.
            stranger = browser.new_page()
            stranger.goto(url + "/")
            expect(stranger.locator("#token-form")).to_be_visible()
            expect(stranger.locator("#token-form")).to_contain_text("agentpost token")
            expect(stranger.locator("#agents-table tr[data-agent='alpha']")).to_have_count(0)
            # A wrong link says so and signs nothing in.
            stranger.goto(url + "/signin#not-the-token")
            expect(stranger.locator("#signin-error")).to_contain_text("wrong token")
            assert stranger.context.cookies() == []

            # The link: signed in, the token gone from the address bar, the dashboard live.
            context = browser.new_context()
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            sign_in(page, url, token=token)
            assert page.url == url + "/"
            expect(page.locator("#conn")).to_have_text("live")
            expect(page.locator("#token-form")).to_be_hidden()
            page.click(".tab[data-view='agents']")
            expect(page.locator("#agents-table tr[data-agent='alpha']")).to_be_visible()
            (cookie,) = context.cookies()
            assert cookie["name"] == cookie_name(port) and token not in cookie["value"]
            assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
            assert page.evaluate("document.cookie") == ""  # scripts cannot read it
            page.go_back()  # the sign-in entry kept no token in the history
            assert token not in page.url
            page.go_forward()

            # A page of another site in the same signed-in browser cannot use the cookie.
            foreign = context.new_page()
            foreign.goto(office + "/")
            forged = foreign.evaluate(FORGE, [url])
            assert forged[0] in ("opaque", "blocked") and forged[1] == "blocked", forged
            assert errors == []
        finally:
            browser.close()
    rt = runtime_for(home)
    with rt:
        assert rt.db.read_scalar("SELECT COUNT(*) FROM messages WHERE message LIKE '%forged%'") == 0
    assert (home / "settings.toml").read_text() == settings_before
