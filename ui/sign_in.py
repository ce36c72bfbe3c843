"""Owlet's sign-in page, served with ``--auth`` in place of Gradio's default login page.

Gradio's own page showed its generic form and, for a wrong password, "Incorrect Credentials". This one says what
the site is, asks for a name and a password, and answers in sentences: a wrong pair, too many attempts (the page's
per-address budget, ``ui.edge.logins.LoginAttempts``, gives the wait), or a page that could not be reached. It posts
to Gradio's own ``/login`` route, which checks the pair and sets the login cookie; a success reloads the page, which
Gradio then serves. Only the front page is replaced, and only for a browser without a login; everything else stays
as ``ui.edge.logins.LoginRequired`` leaves it.
"""
from __future__ import annotations

import html
import json
from string import Template

from starlette.responses import HTMLResponse

from ui.edge.logins import signed_in_login
from ui.page_style import OWL

MESSAGE = "Sign in to chat about your pictures."
WRONG_PAIR = "That name and password do not match an account here. Check them and try again."
NOT_REACHED = "The page could not be reached. Check your connection, then try again."

_PAGE = Template("""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Sign in · Owlet</title>
<style>
  body { margin: 0; min-height: 100vh; display: flex; align-items: center; justify-content: center;
         font: 16px/1.4 system-ui, sans-serif; background: #f6f6f4; color: #222; }
  main { box-sizing: border-box; width: min(22em, 92vw); background: #fff; border: 1px solid #ddd;
         border-radius: 10px; padding: 1.6em; }
  h1 { font-size: 1.35em; margin: 0 0 0.3em; display: flex; align-items: center; gap: 0.4em; }
  h1 span { width: 1.4em; height: 1.4em; background: $owl center / contain no-repeat; }
  p { margin: 0 0 1em; color: #555; }
  label { display: block; margin: 0.7em 0 0.25em; font-weight: 600; }
  input { width: 100%; box-sizing: border-box; padding: 0.55em; font: inherit; border: 1px solid #bbb;
          border-radius: 6px; }
  button { margin-top: 1.2em; width: 100%; padding: 0.6em; font: inherit; font-weight: 600; border: 0;
           border-radius: 6px; background: #8a5a2b; color: #fff; cursor: pointer; }
  button:disabled { opacity: 0.6; }
  #owlet-sign-in-said { margin: 1em 0 0; color: #a02020; min-height: 1.4em; }
  @media (prefers-color-scheme: dark) {
    body { background: #1b1b1b; color: #eee; } main { background: #262626; border-color: #444; }
    p { color: #bbb; } input { background: #1b1b1b; color: #eee; border-color: #555; }
    #owlet-sign-in-said { color: #ff8a80; }
  }
</style></head>
<body><main>
<h1><span role="img" aria-label="Owl"></span>Owlet — chat about an image</h1>
<p>$message</p>
<form id="owlet-sign-in" method="post" action="login">
  <label for="owlet-name">Name</label>
  <input id="owlet-name" name="username" autocomplete="username" autocapitalize="off" required autofocus>
  <label for="owlet-password">Password</label>
  <input id="owlet-password" name="password" type="password" autocomplete="current-password" required>
  <button type="submit">Sign in</button>
  <p id="owlet-sign-in-said" role="alert" aria-live="polite"></p>
</form>
</main>
<script>
(() => {
  const form = document.getElementById("owlet-sign-in"), said = document.getElementById("owlet-sign-in-said");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = form.querySelector("button");
    button.disabled = true;
    said.textContent = "";
    try {
      const response = await fetch("login", {method: "POST", body: new URLSearchParams(new FormData(form)),
                                             credentials: "same-origin"});
      if (response.ok) { location.reload(); return; }
      said.textContent = response.status === 400 ? $wrong
        : response.status === 429 ? await response.text()
        : "Signing in did not work (HTTP " + response.status + "). Try again in a moment.";
    } catch (error) {
      said.textContent = $unreachable;
    }
    button.disabled = false;
  });
})();
</script>
</body></html>
""")


def sign_in_page(message: str) -> str:
    """The page's HTML; ``message`` is the line under the title."""
    return _PAGE.substitute(owl=OWL, message=html.escape(message), wrong=json.dumps(WRONG_PAIR),
                            unreachable=json.dumps(NOT_REACHED))


class SignInPage:
    """ASGI middleware for ``--auth``: the front page of a browser without a login is Owlet's sign-in page."""

    def __init__(self, app, message: str = MESSAGE):
        self.app = app
        self.page = sign_in_page(message).encode()

    async def __call__(self, scope, receive, send):
        if (scope["type"] != "http" or scope.get("method") not in ("GET", "HEAD") or scope.get("path") != "/"
                or signed_in_login(scope) is not None):
            return await self.app(scope, receive, send)
        response = HTMLResponse(self.page, headers={"Cache-Control": "no-store"})
        await response(scope, receive, send)
