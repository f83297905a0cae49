// agentpost dashboard: plain JavaScript, no build step, nothing fetched from elsewhere. Everything goes
// through the same /api every client uses; the live feed is the loss-free SSE stream (the browser resends
// Last-Event-ID on reconnect), and each event refreshes what is on screen.
"use strict";

const store = (() => { try { return window.localStorage; } catch (_) { return window.sessionStorage; } })();

function newChatId() {
  const bytes = new Uint8Array(8);
  crypto.getRandomValues(bytes);
  return "web-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

const state = {
  token: sessionStorage.getItem("agentpost.token") || "",
  // The web chat is remembered across reloads (this browser's own chat on the web channel).
  myChat: store.getItem("agentpost.conversation") || "",
  chat: null, // { channel, conversation } shown in the chat pane
  view: "chat",
  agents: {},
  teams: {},
  info: { manualRetryBudget: 3, maxRetries: 5, defaultAgent: "" },
  history: { items: [], more: false, status: null, before: 0 },
  chats: { rows: [], next: null, loading: false }, // the chat list: the pages loaded, the next page's address
  source: null,
  refreshTimer: null,
  acking: new Set(),
  deadOpen: new Set(),
  editing: null,
  unread: new Map(), // conversation → ids of its replies this browser received while they were not on screen
  expanded: new Set(), // long messages shown whole ("kind:id")
  previews: new Map(), // edit key → { channel, conversation, text, at }: replies being written (live previews)
  noticeTimer: null,
};
if (!state.myChat) {
  state.myChat = newChatId();
  store.setItem("agentpost.conversation", state.myChat);
}
rememberChat(state.myChat);

// The web chats started in this browser (the current one and those before "New chat"): their replies are
// delivered here whichever view is open, as a platform takes a reply even while its reader looks elsewhere.
function myChats() {
  try {
    const list = JSON.parse(store.getItem("agentpost.chats") || "[]");
    return Array.isArray(list) ? list.filter((c) => typeof c === "string") : [];
  } catch (_) { return []; }
}
function rememberChat(conversation) {
  const list = [conversation, ...myChats().filter((c) => c !== conversation)].slice(0, 50);
  store.setItem("agentpost.chats", JSON.stringify(list));
}
state.chat = { channel: "web", conversation: state.myChat };

const $ = (sel) => document.querySelector(sel);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("data-") || k.startsWith("aria-") || k === "role" || k === "for") node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

class ApiError extends Error {}

// The answer and the response itself (for its headers).
async function request(method, path, body) {
  const headers = { Accept: "application/json" };
  if (state.token) headers.Authorization = "Bearer " + state.token;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const res = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  let data = null;
  try { data = await res.json(); } catch (_) { data = null; }
  if (res.status === 401) {
    showTokenForm("That token was not accepted.");
    throw new ApiError("an API token is required");
  }
  if (!res.ok) throw new ApiError((data && data.error) || res.status + " " + res.statusText);
  return { data, res };
}

async function api(method, path, body) {
  return (await request(method, path, body)).data;
}

// The address of the next page a list answered with (its Link header, rel="next"), or null on the last page.
function nextPage(res) {
  const link = res.headers.get("Link") || "";
  const m = /<([^>]+)>\s*;\s*rel="next"/.exec(link);
  return m ? m[1] : null;
}

function showTokenForm(problem) {
  $("#token-form").hidden = false;
  const err = $("#token-error");
  err.textContent = state.token ? problem : "";
  err.hidden = !state.token;
}

function showError(sel, e) {
  const box = $(sel);
  if (!box) return;
  box.textContent = e ? (e.message || String(e)) : "";
  box.hidden = !e;
}

