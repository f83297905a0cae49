// agentpost dashboard: plain JavaScript, no build step, no CDN. Everything goes through the same /api the
// scripts use; the live feed is the loss-free SSE stream (the browser resends Last-Event-ID on reconnect).
"use strict";

const state = {
  token: sessionStorage.getItem("agentpost.token") || "",
  conversation: sessionStorage.getItem("agentpost.conversation") || "",
  shownReplies: new Set(),
  source: null,
  refreshTimer: null,
};
if (!state.conversation) {
  const bytes = new Uint8Array(8);
  crypto.getRandomValues(bytes);
  state.conversation = "web-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  sessionStorage.setItem("agentpost.conversation", state.conversation);
}

const $ = (sel) => document.querySelector(sel);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c ?? "")));
  return node;
}

class ApiError extends Error {}

async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  if (state.token) headers.Authorization = "Bearer " + state.token;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const res = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  let data = null;
  try { data = await res.json(); } catch (_) { data = null; }
  if (res.status === 401) {
    $("#token-form").hidden = false;
    throw new ApiError("an API token is required");
  }
  if (!res.ok) throw new ApiError((data && data.error) || res.status + " " + res.statusText);
  return data;
}

function ago(ms) {
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  return s < 60 ? s + "s" : Math.round(s / 60) + "m";
}

// -- views ---------------------------------------------------------------------------------------------
async function refreshStatus() {
  const s = await api("GET", "/api/queue/status");
  $("#st-pending").textContent = s.pending;
  $("#st-processing").textContent = s.processing;
  $("#st-dead").textContent = s.dead;
  $("#st-responses").textContent = (s.responses_pending || 0) + (s.responses_delivering || 0);
}

async function refreshAgents() {
  const rows = await api("GET", "/api/queue/agents");
  const body = $("#agent-depths tbody");
  body.replaceChildren(...rows.map((r) =>
    el("tr", { "data-agent": r.agent }, el("td", {}, r.agent), el("td", { class: "pending" }, r.pending),
      el("td", { class: "processing" }, r.processing))));
}

async function refreshProcessing() {
  const rows = await api("GET", "/api/queue/processing");
  $("#processing tbody").replaceChildren(...rows.map((m) =>
    el("tr", {}, el("td", { title: m.message }, m.messageId), el("td", {}, m.agent), el("td", {}, m.channel),
      el("td", {}, ago(m.updatedAt)))));
}

async function refreshDead() {
  const rows = await api("GET", "/api/queue/dead");
  $("#dead-table tbody").replaceChildren(...rows.map((m) => {
    const retry = el("button", { class: "retry", type: "button", "data-id": m.message_id }, "Retry");
    const del = el("button", { class: "delete danger", type: "button", "data-id": m.message_id }, "Delete");
    retry.addEventListener("click", () => deadAction("POST", `/api/queue/dead/${m.message_id}/retry`));
    del.addEventListener("click", () => {
      if (confirm(`Delete dead letter ${m.message_id} for good?`)) deadAction("DELETE", `/api/queue/dead/${m.message_id}`);
    });
    return el("tr", { "data-id": m.message_id }, el("td", { title: m.message }, m.message_id), el("td", {}, m.agent),
      el("td", {}, m.last_error || ""), el("td", {}, retry, " ", del));
  }));
}

async function deadAction(method, path) {
  const box = $("#dead-error");
  box.hidden = true;
  try {
    await api(method, path);
  } catch (e) {
    box.textContent = e.message;
    box.hidden = false;
  }
  await refreshAll();
}

async function refreshAll() {
  try {
    await Promise.all([refreshStatus(), refreshAgents(), refreshProcessing(), refreshDead(), pullReplies()]);
  } catch (e) {
    if (!(e instanceof ApiError)) console.error(e);
  }
}

function scheduleRefresh() {
  if (state.refreshTimer) return;
  state.refreshTimer = setTimeout(() => { state.refreshTimer = null; refreshAll(); }, 250);
}

// -- chat ----------------------------------------------------------------------------------------------
function chatLine(text, cls, id) {
  const log = $("#chat-log");
  const line = el("div", { class: "chat-msg " + cls }, text);
  if (id) line.setAttribute("data-id", id);
  log.append(line);
  log.scrollTop = log.scrollHeight;
}

