// The sign-in link is /signin#<token>: the fragment never leaves the browser, so the token reaches no log.
// Post it once for the sign-in cookie, wipe it from the address bar and history, then open the dashboard.
"use strict";

async function signIn() {
  const token = decodeURIComponent(location.hash.replace(/^#/, ""));
  history.replaceState(null, "", "/signin");
  const status = document.getElementById("signin-status");
  const error = document.getElementById("signin-error");
  const fail = (text) => {
    status.textContent = "Not signed in.";
    error.textContent = text;
    error.hidden = false;
  };
  if (!token) {
    fail("This link holds no token. Run `agentpost token` on the server for a sign-in link.");
    return;
  }
  let res;
  try {
    res = await fetch("/signin", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ token }),
      credentials: "same-origin",
    });
  } catch (e) {
    fail("The server did not answer (" + e.message + "). Is agentpost running?");
    return;
  }
  if (res.ok) {
    location.replace("/");
    return;
  }
  let said = "";
  try { said = (await res.json()).error || ""; } catch (_) { said = ""; }
  fail(said || "The server refused the sign-in (" + res.status + ").");
}

document.addEventListener("DOMContentLoaded", signIn);