// -- time ----------------------------------------------------------------------------------------------
function duration(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 90) return s + " s";
  const m = Math.round(s / 60);
  return m < 120 ? m + " min" : Math.floor(m / 60) + " h " + (m % 60) + " min";
}
function ago(ms) { return ms ? duration(Date.now() - ms) + " ago" : ""; }
function clock(ms) {
  const d = new Date(ms);
  const today = new Date().toDateString() === d.toDateString();
  return today ? d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })
    : d.toLocaleString([], { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
}
function timeEl(ms) {
  return el("time", { dateTime: new Date(ms).toISOString(), title: new Date(ms).toLocaleString() }, clock(ms));
}
function agentName(id) {
  const a = state.agents[id];
  return a && a.name ? a.name : id;
}

// -- views ---------------------------------------------------------------------------------------------
// The costs view lives in usage.js (refreshUsage, refreshOverBadge); agents' questions before a tool runs in
// approvals.js (approvalsAsked, chatApprovalButtons, refreshApprovals).
const VIEWS = ["chat", "agents", "ops", "usage"];
function showView(view) {
  state.view = view;
  for (const tab of document.querySelectorAll(".tab")) tab.setAttribute("aria-pressed", String(tab.dataset.view === view));
  for (const name of VIEWS) $("#view-" + name).hidden = name !== view;
  location.hash = view === "chat" ? "" : view;
  refreshAll();
}

async function refreshStatus() {
  const s = await api("GET", "/api/queue/status");
  $("#st-pending").textContent = s.pending;
  $("#st-processing").textContent = s.processing;
  $("#st-dead").textContent = s.dead;
  $("#st-responses").textContent = (s.responses_pending || 0) + (s.responses_delivering || 0);
}

async function loadAgents() {
  const [agents, teams] = await Promise.all([api("GET", "/api/agents"), api("GET", "/api/teams")]);
  state.agents = agents;
  state.teams = teams;
  const select = $("#chat-agent");
  const chosen = select.value || store.getItem("agentpost.agent") || "";
  select.replaceChildren(
    ...Object.entries(agents).map(([id, a]) => el("option", { value: id }, a.name && a.name !== id ? `${a.name} (@${id})` : "@" + id)),
    ...Object.entries(teams).map(([id, t]) => el("option", { value: id }, `team ${t.name || id} (@${id})`)));
  const fallback = Object.entries(agents).find(([, a]) => a.default);
  select.value = (chosen && (chosen in agents || chosen in teams)) ? chosen : (fallback ? fallback[0] : "");
}

// -- conversations -------------------------------------------------------------------------------------
function chatLabel(c) {
  if (c.channel === "web") return c.conversation === state.myChat ? "Your chat (this browser)" : "Web chat";
  return `${c.sender || c.senderId || c.conversation} on ${c.channel}`;
}
// A one-line preview: the text as the Markdown renderer reads it, marks dropped (an underscore inside a word,
// as in "tg_123_abc", is not a mark and stays). A <template> parses without running or fetching anything.
function plain(text) {
  const t = document.createElement("template");
  t.innerHTML = window.renderMarkdown(text.slice(0, 600)).replace(/<br>|<\/(p|li|h\d|pre|blockquote)>/g, "$& ");
  for (const label of t.content.querySelectorAll(".code-lang")) label.remove();
  return t.content.textContent.replace(/\s+/g, " ").trim();
}
const STATE_WORDS = { working: "working", waiting: "waiting", failed: "failed", idle: "" };

// The chat list comes a page at a time, most recent first; scrolling to its end loads the next page. A
// refresh reloads as many chats as are shown, so a list scrolled down stays as long.
const CHAT_PAGE = 50;
const chatKey = (c) => c.channel + "\u0000" + c.conversation;

async function refreshConversations() {
  const limit = Math.min(500, Math.max(CHAT_PAGE, state.chats.rows.length));
  const { data, res } = await request("GET", `/api/conversations?limit=${limit}`);
  state.chats.rows = data;
  state.chats.next = nextPage(res);
  renderConversations();
}

async function loadMoreChats() {
  const next = state.chats.next;
  if (!next || state.chats.loading) return;
  state.chats.loading = true;
  try {
    const { data, res } = await request("GET", next);
    if (state.chats.next !== next) return; // a refresh came in between: it holds the newer list
    const known = new Set(state.chats.rows.map(chatKey));
    state.chats.rows = state.chats.rows.concat(data.filter((c) => !known.has(chatKey(c))));
    state.chats.next = nextPage(res);
    renderConversations();
  } finally {
    state.chats.loading = false;
  }
}

function nearListEnd() {
  const list = $("#conv-list");
  if (list.scrollTop + list.clientHeight >= list.scrollHeight - 80) loadMoreChats().catch(() => {});
}

function renderConversations() {
  const rows = state.chats.rows.slice();
  const mine = rows.some((c) => c.channel === "web" && c.conversation === state.myChat);
  if (!mine) rows.unshift({ channel: "web", conversation: state.myChat, agent: "", lastMessage: "", lastAt: 0, state: "idle" });
  const items = rows.map((c) => {
    const current = state.chat.channel === c.channel && state.chat.conversation === c.conversation;
    const unread = c.channel === "web" && !current ? (state.unread.get(c.conversation) || new Set()).size : 0;
    const badge = unread ? el("span", { class: "badge new" }, `${unread} new`)
      : STATE_WORDS[c.state] ? el("span", { class: "badge " + c.state }, STATE_WORDS[c.state]) : null;
    const button = el("button", {
      type: "button", class: "conv", "aria-current": current ? "true" : undefined,
      "data-channel": c.channel, "data-conversation": c.conversation,
    },
    el("span", { class: "conv-top" }, el("span", { class: "conv-who" }, chatLabel(c)), badge),
    el("span", { class: "conv-meta" }, c.agent ? "@" + c.agent : "", c.lastAt ? " · " + ago(c.lastAt) : ""),
    el("span", { class: "conv-last" }, c.lastMessage ? (c.lastFrom && c.lastFrom === c.agent ? agentName(c.agent) + ": " : "") + plain(c.lastMessage) : "No messages yet"));
    button.addEventListener("click", () => openChat(c.channel, c.conversation, chatLabel(c)));
    return el("li", {}, button);
  });
  if (state.chats.next) {
    // Scrolling loads more by itself; the button is for a list too short to scroll, and for keyboards.
    const more = el("button", { type: "button", class: "conv-more" }, "Older chats");
    more.addEventListener("click", () => loadMoreChats().catch((e) => showError("#chat-error", e)));
    items.push(el("li", {}, more));
  }
  $("#conv-list").replaceChildren(...items);
}

function openChat(channel, conversation, label) {
  state.chat = { channel, conversation };
  state.history = { items: [], more: false, status: null, before: 0 };
  $("#chat-log").replaceChildren();
  showNotice("");
  const mine = channel === "web";
  $("#chat-form").hidden = !mine;
  $("#chat-readonly").hidden = mine;
  $("#chat-title").textContent = mine ? (conversation === state.myChat ? "Your chat" : "Web chat") : (label || `${conversation} on ${channel}`);
  refreshConversations().catch(() => {});
  refreshHistory().catch(() => {});
}

async function refreshHistory() {
  const { channel, conversation } = state.chat;
  const page = await api("GET",
    `/api/conversations/${encodeURIComponent(channel)}/history?conversation=${encodeURIComponent(conversation)}&limit=50`);
  if (state.chat.channel !== channel || state.chat.conversation !== conversation) return;
  // Keep older pages already loaded; replace the newest page with what the server says now.
  const first = page.items.length ? page.items[0] : null;
  const older = first ? state.history.items.filter((i) => before(i, first)) : state.history.items;
  state.history.items = older.concat(page.items);
  if (!older.length) state.history.more = page.more;
  state.history.status = page.status;
  renderHistory();
  if (channel === "web") {
    ackShown(page.items);
    if (state.view === "chat" && state.unread.delete(conversation)) renderUnread();
  }
}

// The history's order: time, then the user's message before replies, then id (as the server pages it).
function before(a, b) {
  const ka = [a.at, a.kind === "message" ? 0 : 1, a.id];
  const kb = [b.at, b.kind === "message" ? 0 : 1, b.id];
  for (let n = 0; n < 3; n++) if (ka[n] !== kb[n]) return ka[n] < kb[n];
  return false;
}

async function loadOlder() {
  const { channel, conversation } = state.chat;
  const first = state.history.items[0];
  if (!first) return;
  const page = await api("GET",
    `/api/conversations/${encodeURIComponent(channel)}/history?conversation=${encodeURIComponent(conversation)}` +
    `&limit=50&before=${first.at}&beforeKind=${first.kind}&beforeId=${first.id}`);
  const known = new Set(state.history.items.map((i) => i.kind + i.id));
  state.history.items = page.items.filter((i) => !known.has(i.kind + i.id)).concat(state.history.items);
  state.history.more = page.more;
  const log = $("#chat-log");
  const keep = log.scrollHeight - log.scrollTop;
  renderHistory(true);
  log.scrollTop = log.scrollHeight - keep;
}

// The web channel's replies count as delivered once shown here.
function ackShown(items) {
  for (const r of items) {
    if (r.kind !== "reply" || r.status === "acked" || state.acking.has(r.id)) continue;
    state.acking.add(r.id);
    api("POST", `/api/responses/${r.id}/ack`).catch(() => state.acking.delete(r.id));
  }
}

function messageState(m) {
  if (m.status === "dead") return el("span", { class: "msg-state failed" }, "failed");
  if (m.status === "processing") return el("span", { class: "msg-state working" }, "working");
  if (m.status === "pending" && m.retries > 0) return el("span", { class: "msg-state retrying" }, "retrying");
  if (m.status === "pending") return el("span", { class: "msg-state" }, "waiting");
  return null;
}

function renderHistory(keepScroll) {
  const log = $("#chat-log");
  const atBottom = log.scrollHeight - log.scrollTop - log.clientHeight < 40;
  // A note with an edit key is replaced by the later note with the same key ("trying again" → explanation).
  const lastOfKey = new Map();
  for (const i of state.history.items) if (i.kind === "reply" && i.editKey) lastOfKey.set(i.editKey, i.id);
  const asked = approvalsAsked(state.history.items); // approvals.js: a question shows its answer in place
  const nodes = [];
  for (const i of state.history.items) {
    if (i.kind === "reply" && i.editKey && lastOfKey.get(i.editKey) !== i.id) continue;
    if (i.note === "approval_closed" && asked.has(i.approvalId)) continue;
    if (i.kind === "message") {
      const body = messageBody(i);
      nodes.push(el("article", { class: "chat-msg chat-mine", "data-id": i.messageId, "aria-label": "You" },
        el("div", { class: "msg-head" }, el("span", { class: "who" }, i.sender && i.sender !== "web" ? i.sender : "You"),
          " → @" + i.agent, " · ", timeEl(i.at), " ", messageState(i)),
        body));
    } else {
      const note = { progress: " chat-note", dead_notice: " chat-failed", stopped: " chat-note chat-stopped",
        approval: " chat-approval", approval_closed: " chat-approval decided" }[i.note] || "";
      const answer = i.note === "approval" ? asked.get(i.approvalId) : null;
      const body = messageBody(answer || i);
      nodes.push(el("article", { class: "chat-msg chat-reply" + note, "data-id": String(i.id), "aria-label": agentName(i.agent) || "Reply" },
        el("div", { class: "msg-head" }, el("span", { class: "who agent-name" }, agentName(i.agent) || "agentpost"),
          i.agent && agentName(i.agent) !== i.agent ? el("span", { class: "handle" }, " @" + i.agent) : null,
          " · ", timeEl(i.at)),
        body,
        i.note === "approval" && !answer ? chatApprovalButtons(i) : null,
        i.files && i.files.length ? el("div", { class: "files" }, "Files: " + i.files.join(", ")) : null));
      if (answer) nodes[nodes.length - 1].classList.add("decided");
    }
  }
  nodes.push(...previewNodes());
  if (!nodes.length) nodes.push(el("p", { class: "empty" }, "No messages yet. Say hello below."));
  log.replaceChildren(...nodes);
  $("#chat-older").hidden = !state.history.more;
  if (!keepScroll && (atBottom || log.dataset.first !== "done")) { log.scrollTop = log.scrollHeight; log.dataset.first = "done"; }
  renderRunState();
}

// Replies being written in the open chat (message:preview events carry the whole text so far). A preview
// goes once the history holds its final reply (same edit key); one not updated for two minutes belonged to a
// run that ended without one.
const PREVIEW_STALE_MS = 120000;
function previewNodes() {
  const finals = new Set(state.history.items.filter((i) => i.kind === "reply" && i.editKey && i.note !== "progress").map((i) => i.editKey));
  const nodes = [];
  for (const [key, p] of state.previews) {
    if (finals.has(key) || Date.now() - p.at > PREVIEW_STALE_MS) { state.previews.delete(key); continue; }
    if (p.channel !== state.chat.channel || p.conversation !== state.chat.conversation) continue;
    nodes.push(el("article", { class: "chat-msg chat-reply chat-writing", "data-edit-key": key, "aria-label": "Reply being written" },
      el("div", { class: "msg-head" }, el("span", { class: "who" }, "writing…")),
      el("div", { class: "md" }, p.text)));
  }
  return nodes;
}
function onPreview(msg) {
  let ev;
  try { ev = JSON.parse(msg.data); } catch (_) { return; }
  const p = ev.payload || {};
  if (!p.edit_key || typeof p.text !== "string") return;
  state.previews.set(p.edit_key, { channel: p.channel, conversation: p.conversation, text: p.text, at: Date.now() });
  if (state.view === "chat" && p.channel === state.chat.channel && p.conversation === state.chat.conversation) renderHistory();
}

// A long message (a pasted log, a 120 KB reply) is shown by its beginning with a "Show all" button, so the
// chat stays readable and each refresh renders only what is on screen. Ordinary replies, even long-winded
// ones, stay whole: only one past LONG_CHARS or LONG_LINES is folded, to its first PREVIEW_CHARS or
// PREVIEW_LINES.
const LONG_CHARS = 6000;
const LONG_LINES = 80;
const PREVIEW_CHARS = 1500;
const PREVIEW_LINES = 20;
function linesWithin(text, limit) {
  let n = 0;
  for (let i = text.indexOf("\n"); i !== -1; i = text.indexOf("\n", i + 1)) if (++n > limit) return false;
  return true;
}
// Where the preview of a long text ends (its length when the text is not long): at a line end if near.
function cutAt(text) {
  if (text.length <= LONG_CHARS && linesWithin(text, LONG_LINES)) return text.length;
  let end = PREVIEW_CHARS;
  let newlines = 0;
  for (let n = 0; n < end; n++) if (text.charCodeAt(n) === 10 && ++newlines === PREVIEW_LINES) { end = n; break; }
  const lineEnd = text.lastIndexOf("\n", end);
  return lineEnd > end / 2 ? lineEnd : end;
}
function messageBody(item) {
  const key = item.kind + ":" + item.id;
  const body = el("div", { class: "md" });
  const cut = cutAt(item.text);
  if (cut >= item.text.length) {
    body.innerHTML = window.renderMarkdown(item.text);
    return body;
  }
  const whole = state.expanded.has(key);
  body.innerHTML = window.renderMarkdown(whole ? item.text : item.text.slice(0, cut));
  const size = item.text.length.toLocaleString();
  const toggle = el("button", { type: "button", class: "link show-all", "aria-expanded": String(whole) },
    whole ? "Show less" : `Show all (${size} characters)`);
  toggle.addEventListener("click", () => {
    if (whole) state.expanded.delete(key); else state.expanded.add(key);
    renderHistory(true);
  });
  return el("div", { class: whole ? "long" : "long collapsed" }, body,
    whole ? null : el("p", { class: "hint cut-note" }, `Showing the beginning: ${cut.toLocaleString()} of ${size} characters.`),
    toggle);
}

function renderRunState() {
  const s = state.history.status;
  const line = $("#run-state");
  const stop = $("#chat-stop");
  if (!s) { line.textContent = ""; stop.disabled = true; return; }
  const parts = [];
  let cls = "run-state";
  if (s.running) {
    cls += " working";
    parts.push(`${agentName(s.agent)} is working on it — ${duration(Date.now() - s.running_since)}`);
    if (s.last_step) parts.push("Last step: " + s.last_step);
  }
  const retrying = state.history.items.filter((i) => i.kind === "message" && i.status === "pending" && i.retries > 0);
  if (retrying.length) {
    cls += " retrying";
    const m = retrying[retrying.length - 1];
    parts.push(`Retrying (attempt ${m.retries + 1} of ${state.info.maxRetries})` + (m.error ? ": " + m.error : ""));
  }
  if (s.waiting) parts.push(`${s.waiting} message${s.waiting === 1 ? "" : "s"} waiting`);
  if (s.paused_until && s.paused_until > Date.now()) {
    parts.push(`Paused until ${clock(s.paused_until)}` + (s.pause_reason ? ": " + s.pause_reason : ""));
  }
  line.className = cls;
  line.textContent = parts.join(" · ");
  stop.disabled = !s.running;
}

async function sendChat(ev) {
  ev.preventDefault();
  const input = $("#chat-input");
  const text = input.value.trim();
  if (!text) return;
  showError("#chat-error", null);
  const agent = $("#chat-agent").value || undefined;
  if (agent) store.setItem("agentpost.agent", agent);
  const button = $("#chat-send");
  const command = text.toLowerCase();
  if (command === "/stop") { input.value = ""; return stopChat(); }
  if (command === "/reset") { input.value = ""; return resetChat(); }
  if (command === "/retry") { input.value = ""; return retryChat(); }
  button.disabled = true;
  try {
    // The server routes it as every channel does: an @agent or @team at the start of the text wins over
    // the agent chosen in the list, and an unknown @name is refused with the names there are.
    await api("POST", "/api/conversations/web/messages",
      { message: text, agent, conversation: state.chat.conversation });
    if (input.value.trim() === text) input.value = ""; // not what was typed meanwhile
    showNotice(""); // what the last action said is behind this message now
    await refreshHistory();
    refreshConversations().catch(() => {});
  } catch (e) {
    showError("#chat-error", e);
  } finally {
    button.disabled = false;
    input.focus();
  }
}

// What a chat action did ("… starts a fresh conversation"): its own line, so the run state that refreshes
// every second cannot overwrite it; it stays until dismissed, a message is sent, another chat is opened, or
// half a minute passed.
const NOTICE_MS = 30000;
function showNotice(text) {
  const box = $("#chat-notice");
  clearTimeout(state.noticeTimer);
  $("#chat-notice-text").textContent = text;
  box.hidden = !text;
  if (text) state.noticeTimer = setTimeout(() => showNotice(""), NOTICE_MS);
}

async function stopChat() {
  showError("#chat-error", null);
  try {
    const res = await api("POST", `/api/conversations/${encodeURIComponent(state.chat.channel)}/stop`,
      { conversation: state.chat.conversation });
    showNotice(res.stopping.length ? "Stopping…" : "Nothing is running for this chat.");
  } catch (e) { showError("#chat-error", e); }
}

async function retryChat() {
  showError("#chat-error", null);
  try {
    const res = await api("POST", `/api/conversations/${encodeURIComponent(state.chat.channel)}/retry`,
      { conversation: state.chat.conversation });
    showNotice(`Trying your message again with ${agentName(res.agent)} (ref ${res.messageId}).`);
    await refreshHistory();
  } catch (e) { showError("#chat-error", e); }
}

async function resetChat() {
  showError("#chat-error", null);
  const s = state.history.status;
  const last = [...state.history.items].reverse().find((i) => i.agent && i.agent in state.agents);
  const agent = (s && s.agent && s.agent in state.agents) ? s.agent
    : (state.chat.channel === "web" && $("#chat-agent").value in state.agents) ? $("#chat-agent").value
      : last ? last.agent : undefined;
  try {
    const res = await api("POST", `/api/conversations/${encodeURIComponent(state.chat.channel)}/reset`,
      { conversation: state.chat.conversation, agent });
    showNotice(`${agentName(res.agent)} starts a fresh conversation with your next message.`);
  } catch (e) { showError("#chat-error", e); }
}

// -- agents and teams ----------------------------------------------------------------------------------
async function refreshAgentsView() {
  await loadAgents();
  const overview = await api("GET", "/api/agents-overview");
  $("#agents-table tbody").replaceChildren(...Object.entries(state.agents).map(([id, a]) => {
    const o = overview[id] || { state: "idle", pending: 0, processing: 0 };
    let status = "idle";
    if (o.state === "running") status = `running for ${duration(Date.now() - o.runningSince)}` + (o.lastStep ? ` — ${o.lastStep}` : "");
    if (o.state === "paused") status = `paused until ${clock(o.pausedUntil)}` + (o.pauseReason ? ` (${o.pauseReason})` : "");
    const edit = el("button", { type: "button", class: "edit", "aria-label": `Edit ${id}` }, "Edit");
    const reset = el("button", { type: "button", class: "reset", "aria-label": `Reset ${id}` }, "Reset");
    const remove = el("button", { type: "button", class: "remove danger", "aria-label": `Remove ${id}` }, "Remove");
    edit.addEventListener("click", () => editAgent(id));
    reset.addEventListener("click", () => agentAction("POST", `/api/agents/${id}/reset`, `All of ${id}'s conversations start afresh. Continue?`));
    remove.addEventListener("click", () => agentAction("DELETE", `/api/agents/${id}`, `Remove agent ${id}? Its workspace folder is kept.`));
    return el("tr", { "data-agent": id },
      el("th", { scope: "row" }, el("span", { class: "agent-name" }, a.name || id), el("span", { class: "handle" }, " @" + id),
        a.default ? el("span", { class: "badge" }, "default") : null),
      el("td", { "data-label": "Runs" }, a.provider + (a.model ? " · " + a.model : "")),
      el("td", { class: "state " + o.state, "data-label": "Status" }, status),
      el("td", { class: "depth", "data-label": "Queue" }, el("span", { class: "pending" }, String(o.pending)), " waiting, ",
        el("span", { class: "processing" }, String(o.processing)), " working"),
      el("td", { class: o.lastError ? "last-error" : "last-error none", "data-label": "Last error" },
        o.lastError ? el("span", { title: o.lastError }, o.lastError.slice(0, 140), " ", el("small", {}, ago(o.lastErrorAt))) : "none"),
      el("td", { class: "row-actions" }, el("span", { class: "actions" }, edit, reset, remove)));
  }));
  $("#teams-table tbody").replaceChildren(...Object.entries(state.teams).map(([id, t]) => {
    const remove = el("button", { type: "button", class: "danger", "aria-label": `Remove team ${id}` }, "Remove");
    const edit = el("button", { type: "button", "aria-label": `Edit team ${id}` }, "Edit");
    remove.addEventListener("click", () => agentAction("DELETE", `/api/teams/${id}`, `Remove team ${id}? Its agents stay.`));
    edit.addEventListener("click", () => {
      $("#team-form").hidden = false;
      $("#tf-id").value = id; $("#tf-name").value = t.name || ""; $("#tf-agents").value = t.agents.join(", ");
      $("#tf-leader").value = t.leader_agent || "";
      $("#tf-name").focus();
    });
    return el("tr", { "data-team": id }, el("th", { scope: "row" }, t.name || id, el("span", { class: "handle" }, " @" + id)),
      el("td", { "data-label": "Members" }, t.agents.map((a) => "@" + a).join(", ")),
      el("td", { "data-label": "Leader" }, t.leader_agent ? "@" + t.leader_agent : "none"),
      el("td", { class: "row-actions" }, el("span", { class: "actions" }, edit, remove)));
  }));
  if (!Object.keys(state.teams).length) {
    $("#teams-table tbody").replaceChildren(el("tr", {}, el("td", { colSpan: 4, class: "empty" }, "No teams yet.")));
  }
}

async function agentAction(method, path, question) {
  if (question && !confirm(question)) return;
  showError("#agents-error", null);
  try { await api(method, path); } catch (e) { showError("#agents-error", e); }
  await refreshAgentsView().catch(() => {});
}

async function editAgent(id) {
  // The form stays hidden until it holds this agent's saved values: shown earlier, a late answer
  // from the server would overwrite what the person had already changed.
  const form = $("#agent-form");
  const opening = (state.agentFormOpening = (state.agentFormOpening || 0) + 1);
  form.hidden = true;
  form.reset();
  showError("#agent-form-error", null);
  let a = {};
  if (id) {
    try {
      const settings = await api("GET", "/api/settings");
      a = (settings.agents || {})[id] || {};
    } catch (e) { showError("#agents-error", e); return; }
    const shown = state.agents[id] || {};
    a = { ...a, name: a.name || shown.name, provider: a.provider || shown.provider, model: a.model || shown.model };
  }
  if (opening !== state.agentFormOpening) return;  // a later click opened the form again
  state.editing = id;
  $("#agent-form-title").textContent = id ? `Edit agent @${id}` : "Add an agent";
  $("#af-id").disabled = !!id;
  $("#af-id").value = id || "";
  $("#af-name").value = a.name || "";
  $("#af-provider").value = a.provider || "claude";
  $("#af-model").value = a.model || "";
  $("#af-workspace").value = a.workspace || "";
  $("#af-permission").value = a.permission_mode || "acceptEdits";
  $("#af-timeout").value = a.timeout_seconds || 1800;
  $("#af-command").value = Array.isArray(a.command) ? a.command.join(" ") : "";
  syncCommandField();
  form.hidden = false;
  (id ? $("#af-name") : $("#af-id")).focus();
}

// The browser's own word for a pattern mismatch is "match the requested format"; say which format. Checked
// as the person types and again when the form is sent (a click on its button comes before the browser's
// check), since the page also fills the field itself.
function sayIdRule(input) {
  const check = () => {
    input.setCustomValidity("");
    if (input.validity.patternMismatch) input.setCustomValidity(`Use ${input.title}.`);
  };
  input.addEventListener("input", check);
  for (const button of input.form.querySelectorAll("button[type='submit']")) button.addEventListener("click", check);
}

function syncCommandField() { $("#af-command-label").hidden = $("#af-provider").value !== "command"; }

async function saveAgent(ev) {
  ev.preventDefault();
  showError("#agent-form-error", null);
  const id = state.editing || $("#af-id").value.trim();
  const provider = $("#af-provider").value;
  const values = {
    name: $("#af-name").value.trim() || id,
    provider,
    model: $("#af-model").value.trim(),
    workspace: $("#af-workspace").value.trim(),
    permission_mode: $("#af-permission").value,
    timeout_seconds: Number($("#af-timeout").value) || 1800,
  };
  if (provider === "command") values.command = $("#af-command").value.trim().split(/\s+/).filter(Boolean);
  try {
    await api("PUT", "/api/settings", { agents: { [id]: values } });
    $("#agent-form").hidden = true;
    state.editing = null;
    await refreshAgentsView();
  } catch (e) { showError("#agent-form-error", e); }
}

async function saveTeam(ev) {
  ev.preventDefault();
  showError("#team-form-error", null);
  const id = $("#tf-id").value.trim();
  const body = {
    name: $("#tf-name").value.trim() || id,
    agents: $("#tf-agents").value.split(/[\s,]+/).map((s) => s.replace(/^@/, "")).filter(Boolean),
    leader_agent: $("#tf-leader").value.trim().replace(/^@/, ""),
  };
  try {
    await api("PUT", `/api/teams/${encodeURIComponent(id)}`, body);
    $("#team-form").hidden = true;
    await refreshAgentsView();
  } catch (e) { showError("#team-form-error", e); }
}

async function loadProcessorForm() {
  $("#pf-busy").value = state.info.busyPolicy || "collect";
  $("#pf-idle").value = state.info.idleTimeoutSeconds || 600;
}

async function saveProcessor(ev) {
  ev.preventDefault();
  const note = $("#processor-saved");
  try {
    await api("PUT", "/api/settings",
      { processor: { busy_policy: $("#pf-busy").value, idle_timeout_seconds: Number($("#pf-idle").value) } });
    note.textContent = "Saved.";
    state.info = await api("GET", "/api/console");
  } catch (e) { note.textContent = e.message; }
}

// -- operations ----------------------------------------------------------------------------------------
async function refreshPairing() {
  const p = await api("GET", "/api/pairing");
  const pending = $("#pairing-pending");
  pending.replaceChildren(...p.pending.map((r) => {
    const approve = el("button", { type: "button", class: "primary approve", "aria-label": `Approve ${r.sender || r.senderId}` }, "Approve");
    const dismiss = el("button", { type: "button", class: "dismiss", "aria-label": `Dismiss ${r.sender || r.senderId}` }, "Dismiss");
    approve.addEventListener("click", () => pairingAction("POST", "/api/pairing/approve", { code: r.code }));
    dismiss.addEventListener("click", () => pairingAction("DELETE", `/api/pairing/pending/${encodeURIComponent(r.code)}`));
    return el("li", { "data-code": r.code, "data-sender": r.senderId },
      el("span", {}, el("b", {}, r.sender || r.senderId), ` on ${r.channel} · code `, el("code", {}, r.code), " · ", ago(r.createdAt)),
      el("span", { class: "actions" }, approve, dismiss));
  }));
  if (!p.pending.length) pending.replaceChildren(el("li", { class: "empty" }, "Nobody is waiting."));
  const approved = $("#pairing-approved");
  approved.replaceChildren(...p.approved.map((r) => {
    const revoke = el("button", { type: "button", class: "danger", "aria-label": `Revoke ${r.sender || r.senderId}` }, "Revoke");
    revoke.addEventListener("click", () => {
      if (confirm(`Stop answering ${r.sender || r.senderId} on ${r.channel}?`)) {
        pairingAction("DELETE", `/api/pairing/${encodeURIComponent(r.channel)}/${encodeURIComponent(r.senderId)}`);
      }
    });
    return el("li", { "data-sender": r.senderId }, el("span", {}, el("b", {}, r.sender || r.senderId), ` on ${r.channel} · since ${clock(r.approvedAt)}`),
      el("span", { class: "actions" }, revoke));
  }));
  if (!p.approved.length) approved.replaceChildren(el("li", { class: "empty" }, "No one yet."));
}

async function pairingAction(method, path, body) {
  showError("#pairing-error", null);
  try { await api(method, path, body); } catch (e) { showError("#pairing-error", e); }
  await refreshPairing().catch(() => {});
}

async function refreshChannels() {
  const rows = await api("GET", "/api/channels/health");
  $("#channels").replaceChildren(...rows.map((h) => el("li", { "data-channel": h.channel },
    el("span", {}, el("b", {}, h.channel), " "),
    el("span", { class: "badge " + (h.state === "up" ? "ok" : h.state === "retrying" || h.state === "not running" ? "failed" : "") },
      h.state === "up" ? "connected" : h.state),
    el("span", { class: "hint block" }, h.description + " · updated " + ago(h.updatedAt)))));
  if (!rows.length) $("#channels").replaceChildren(el("li", { class: "empty" }, "No channel adapter has reported yet (start one with agentpost run telegram, for example)."));
}

async function refreshDead() {
  const rows = await api("GET", "/api/queue/dead");
  const budget = state.info.manualRetryBudget;
  $("#dead-budget").textContent = `Each one can be retried by hand ${budget} time${budget === 1 ? "" : "s"}.`;
  const list = $("#dead-list");
  list.replaceChildren(...rows.map((m) => {
    const id = m.message_id;
    const left = Math.max(0, budget - m.manual_retries);
    const retry = el("button", { type: "button", class: "retry primary", "data-id": id, disabled: left === 0,
      "aria-label": `Retry message ${id}` }, "Retry");
    const del = el("button", { type: "button", class: "delete danger", "data-id": id, "aria-label": `Delete message ${id}` }, "Delete");
    retry.addEventListener("click", () => deadAction("POST", `/api/queue/dead/${id}/retry`));
    del.addEventListener("click", () => {
      if (confirm("Delete this message for good?")) deadAction("DELETE", `/api/queue/dead/${id}`);
    });
    const details = el("details", { open: state.deadOpen.has(id) },
      el("summary", {}, "Full error"), el("pre", { class: "error-text", tabIndex: 0 }, m.last_error || "(no error recorded)"),
      el("p", { class: "hint" }, `Message id ${id} · ${m.retry_count + 1} attempts`));
    details.addEventListener("toggle", () => { if (details.open) state.deadOpen.add(id); else state.deadOpen.delete(id); });
    return el("li", { class: "dead", "data-id": id },
      el("div", { class: "dead-top" },
        el("span", { class: "dead-text" }, m.message.length > 160 ? m.message.slice(0, 160) + "…" : m.message),
        el("span", { class: "actions" }, retry, del)),
      el("div", { class: "hint" }, `@${m.agent} · ${m.channel} · ${m.sender || m.sender_id || ""} · ${ago(m.updated_at)} · `,
        el("span", { class: "budget" }, `${m.manual_retries} of ${budget} manual retries used`)),
      el("p", { class: "dead-error" }, (m.last_error || "").split("\n")[0].slice(0, 200)),
      details);
  }));
  if (!rows.length) list.replaceChildren(el("li", { class: "empty" }, "Nothing here: every message got an answer."));
}

async function deadAction(method, path) {
  showError("#dead-error", null);
  try { await api(method, path); } catch (e) { showError("#dead-error", e); }
  await refreshAll();
}

// Replies to this browser's chats are delivered (acked) as soon as they arrive, whichever view is open: the
// "replies out" count is what channels still have to deliver, and these are here. One not on screen yet is
// counted as new on the Chats tab and in the chat list until its chat is shown.
async function deliverMine() {
  const rows = await api("GET", "/api/responses/pending?channel=web&limit=200");
  const mine = new Set(myChats());
  let fresh = false;
  for (const r of rows) {
    if (!mine.has(r.conversation) || state.acking.has(r.id)) continue;
    const onScreen = state.view === "chat" && state.chat.channel === "web" && state.chat.conversation === r.conversation;
    if (!onScreen) {
      if (!state.unread.has(r.conversation)) state.unread.set(r.conversation, new Set());
      state.unread.get(r.conversation).add(r.id);
      fresh = true;
    }
    state.acking.add(r.id);
    api("POST", `/api/responses/${r.id}/ack`).catch(() => state.acking.delete(r.id));
  }
  if (fresh) renderUnread();
}

function renderUnread() {
  let n = 0;
  for (const ids of state.unread.values()) n += ids.size;
  const badge = $("#unread");
  badge.textContent = n ? `${n} new` : "";
  badge.hidden = !n;
}

// -- refresh -------------------------------------------------------------------------------------------
async function refreshAll() {
  const jobs = [refreshStatus(), deliverMine()];
  if (state.view === "chat") jobs.push(refreshConversations(), refreshHistory());
  if (state.view === "agents") jobs.push(refreshAgentsView());
  if (state.view === "ops") jobs.push(refreshApprovals(), refreshPairing(), refreshDead(), refreshChannels());
  if (state.view === "usage") jobs.push(refreshUsage());
  else jobs.push(refreshOverBadge());
  const results = await Promise.allSettled(jobs);
  for (const r of results) if (r.status === "rejected" && !(r.reason instanceof ApiError)) console.error(r.reason);
}

function scheduleRefresh() {
  if (state.refreshTimer) return;
  state.refreshTimer = setTimeout(() => { state.refreshTimer = null; refreshAll(); }, 250);
}

// -- live events ---------------------------------------------------------------------------------------
const EVENT_NAMES = [
  "message:incoming", "agent:invoke", "agent:progress", "agent:response", "agent:mention", "message:done",
  "message_claimed", "message_completed", "message_failed", "message_dead", "message_retried",
  "message_deleted", "message_restored", "message_interrupted", "response_acked", "response_failed",
  "response_unserved", "chain_handoff_refused", "chain_handoff_ignored", "chain_budget_spent", "chatroom_post",
  "processor_start", "processor_stop", "scheduler_start", "pairing_requested", "pairing_approved",
  "pairing_revoked", "stop_requested", "agent_reset", "agent_resumed", "lease_lost", "run_stopped",
  "dead_archived", "dead_notice", "delivery_retry", "rate_limit", "model_fallback", "heartbeat_silent",
  "messages_dropped", "send_file_refused", "undelivered_notice", "media_failed", "response_ready",
  "retry_notice_queued", "dead_notice_queued", "approval_requested", "approval_answered",
];
function connectEvents() {
  if (state.source) state.source.close();
  const url = "/api/events/stream" + (state.token ? "?token=" + encodeURIComponent(state.token) : "");
  const source = new EventSource(url);
  state.source = source;
  const conn = $("#conn");
  source.onopen = () => { conn.textContent = "live"; conn.className = "conn on"; };
  source.onerror = () => {
    // Only after a first connection: a page that never connected shows nothing rather than a false alarm.
    if (conn.textContent) { conn.textContent = "reconnecting"; conn.className = "conn off"; }
  };
  const seen = new Set();
  const onEvent = (msg) => {
    let ev;
    try { ev = JSON.parse(msg.data); } catch (_) { return; }
    if (seen.has(ev.cursor)) return;
    seen.add(ev.cursor);
    const feed = $("#event-feed");
    feed.prepend(el("li", { "data-cursor": ev.cursor },
      el("span", { class: "ev-time" }, new Date(ev.createdAt).toLocaleTimeString()), " ",
      el("b", {}, ev.event || ev.type), " ", ev.agent ? "@" + ev.agent + " " : "", ev.messageId || ""));
    while (feed.children.length > 200) feed.lastChild.remove();
    scheduleRefresh();
  };
  // Every event is named (TinyAGI's names where it has one, else ours): listen to each by name.
  source.onmessage = onEvent;
  for (const name of EVENT_NAMES) source.addEventListener(name, onEvent);
  // Not in the feed and no refresh: a preview comes every half second while a reply is written.
  source.addEventListener("message:preview", onPreview);
  source.addEventListener("reset", (msg) => {
    const data = JSON.parse(msg.data);
    $("#event-feed").prepend(el("li", { class: "error" }, `events before #${data.retainedAfter} were cleaned up`));
    scheduleRefresh();
  });
}

// -- start ---------------------------------------------------------------------------------------------
function wire() {
  for (const tab of document.querySelectorAll(".tab")) tab.addEventListener("click", () => showView(tab.dataset.view));
  $("#chat-form").addEventListener("submit", sendChat);
  $("#conv-list").addEventListener("scroll", nearListEnd, { passive: true });
  $("#chat-input").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); $("#chat-form").requestSubmit(); }
  });
  $("#chat-stop").addEventListener("click", stopChat);
  $("#chat-reset").addEventListener("click", resetChat);
  $("#chat-notice-close").addEventListener("click", () => showNotice(""));
  $("#chat-older").addEventListener("click", () => loadOlder().catch((e) => showError("#chat-error", e)));
  $("#new-chat").addEventListener("click", () => {
    state.myChat = newChatId();
    store.setItem("agentpost.conversation", state.myChat);
    rememberChat(state.myChat);
    openChat("web", state.myChat);
    $("#chat-input").focus();
  });
  for (const id of ["#af-id", "#tf-id"]) sayIdRule($(id));
  $("#agent-add").addEventListener("click", () => editAgent(null));
  $("#af-cancel").addEventListener("click", () => { $("#agent-form").hidden = true; state.editing = null; });
  $("#af-provider").addEventListener("change", syncCommandField);
  $("#agent-form").addEventListener("submit", saveAgent);
  $("#processor-form").addEventListener("submit", saveProcessor);
  $("#team-add").addEventListener("click", () => {
    $("#team-form").hidden = false;
    for (const f of ["#tf-id", "#tf-name", "#tf-agents", "#tf-leader"]) $(f).value = "";
    $("#tf-id").focus();
  });
  $("#tf-cancel").addEventListener("click", () => { $("#team-form").hidden = true; });
  $("#team-form").addEventListener("submit", saveTeam);
  $("#token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    state.token = $("#token-input").value.trim();
    sessionStorage.setItem("agentpost.token", state.token);
    $("#token-form").hidden = true;
    begin();
  });
  // The "working for N s" line ticks on its own between refreshes.
  setInterval(() => { if (state.view === "chat") renderRunState(); }, 1000);
}

async function begin() {
  try {
    const access = await fetch("/access").then((r) => r.json());
    // Signed in through the link `agentpost up` prints: the cookie goes with every request by itself.
    if (access.tokenRequired && !state.token && !access.signedIn) { showTokenForm(""); return; }
    state.info = await api("GET", "/api/console");
    await loadAgents();
  } catch (e) {
    if (e instanceof ApiError) return; // the token form is showing
    throw e;
  }
  loadProcessorForm();
  const hash = location.hash.replace("#", "");
  state.view = VIEWS.includes(hash) ? hash : "chat";
  for (const tab of document.querySelectorAll(".tab")) tab.setAttribute("aria-pressed", String(tab.dataset.view === state.view));
  for (const name of VIEWS) $("#view-" + name).hidden = name !== state.view;
  await refreshAll();
  connectEvents();
  if (!state.pollTimer) state.pollTimer = setInterval(refreshAll, 5000); // in case a change signal was missed
}

document.addEventListener("DOMContentLoaded", () => { wire(); begin(); });