async function sendChat(ev) {
  ev.preventDefault();
  const input = $("#chat-input");
  const text = input.value.trim();
  if (!text) return;
  const err = $("#chat-error");
  err.hidden = true;
  const agent = $("#chat-agent").value || undefined;
  try {
    const res = await api("POST", "/api/message",
      { message: text, agent, channel: "web", sender: "web", conversation: state.conversation });
    chatLine(text, "chat-mine", res.messageId);
    input.value = "";
  } catch (e) {
    err.textContent = e.message;
    err.hidden = false;
  }
}

// The web channel's replies: show each once, then acknowledge it so it counts as delivered.
async function pullReplies() {
  const rows = await api("GET",
    `/api/responses/pending?channel=web&conversation=${encodeURIComponent(state.conversation)}`);
  for (const r of rows) {
    if (!state.shownReplies.has(r.id)) {
      state.shownReplies.add(r.id);
      chatLine(`${r.agent ? r.agent + ": " : ""}${r.message}`, "chat-reply", String(r.id));
    }
    await api("POST", `/api/responses/${r.id}/ack`);
  }
}

async function loadAgents() {
  const agents = await api("GET", "/api/agents");
  const teams = await api("GET", "/api/teams");
  const select = $("#chat-agent");
  select.replaceChildren(
    ...Object.entries(agents).map(([id, a]) => el("option", { value: id, selected: a.default }, a.name === id ? id : `${a.name} (${id})`)),
    ...Object.keys(teams).map((id) => el("option", { value: id }, `team ${id}`)));
}

// -- live events ---------------------------------------------------------------------------------------
const EVENT_NAMES = [
  "message:incoming", "agent:invoke", "agent:progress", "agent:response", "agent:mention", "message:done",
  "agent_routed", "message_claimed", "message_completed", "message_failed", "message_dead", "message_retried",
  "message_deleted", "message_restored", "message_interrupted", "response_acked", "response_failed",
  "response_unserved", "chain_handoff_refused", "chain_handoff_ignored", "chain_budget_spent", "chatroom_post",
  "processor_start", "processor_stop", "scheduler_start", "pairing_requested", "pairing_approved",
  "pairing_revoked", "stop_requested", "agent_reset", "agent_resumed", "lease_lost", "run_stopped",
  "dead_archived", "dead_notice", "delivery_retry", "rate_limit", "model_fallback", "heartbeat_silent",
  "messages_dropped", "send_file_refused", "undelivered_notice", "media_failed",
];
function connectEvents() {
  if (state.source) state.source.close();
  const url = "/api/events/stream" + (state.token ? "?token=" + encodeURIComponent(state.token) : "");
  const source = new EventSource(url);
  state.source = source;
  const conn = $("#conn");
  source.onopen = () => { conn.textContent = "live"; conn.className = "conn on"; };
  source.onerror = () => { conn.textContent = "reconnecting"; conn.className = "conn off"; };
  const onEvent = (msg) => {
    let ev;
    try { ev = JSON.parse(msg.data); } catch (_) { return; }
    const feed = $("#event-feed");
    feed.prepend(el("li", { "data-cursor": ev.cursor },
      `#${ev.cursor} ${new Date(ev.createdAt).toLocaleTimeString()} ${ev.event || ev.type} ${ev.messageId || ""}`));
    while (feed.children.length > 200) feed.lastChild.remove();
    scheduleRefresh();
  };
  // Every event is named (TinyAGI's names where it has one, else ours): listen to each by name.
  source.onmessage = onEvent;
  for (const name of EVENT_NAMES) source.addEventListener(name, onEvent);
  source.addEventListener("reset", (msg) => {
    const data = JSON.parse(msg.data);
    $("#event-feed").prepend(el("li", { class: "error" }, `events before #${data.retainedAfter} were cleaned up`));
    scheduleRefresh();
  });
}

async function start() {
  $("#chat-form").addEventListener("submit", sendChat);
  $("#token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    state.token = $("#token-input").value.trim();
    sessionStorage.setItem("agentpost.token", state.token);
    $("#token-form").hidden = true;
    start2();
  });
  await start2();
}

async function start2() {
  try {
    await loadAgents();
  } catch (e) {
    if (e instanceof ApiError) return; // the token form is showing
    throw e;
  }
  connectEvents();
  await refreshAll();
  // A slow full refresh in case a change signal was missed (the stream itself never misses events).
  setInterval(refreshAll, 5000);
}

document.addEventListener("DOMContentLoaded", start);
